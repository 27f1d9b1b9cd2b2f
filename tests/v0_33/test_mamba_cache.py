"""Mamba "align" prefix caching on hybridcache's vLLM 0.33.0 facade, for
blocks of one hash block (no partial hash hits), against vLLM 0.33.0's own
`KVCacheManager`: sparse retention of Mamba states (None / 0 / N), the
prompt's replay boundary, boundary-state offloads, the hit search with an
EAGLE Mamba group (no margin), the connector's per-group lookup, and the
fuzz slices of Mamba align with caching: beside full attention, with
prefill checkpoint blocks, beside a sliding window."""

from __future__ import annotations

from typing import Any

import pytest

from hybridcache.config import FullAttentionSpec as HcFullAttentionSpec
from hybridcache.config import KVCacheConfig as HcKVCacheConfig
from hybridcache.config import KVCacheGroupSpec as HcKVCacheGroupSpec
from hybridcache.config import MambaSpec as HcMambaSpec
from hybridcache.releases.v0_33.manager import KVCacheManager033

pytestmark = pytest.mark.vllm("0.33.0")

BS = 8


def _pair(num_blocks: int = 40, num_spec: int = 1, retention: int | None = None, use_eagle: bool = False,
          events: bool = True) -> tuple[Any, Any, Any, Any]:
    from hybridcache_dev import configs
    from hybridcache_dev.configs import GroupSpec
    from hybridcache_dev.fuzz_setup import Group, Setup
    from hybridcache_dev.release_api import release
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    specs = (GroupSpec("full", BS), GroupSpec("mamba", BS, mamba_cache_mode="align", num_speculative_blocks=num_spec))
    kw = dict(max_model_len=1024, scheduler_block_size=BS, hash_block_size=BS, enable_caching=True,
              use_eagle=use_eagle, enable_kv_cache_events=events)

    def config() -> Any:
        cfg = configs.vllm_kv_cache_config(specs, num_blocks)
        cfg.prefix_cache_retention_interval = retention
        return cfg

    ref = KVCacheManager(kv_cache_config=config(), **kw)
    ours = KVCacheManager033(kv_cache_config=config(), **kw)
    s = Setup(mix="full_mamba_align", caching=True,
              groups=(Group("full", BS), Group("mamba", BS, mode="align", num_spec=num_spec)),
              scheduler_block_size=BS, hash_block_size=BS, num_blocks=num_blocks, use_eagle=use_eagle, events=events,
              log_stats=False, max_model_len=1024, release="0.33.0")
    return ref, ours, release("0.33.0"), s


def _ids(blocks: Any) -> tuple[list[int], ...]:
    return tuple([b.block_id for b in g] for g in blocks.blocks)


def _run(m: Any, api: Any, s: Any, prompt: int, chunks: list[int], second: int) -> list[Any]:
    """A prompt prefilled in `chunks`, freed; then a longer sibling's lookup
    (and the connector's), offloads and events along the way."""
    seen: list[Any] = []
    r = api.make_request(s, "a", list(range(prompt)))
    for n in chunks:
        m.new_step_starts()
        out = m.allocate_slots(r, n)
        seen.append(None if out is None else _ids(out))
        r.num_computed_tokens += n
        seen.append(sorted(m.take_boundary_state_offloads().items()))
    seen.append([(type(e).__name__, getattr(e, "block_hashes", None)) for e in m.take_events()])
    m.free(r)
    m.new_step_starts()
    sib = api.make_request(s, "b", list(range(second)))
    blocks, hit, boundary = m.get_computed_blocks(sib)
    seen.append((_ids(blocks), hit, boundary))
    blocks, hit, boundary, diverged = m.get_computed_blocks_for_connector(sib)
    seen.append((_ids(blocks), hit, boundary, diverged))
    return seen


@pytest.mark.parametrize("retention", [None, 0, 2 * BS])
@pytest.mark.parametrize("prompt", [40, 41, 47])
def test_states_cached_under_retention_match_vllm(vllm_available: Any, retention: int | None, prompt: int) -> None:
    """Which Mamba states a chunked prefill leaves in the cache (dense, the
    replay boundary only, one per segment), what the offloads and events
    say, and the sibling's hit."""
    ref, ours, api, s = _pair(retention=retention)
    chunks = [16, 16, prompt - 32]
    assert _run(ours, api, s, prompt, chunks, prompt + 9) == _run(ref, api, s, prompt, chunks, prompt + 9)


@pytest.mark.parametrize("use_eagle", [False, True])
def test_eagle_mamba_hit_has_no_margin(vllm_available: Any, use_eagle: bool) -> None:
    ref, ours, api, s = _pair(use_eagle=use_eagle, num_spec=2)
    assert _run(ours, api, s, 48, [24, 24], 60) == _run(ref, api, s, 48, [24, 24], 60)


def test_a_state_cached_this_step_waits_a_step(vllm_available: Any) -> None:
    """A sibling hitting a state cached in the same step is not admitted
    (0.33.0 reports more blocks than the pool) until the next step."""
    ref, ours, api, s = _pair()
    got = []
    for m in (ref, ours):
        a = api.make_request(s, "a", list(range(33)))
        m.new_step_starts()
        m.allocate_slots(a, 32)
        b = api.make_request(s, "b", list(range(40)))
        blocks, hit, _ = m.get_computed_blocks(b)
        now = m.allocate_slots(b, 40 - hit, hit, blocks)
        m.new_step_starts()
        later = m.allocate_slots(b, 40 - hit, hit, blocks)
        got.append((hit, now is None, None if later is None else _ids(later)))
    assert got[0] == got[1] and got[0][0] > 0 and got[0][1]


def test_layouts_refused() -> None:
    def cfg(**kw: Any) -> HcKVCacheConfig:
        groups = [HcKVCacheGroupSpec(["f"], HcFullAttentionSpec(block_size=BS)),
                  HcKVCacheGroupSpec(["m"], HcMambaSpec(block_size=BS, **kw))]
        return HcKVCacheConfig(num_blocks=20, kv_cache_groups=groups)

    assert KVCacheManager033(cfg(mamba_cache_mode="align"), 200, BS, BS).enable_caching
    with pytest.raises(ValueError, match="requires mamba_cache_mode='align'"):
        KVCacheManager033(cfg(mamba_cache_mode="all"), 200, BS, BS)


def test_fuzz_slice_full_attention_and_mamba_align_with_caching(vllm_available: Any) -> None:
    """Full attention + Mamba align with prefix caching (EAGLE, lookahead
    hashes, retention None / 0 / N, speculative blocks, external tokens and
    async loads, preemption, resets), against vLLM 0.33.0."""
    from hybridcache_dev import fuzz

    f = fuzz.run_fuzz(ops=12_000, seed=335, mixes=("full_mamba_align", "full_mamba3"), caching=(True,),
                      ops_per_setup=400, release_name="0.33.0", candidate="hybridcache")
    findings = [r for r in f.reports if not r.startswith("[unsupported setup]")]
    assert findings == [], "\n\n".join(findings)
    assert (f.divergences, f.invariant_violations, f.reference_errors) == (0, 0, 0)
    assert f.calls.get("unsupported_setups", 0) == 0, f.summary()
    assert f.hit_tokens > 0 and f.events > 0 and f.preemptions > 0 and f.resets > 0
    assert f.calls.get("sparse_retention_setups", 0) > 0 and f.calls.get("sync_external_loads", 0) > 0
    assert f.calls.get("shared_prefix_boundaries", 0) > 0


@pytest.mark.parametrize(("mixes", "seed"), [(("full_mamba_ckpt",), 336), (("full_sw_mamba", "sw_mamba"), 337),
                                             (("mamba_only",), 338), (("chunked_mamba",), 339)],
                         ids=["checkpoint-blocks", "beside-sliding-window", "mamba-alone", "beside-chunked-local"])
def test_fuzz_slice_checkpoints_and_sliding_windows(vllm_available: Any, mixes: tuple[str, ...], seed: int) -> None:
    """Mamba align with prefill checkpoint blocks (vLLM 0.33.0's own asserts
    on stale checkpoints steered around: testing/fuzz_mamba_guard033.py),
    Mamba beside sliding windows, Mamba alone (the unitary coordinator) and
    beside chunked local attention, prefix caching on, against vLLM 0.33.0."""
    from hybridcache_dev import fuzz

    f = fuzz.run_fuzz(ops=8_000, seed=seed, mixes=mixes, caching=(True,), ops_per_setup=400,
                      release_name="0.33.0", candidate="hybridcache")
    findings = [r for r in f.reports if not r.startswith("[unsupported setup]")]
    assert findings == [], "\n\n".join(findings)
    assert (f.divergences, f.invariant_violations, f.reference_errors) == (0, 0, 0)
    assert f.calls.get("unsupported_setups", 0) == 0, f.summary()
    assert f.hit_tokens > 0 and f.events > 0 and f.preemptions > 0
