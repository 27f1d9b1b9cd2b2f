"""The differential fuzz (`python -m hybridcache_dev.fuzz --release 0.33.0`)
against vLLM 0.33.0, for the 0.33 venv:

- the harness self-check: vLLM 0.33.0's manager against a second instance
  of itself, every mix, must find nothing (so every call sequence the
  driver makes is one vLLM accepts and every observable is deterministic);
- perturbed candidates (vLLM's manager with one answer or one state change
  altered) must be caught, each by the observable that shows it;
- hybridcache's 0.33.0 facade (`hybridcache.releases.v0_33.manager`) on full attention,
  sliding window, several full-attention groups and chunked local attention.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from typing import Any

import pytest

# tests/conftest.py leaves this module to the 0.33 venv (not even imported
# elsewhere); the skip below covers a run without that conftest or vLLM.
pytestmark = pytest.mark.vllm("0.33.0")


from hybridcache import releases  # noqa: E402

if releases.find(releases.installed_vllm_version()) is not releases.of_folder("v0_33"):
    pytest.skip(
        f"needs vLLM 0.33.0 (the 0.33 venv); installed: {releases.installed_vllm_version() or 'none'}",
        allow_module_level=True,
    )

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from hybridcache_dev import fuzz  # noqa: E402
from hybridcache_dev.release_api import release  # noqa: E402

API = release("0.33.0")
FACADE_MISSING = importlib.util.find_spec("hybridcache.releases.v0_33.manager") is None


def _clean(f: fuzz.Figures) -> None:
    # Setups the facade refuses (NotImplementedError) are counted, not findings.
    findings = [r for r in f.reports if not r.startswith("[unsupported setup]")]
    assert findings == [], "\n\n".join(findings)
    assert (f.divergences, f.invariant_violations, f.reference_errors) == (0, 0, 0)


def test_self_check_finds_nothing() -> None:
    # Two setups of every mix.
    ops = 2_000 * len(API.mixes)
    f = fuzz.run_fuzz(ops=ops, seed=33, ops_per_setup=1000, release_name="0.33.0", candidate="vllm")
    _clean(f)
    assert f.ops >= ops and f.setups >= 2 * len(API.mixes)
    # The slice reaches the interesting paths.
    assert f.allocations > 5000 and f.none_allocations > 500
    assert f.hit_tokens > 0 and f.events > 0
    assert f.preemptions > 0 and f.evictions > 0 and f.resets > 0
    for call in ("pop_blocks_for_free", "deferred_free_blocks", "async_loads", "sync_external_loads",
                 "load_failures", "shared_prefix_boundaries", "cow_copies"):
        assert f.calls.get(call, 0) > 0, (call, f.calls)


class _Perturbed:
    """vLLM 0.33.0's manager with one thing changed from the `after`-th call of `method` on."""

    def __init__(self, inner: Any, method: str, after: int) -> None:
        self._inner, self._method, self._after, self._n = inner, method, after, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _due(self) -> bool:
        self._n += 1
        return self._n >= self._after

    def allocate_slots(self, *args: Any, **kwargs: Any) -> Any:
        out = self._inner.allocate_slots(*args, **kwargs)
        if self._method == "allocate_slots" and out is not None and len(out.blocks[0]) > 1 and self._due():
            from vllm.v1.core.kv_cache_manager import KVCacheBlocks

            return KVCacheBlocks((list(reversed(out.blocks[0])), *out.blocks[1:]))  # one block list reversed
        return out

    def free(self, request: Any) -> None:
        if self._method == "free" and len(self._inner.get_blocks(request.request_id).blocks[0]) > 1 and self._due():
            # The right blocks, freed head first instead of tail first: no
            # return value shows it, only the free queue (pool_state).
            self._inner.block_pool.free_blocks(self._inner.pop_blocks_for_free(request))
            return
        self._inner.free(request)

    def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
        if self._method == "record_prefix_cache_stats" and num_hits and self._due():
            num_hits -= 1
        self._inner.record_prefix_cache_stats(request, num_hits)


@pytest.mark.parametrize(
    ("method", "caught_by"),
    [
        ("allocate_slots", "allocate_slots"),
        ("free", "pool_state"),
        ("record_prefix_cache_stats", "make_prefix_cache_stats"),
    ],
)
def test_perturbed_candidate_is_caught(method: str, caught_by: str) -> None:
    f = fuzz.run_fuzz(ops=4000, seed=5, mixes=("full",), caching=(True,), ops_per_setup=4000,
                      release_name="0.33.0", max_reports=1,
                      build_candidate=lambda s: _Perturbed(API.build_reference(s), method, after=3))
    assert f.divergences >= 1, f.summary()
    assert caught_by in f.reports[0].split("\n")[1], f.reports[0]
    assert f.invariant_violations == 0 and f.reference_errors == 0


def test_cli_self_check(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--release", "0.33.0", "--candidate", "vllm", "--ops", "600", "--seed", "3", "--mix", "full,full_sw"]
    assert fuzz.main(argv) == 0
    out = capsys.readouterr().out
    assert "FINAL" in out and "release=0.33.0 candidate=vllm" in out
    assert "divergences=0" in out and "reference_errors=0" in out


@pytest.mark.skipif(not FACADE_MISSING, reason="hybridcache.releases.v0_33.manager exists")
def test_cli_says_when_the_facade_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    assert fuzz.main(["--release", "0.33.0", "--ops", "10"]) == 2
    err = capsys.readouterr().err
    assert "hybridcache.releases.v0_33.manager.KVCacheManager033" in err and "--candidate vllm" in err


@pytest.mark.skipif(FACADE_MISSING, reason="hybridcache's vLLM 0.33.0 facade (hybridcache.releases.v0_33.manager) has not landed")
def test_hybridcache_facade_slice_full_attention() -> None:
    f = fuzz.run_fuzz(ops=20_000, seed=330, mixes=("full",), ops_per_setup=1000, release_name="0.33.0",
                      candidate="hybridcache")
    _clean(f)
    assert f.allocations > 3000 and f.hit_tokens > 0 and f.events > 0


@pytest.mark.skipif(FACADE_MISSING, reason="hybridcache's vLLM 0.33.0 facade (hybridcache.releases.v0_33.manager) has not landed")
@pytest.mark.parametrize(("mixes", "seed"), [(("sw", "full_sw", "full_sw_mixed"), 331), (("full_full", "full_full_sw", "full_fullbs"), 332),
                                             (("full_chunked",), 333), (("full_fullbs4", "full_wide_sw"), 335)],
                         ids=["sliding-window", "several-full-attention", "chunked-local", "partial-tails"])
def test_hybridcache_facade_slice_hybrid_layouts(mixes: tuple[str, ...], seed: int) -> None:
    """Sliding window (with 0.33.0's sparse retention: None, 0, N),
    several full-attention groups, chunked local attention and full
    attention over smaller hash blocks (partial-tail entries), against
    vLLM 0.33.0."""
    f = fuzz.run_fuzz(ops=16_000, seed=seed, mixes=mixes, ops_per_setup=400, release_name="0.33.0",
                      candidate="hybridcache")
    _clean(f)
    assert f.allocations > 3000 and f.hit_tokens > 0 and f.events > 0 and f.evictions > 0
    assert f.calls.get("unsupported_setups", 0) < f.setups // 3, f.summary()
    assert f.calls.get("shared_prefix_boundaries", 0) > 0 and f.calls.get("in_flight_allocations", 0) > 0
    if "sw" in mixes:
        assert f.calls.get("sparse_retention_setups", 0) > 0


@pytest.mark.skipif(FACADE_MISSING, reason="hybridcache's vLLM 0.33.0 facade (hybridcache.releases.v0_33.manager) has not landed")
def test_hybridcache_facade_slice_mamba_without_prefix_caching() -> None:
    """Full attention + Mamba ("none" and "align", speculative blocks,
    dynamic drafts, async steps, deferred frees, external tokens), prefix
    caching off, against vLLM 0.33.0."""
    f = fuzz.run_fuzz(ops=16_000, seed=334, mixes=("full_mamba_align", "full_mamba3"), caching=(False,),
                      ops_per_setup=400, release_name="0.33.0", candidate="hybridcache")
    _clean(f)
    assert f.allocations > 3000 and f.evictions > 0 and f.preemptions > 0
    assert f.calls.get("unsupported_setups", 0) < f.setups // 3, f.summary()
    assert f.calls.get("mamba_align_groups", 0) > 0 and f.calls.get("mamba_none_groups", 0) > 0
    assert f.calls.get("in_flight_allocations", 0) > 0 and f.calls.get("pop_blocks_for_free", 0) > 0


def test_vllm_033_lookahead_hashes_crash_the_hit_search_without_full_attention() -> None:
    """Why the 0.33.0 setups use lookahead hashes only with a full-attention
    group: without one, vLLM 0.33.0's hit search reads past the request's
    block hashes (fewer than its full blocks with lookahead hashes)."""
    from hybridcache_dev.fuzz_setup import Group, Setup

    s = Setup(mix="sw_mamba", caching=True, groups=(Group("sw", 4, 10), Group("mamba", 4, mode="align")),
              scheduler_block_size=4, hash_block_size=4, num_blocks=40, use_eagle=False, events=False,
              log_stats=False, release="0.33.0", hash_lookahead=3, prefill_lookahead=3)
    r = API.make_request(s, "a", list(range(33)))
    assert len(r.block_hashes) == 7  # 8 full blocks, the last one's 3 lookahead tokens missing
    with pytest.raises(IndexError):
        API.build_reference(s).get_computed_blocks(r)


def test_a_transient_checkpoint_key_does_not_hold_back_another_blocks_hit() -> None:
    """Regression, found by seed 602: a Mamba align request whose prefill
    checkpoint block was keyed by the full-block pass and then evicted as
    transient (sparse retention) left that key noted as "cached this step",
    so a same-step hit on another block under the same hash was refused
    (None) where vLLM allocates. The key is noted now only after the
    checkpoint is re-keyed or evicted, as vLLM notes the hashes blocks
    hold. Setup #179 of this run (mamba_junction, retention 32) hit it."""
    f = fuzz.run_fuzz(ops=90_000, seed=602, ops_per_setup=500, release_name="0.33.0", candidate="hybridcache")
    assert f.setups >= 180
    _clean(f)
