"""VLLM_PREFIX_CACHE_RETENTION_INTERVAL, as vLLM 0.23.0 reads and applies it:
read when the manager is built, checked with vLLM's errors, and (unset /
0 / a multiple of scheduler_block_size) the same blocks cached as vLLM's
manager caches, through every allocation path, proven against vLLM itself."""

from __future__ import annotations

import importlib.util
from array import array
from typing import Any

import pytest

from hybridcache import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheManager, Request, SlidingWindowSpec
from hybridcache._native import NativeManager
from hybridcache.config import read_groups
from hybridcache.tools.compare import norm_allocated, norm_blocks, norm_event, pool_state
from hybridcache_dev.fuzz_setup import Group, Setup, retention_interval

# Compares against vLLM 0.23.0 (tests/conftest.py: left to that release's venv elsewhere).
pytestmark = pytest.mark.vllm("0.23.0")

ENV = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"
HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM 0.23.0 is not installed")


def _hybrid_config(num_blocks: int = 100) -> KVCacheConfig:
    # vLLM's own retention tests' layout: scheduler_block_size 32.
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_groups=[
            KVCacheGroupSpec(["full"], FullAttentionSpec(block_size=32)),
            KVCacheGroupSpec(["swa"], SlidingWindowSpec(block_size=8, sliding_window=8)),
        ],
    )


def _build(cfg: KVCacheConfig, value: str | int | None, **kwargs: Any) -> KVCacheManager:
    kwargs.setdefault("enable_caching", True)
    with retention_interval(value):  # type: ignore[arg-type]
        return KVCacheManager(cfg, 1024, 32, 8, **kwargs)


# --------------------------------------------------------------------------
# Validation (vLLM's checks and messages)


@pytest.mark.parametrize(
    "raw, match",
    [
        ("33", r"\(33\) must be non-negative and a multiple of scheduler_block_size \(32\)"),
        ("-32", "must be non-negative"),
        ("16", "multiple of scheduler_block_size"),
        ("abc", f"{ENV} must be an integer, got 'abc'"),
        ("", f"{ENV} must be an integer, got ''"),
        ("1.5", f"{ENV} must be an integer"),
    ],
)
@pytest.mark.parametrize("caching", [True, False])
def test_bad_values_raise_value_error(raw: str, match: str, caching: bool) -> None:
    # vLLM checks at construction whether caching is on or not.
    with pytest.raises(ValueError, match=match):
        _build(_hybrid_config(), raw, enable_caching=caching)


def test_needs_a_sliding_window_group() -> None:
    cfg = KVCacheConfig(num_blocks=10, kv_cache_groups=[KVCacheGroupSpec(["a"], FullAttentionSpec(block_size=8))])
    with retention_interval(0), pytest.raises(ValueError, match="no sliding-window KV cache group"):
        KVCacheManager(cfg, 256, 8, 8)
    with retention_interval(None):
        KVCacheManager(cfg, 256, 8, 8)


@pytest.mark.parametrize("value", [None, 0, 32, 96, " 64 "])
def test_good_values_build(value: Any) -> None:
    _build(_hybrid_config(), value).check_invariants()


def test_native_constructor_checks_too() -> None:
    """The core refuses what the facade would (for callers of the native class)."""
    groups = [g.native for g in read_groups(_hybrid_config(), 1024, 1024)]
    args = (100, groups, 1024, 32, 8, True, False, False)
    NativeManager(*args, 64, "whole-block-hits", 1, 1)
    NativeManager(*args, None, "whole-block-hits", 1, 1)
    with pytest.raises(ValueError, match=r"retention interval \(48\) must be non-negative and a multiple"):
        NativeManager(*args, 48, "whole-block-hits", 1, 1)
    with pytest.raises(ValueError, match="retention_interval"):
        NativeManager(*args, -32, "whole-block-hits", 1, 1)
    with pytest.raises(TypeError, match="retention_interval must be an int"):
        NativeManager(*args, "64", "whole-block-hits", 1, 1)
    with pytest.raises(ValueError, match="no sliding-window KV cache group"):
        NativeManager(100, groups[:1], 1024, 32, 8, True, False, False, 0, "whole-block-hits", 1, 1)


def _cached_swa_blocks(m: KVCacheManager, req: Request) -> set[int]:
    pool = m.block_pool
    return {i for i, h in enumerate(req.block_hashes) if pool.get_cached_block(h, kv_cache_group_ids=[1]) is not None}


def test_value_is_read_at_construction() -> None:
    m = _build(_hybrid_config(), 0)  # the variable is unset again after this
    req = Request("a", [i // 8 for i in range(128)], 8)
    assert m.allocate_slots(req, 128) is not None
    # Latest-only: just the tail before the replay boundary (96 tokens).
    assert _cached_swa_blocks(m, req) == {11}
    dense = _build(_hybrid_config(), None)
    req = Request("a", [i // 8 for i in range(128)], 8)
    assert dense.allocate_slots(req, 128) is not None
    assert _cached_swa_blocks(dense, req) == {3, 7, 11, 15}


def test_coordinator_view_is_named_as_vllms() -> None:
    one = KVCacheConfig(num_blocks=10, kv_cache_groups=[KVCacheGroupSpec(["a"], SlidingWindowSpec(8, 8))])
    assert type(KVCacheManager(one, 256, 8, 8).coordinator).__name__ == "UnitaryKVCacheCoordinator"
    assert type(_build(_hybrid_config(), None).coordinator).__name__ == "HybridKVCacheCoordinator"
    off = _build(_hybrid_config(), None, enable_caching=False)
    assert type(off.coordinator).__name__ == "KVCacheCoordinatorNoPrefixCache"


# --------------------------------------------------------------------------
# Differential: the same calls to vLLM 0.23.0's manager and hybridcache's


# (groups, scheduler_block_size, hash_block_size). A window needing as many
# blocks as a segment holds makes vLLM cache every block: the narrow windows
# keep sparse retention sparse, the wide ones check that exit.
LAYOUTS = {
    "sw4": ((Group("sw", 4, 4),), 4, 4),
    "sw4_wide": ((Group("sw", 4, 6),), 4, 4),
    "sw8": ((Group("sw", 8, 8),), 8, 8),
    "sw8_wide": ((Group("sw", 8, 13),), 8, 8),
    "full_sw4": ((Group("full", 4), Group("sw", 4, 5)), 8, 4),
    "full_sw4_wide": ((Group("full", 4), Group("sw", 4, 7)), 8, 4),
    "full_sw8": ((Group("full", 4), Group("sw", 8, 9)), 8, 4),
    "full_sw8_wide": ((Group("full", 4), Group("sw", 8, 5)), 8, 4),
}
MODES = (None, 0, 1, 2, 3)  # unset, latest boundary only, 1-3 scheduler blocks


def _setup(layout: str, eagle: bool, mode: int | None) -> Setup:
    groups, sbs, hbs = LAYOUTS[layout]
    return Setup(
        mix=layout,
        caching=True,
        groups=groups,
        scheduler_block_size=sbs,
        hash_block_size=hbs,
        num_blocks=160,
        use_eagle=eagle,
        events=True,
        log_stats=False,
        max_model_len=512,
        retention=None if mode is None else mode * sbs,
    )


class _Pair:
    """vLLM's manager and hybridcache's, built under the setup's retention."""

    def __init__(self, s: Setup) -> None:
        from hybridcache_dev.fuzz_setup import build_hybridcache, build_vllm

        self.s = s
        self.ref = build_vllm(s)
        self.hc = build_hybridcache(s)
        self.reqs: list[Request] = []

    def both(self, fn: Any, norm: Any = lambda x: x) -> Any:
        a, b = fn(self.ref), fn(self.hc)
        assert norm(a) == norm(b), f"vLLM {norm(a)!r} != hybridcache {norm(b)!r} (setup {self.s.describe()})"
        return a, b

    def check(self) -> None:
        self.hc.check_invariants()
        self.both(pool_state)
        self.both(lambda m: [m.get_block_ids(r.request_id) for r in self.reqs])
        self.both(lambda m: tuple(norm_event(e) for e in m.take_events()))

    def admit(self, rid: str, tokens: list[int], chunk: int) -> Request:
        r = Request(rid, tokens, self.s.hash_block_size)
        self.reqs.append(r)
        (hit_ref, n), (hit_hc, _) = self.both(lambda m: m.get_computed_blocks(r), lambda x: (norm_blocks(x[0]), x[1]))
        first = True
        while r.num_computed_tokens < r.num_tokens:
            new = min(chunk, r.num_tokens - r.num_computed_tokens - (n if first else 0))
            if first:
                self.both(lambda m: m.allocate_slots(r, new, n, hit_ref if m is self.ref else hit_hc), norm_allocated)
                r.num_computed_tokens = n + new
                first = False
            else:
                self.both(lambda m: m.allocate_slots(r, new), norm_allocated)
                r.num_computed_tokens += new
            self.check()
        r.append_output_token_ids([900])
        return r

    def decode(self, steps: int, lookahead: int, api: str) -> None:
        """Decode rounds of every request: vLLM one call each; hybridcache
        per request, or batched (`allocate_decode_batch` / `_arrays`)."""
        g = len(self.s.groups)
        for step in range(steps):
            reqs = list(self.reqs)
            expected = [self.ref.allocate_slots(r, 1, num_lookahead_tokens=lookahead) for r in reqs]
            if api == "single":
                got = [norm_allocated(self.hc.allocate_slots(r, 1, num_lookahead_tokens=lookahead)) for r in reqs]
                assert [norm_allocated(e) for e in expected] == got
            else:
                if api == "batch":
                    ok, offsets, ids = self.hc.allocate_decode_batch(reqs, [1] * len(reqs), lookahead)
                else:
                    handles = [self.hc.request_handle(r.request_id) for r in reqs]
                    computed = [r.num_computed_tokens for r in reqs]
                    totals = [r.num_tokens for r in reqs]
                    ok, raw_offsets, raw_ids = self.hc.allocate_decode_arrays(
                        handles, [1] * len(reqs), computed, totals, lookahead, reqs
                    )
                    offsets, ids = array("I", raw_offsets).tolist(), array("I", raw_ids).tolist()
                for i, e in enumerate(expected):
                    assert bool(ok[i]) == (e is not None)
                    if e is not None:
                        mine = tuple(list(ids[offsets[i * g + k] : offsets[i * g + k + 1]]) for k in range(g))
                        assert mine == e.get_block_ids()
            for r in reqs:
                r.num_computed_tokens += 1
                r.append_output_token_ids([901 + step % 3])
            self.check()

    def finish(self, r: Request) -> None:
        self.both(lambda m: m.free(r))
        self.reqs.remove(r)
        self.check()


def _scripted(s: Setup, api: str = "single") -> None:
    p = _Pair(s)
    base = list(range(1, 120))
    a = p.admit("a", base[:77], 13)
    b = p.admit("b", base[:50] + [500 + i for i in range(23)], 16)
    p.decode(14, 1 if s.use_eagle else 0, api)
    p.finish(a)
    # Exact and partial replays of a's prompt hit where vLLM's sparse
    # (or dense) cache lets them.
    c = p.admit("c", base[:77], 40)
    e = p.admit("e", base[:61], 7)
    p.decode(6, 0, api)
    for r in (b, c, e):
        p.finish(r)
    p.admit("f", base[:77] + [7, 7, 7], 80)


@needs_vllm
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("eagle", [False, True])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_scripted_replay_matches_vllm(layout: str, eagle: bool, mode: int | None) -> None:
    _scripted(_setup(layout, eagle, mode))


@needs_vllm
@pytest.mark.parametrize("api", ["batch", "arrays"])
@pytest.mark.parametrize("mode", [None, 0, 2])
@pytest.mark.parametrize("layout", ["sw4", "full_sw4"])
def test_batched_decodes_match_vllm(layout: str, mode: int | None, api: str) -> None:
    _scripted(_setup(layout, False, mode), api)


@needs_vllm
def test_fuzz_slice_with_retention(monkeypatch: pytest.MonkeyPatch) -> None:
    from hybridcache_dev import fuzz

    seen: list[int | None] = []
    real = fuzz.build_hybridcache

    def build(s: Setup) -> Any:
        seen.append(s.retention)
        return real(s)

    monkeypatch.setattr(fuzz, "build_hybridcache", build)
    f = fuzz.run_fuzz(ops=12_000, seed=23, mixes=("sw", "full_sw", "sw_mamba"), caching=(True,), ops_per_setup=500)
    assert f.reports == [], "\n\n".join(f.reports)
    assert (f.divergences, f.invariant_violations, f.bad_input_failures, f.reference_errors) == (0, 0, 0, 0)
    assert f.hit_tokens > 0 and f.events > 0
    assert None in seen and 0 in seen and any(v for v in seen), seen
