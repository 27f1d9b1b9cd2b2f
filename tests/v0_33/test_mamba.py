"""Mamba layouts on hybridcache's vLLM 0.33.0 facade, prefix caching off
(0.33.0's KVCacheCoordinatorNoPrefixCache), against vLLM 0.33.0's own
`KVCacheManager`: the new-block-id recording for worker-side zeroing
(`needs_kv_cache_zeroing`, `skip_zeroing_group_ids`), Mamba tables in
`get_block_ids_for_computed_tokens`, frees on processed tokens, align
prefill checkpoint blocks, and the align-mode under-count 0.33.0 still
crashes on (hybridcache answers None)."""

from __future__ import annotations

from typing import Any

import pytest

from hybridcache.config import FullAttentionSpec as HcFullAttentionSpec
from hybridcache.config import KVCacheConfig as HcKVCacheConfig
from hybridcache.config import KVCacheGroupSpec as HcKVCacheGroupSpec
from hybridcache.config import MambaSpec as HcMambaSpec
from hybridcache.config import SlidingWindowSpec as HcSlidingWindowSpec
from hybridcache.releases.v0_33.manager import KVCacheManager033

BS = 8
V033 = pytest.mark.vllm("0.33.0")


def _hc(*extra: Any, num_blocks: int = 20) -> HcKVCacheConfig:
    groups = [HcKVCacheGroupSpec(["f"], HcFullAttentionSpec(block_size=BS))]
    groups += [HcKVCacheGroupSpec([f"x{i}"], s) for i, s in enumerate(extra)]
    return HcKVCacheConfig(num_blocks=num_blocks, kv_cache_groups=groups)


def test_mamba_needs_full_attention_beside_it_and_align_for_prefix_caching() -> None:
    for mode in ("none", "align"):
        cfg = _hc(HcMambaSpec(block_size=BS, mamba_cache_mode=mode, num_speculative_blocks=1))
        assert KVCacheManager033(cfg, 200, BS, BS, enable_caching=False).num_kv_cache_groups == 2
    # Prefix caching: align blocks of one hash block (tests/v0_33/test_mamba_cache.py).
    assert KVCacheManager033(_hc(HcMambaSpec(block_size=BS, mamba_cache_mode="align")), 200, BS, BS).enable_caching
    with pytest.raises(ValueError, match="requires mamba_cache_mode='align'"):
        KVCacheManager033(_hc(HcMambaSpec(block_size=BS, mamba_cache_mode="none")), 200, BS, BS)
    # A Mamba block wider than the hash block: partial hash hits
    # (tests/v0_33/test_partial_hits.py), unless a group looks up whole blocks only.
    wide = _hc(HcMambaSpec(block_size=2 * BS, mamba_cache_mode="align"))
    assert KVCacheManager033(wide, 200, 2 * BS, BS).coordinator.enable_partial_hash_hits is True
    # Beside a sliding window of two hash blocks: partial hits off, hits on
    # scheduler blocks (tests/v0_33/test_mamba_layouts.py).
    coarse = _hc(HcSlidingWindowSpec(block_size=2 * BS, sliding_window=16),
                 HcMambaSpec(block_size=2 * BS, mamba_cache_mode="align"))
    assert KVCacheManager033(coarse, 200, 2 * BS, BS).coordinator.enable_partial_hash_hits is False
    # Beside a sliding window too (the full_sw_mamba and sw_mamba fuzz mixes).
    mixed = _hc(HcSlidingWindowSpec(block_size=BS, sliding_window=16), HcMambaSpec(block_size=BS))
    assert KVCacheManager033(mixed, 200, BS, BS, enable_caching=False).num_kv_cache_groups == 3


def _pair(mode: str, num_blocks: int, num_spec: int = 0, checkpoint: int | None = None,
          retention: int | None = None) -> tuple[Any, Any, Any, Any]:
    from hybridcache_dev import configs
    from hybridcache_dev.configs import GroupSpec
    from hybridcache_dev.fuzz_setup import Group, Setup
    from hybridcache_dev.release_api import release
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    specs = (GroupSpec("full", BS), GroupSpec("mamba", BS, mamba_cache_mode=mode, num_speculative_blocks=num_spec,
                                               mamba_checkpoint_alignment=checkpoint))
    kw = dict(max_model_len=1024, scheduler_block_size=BS, hash_block_size=BS, enable_caching=False)

    def config() -> Any:
        cfg = configs.vllm_kv_cache_config(specs, num_blocks)
        cfg.prefix_cache_retention_interval = retention
        return cfg

    ref = KVCacheManager(kv_cache_config=config(), **kw)
    ours = KVCacheManager033(kv_cache_config=config(), **kw)
    s = Setup(mix="full_mamba_align", caching=False, groups=(Group("full", BS), Group("mamba", BS, mode=mode)),
              scheduler_block_size=BS, hash_block_size=BS, num_blocks=num_blocks, use_eagle=False, events=False,
              log_stats=False, max_model_len=1024, release="0.33.0")
    return ref, ours, release("0.33.0"), s


def _ids(m: Any, rid: str) -> tuple[list[int], ...]:
    return tuple(list(g) for g in m.get_block_ids(rid))


@V033
@pytest.mark.parametrize("mode", ["none", "align"])
def test_new_block_ids_for_zeroing_and_frees(vllm_available: Any, mode: str) -> None:
    ref, ours, api, s = _pair(mode, 24, num_spec=1)
    for m in (ref, ours):
        r = api.make_request(s, "a", list(range(40)))
        assert m.allocate_slots(r, 16) is not None
        # External tokens whose async load writes group 0: not zeroed.
        e = api.make_request(s, "b", list(range(100, 140)))
        assert m.allocate_slots(e, 8, num_external_computed_tokens=16, skip_zeroing_group_ids=(0,)) is not None
        r.num_computed_tokens = 16
        assert m.allocate_slots(r, 16) is not None
        r.num_computed_tokens = 32
        r.num_in_flight_tokens = 8  # an async step still reads below 32
        assert m.allocate_slots(r, 8) is not None
    assert ours.take_new_block_ids() == ref.take_new_block_ids() != []
    assert ours.take_new_block_ids() == ref.take_new_block_ids() == []
    # A failed async load: the blocks past the valid prefix are zeroed again.
    for m in (ref, ours):
        m.record_blocks_for_zeroing("b", 8)
        m.record_blocks_for_zeroing("unknown", 0)
    assert ours.take_new_block_ids() == ref.take_new_block_ids() != []
    with pytest.raises(ValueError, match="start_token 3 is not a multiple of group 0's block size 8"):
        ours.record_blocks_for_zeroing("b", 3)
    assert ours.take_new_block_ids() == []
    for rid in ("a", "b"):
        assert _ids(ours, rid) == _ids(ref, rid)
        assert ours.get_block_ids_for_computed_tokens(rid, 9) == tuple(ref.get_block_ids_for_computed_tokens(rid, 9))
    assert ours.block_pool.get_num_free_blocks() == ref.block_pool.get_num_free_blocks()
    for m in (ref, ours):
        m.block_pool.free_blocks(reversed(m.pop_blocks_for_free(api.make_request(s, "a", []))))
    assert ours.block_pool.get_num_free_blocks() == ref.block_pool.get_num_free_blocks()
    ours.check_invariants()


@V033
def test_own_config_classes_record_attention_blocks_for_zeroing(vllm_available: Any) -> None:
    """hybridcache's own spec classes have no AttentionSpec base; their
    attention groups still record new block ids for zeroing, as vLLM's."""
    ref, _, api, s = _pair("none", 24)
    ours = KVCacheManager033(_hc(HcMambaSpec(block_size=BS), num_blocks=24), 1024, BS, BS, enable_caching=False)
    for m in (ref, ours):
        assert m.allocate_slots(api.make_request(s, "a", list(range(40))), 24) is not None
    assert ours.take_new_block_ids() == ref.take_new_block_ids() != []


@V033
def test_align_external_tokens_under_count_answers_none(vllm_available: Any) -> None:
    """vLLM 0.33.0 still leaves out the block an align group gives external
    (connector) tokens: with exactly the blocks it counted free it passes
    its check, then the pool raises. hybridcache counts the block and
    answers None (the scheduler waits), state untouched."""
    ref, ours, api, s = _pair("align", 7)
    before = ours.free_queue()
    assert ours.allocate_slots(api.make_request(s, "x", list(range(40))), 8, num_external_computed_tokens=32) is None
    assert ours.free_queue() == before and _ids(ours, "x") == ([], [])
    ours.check_invariants()
    with pytest.raises(ValueError, match="Cannot get 1 free blocks"):
        ref.allocate_slots(api.make_request(s, "x", list(range(40))), 8, num_external_computed_tokens=32)


@V033
@pytest.mark.parametrize("retention", [None, 0])
def test_align_prefill_checkpoint_blocks(vllm_available: Any, retention: int | None) -> None:
    """Mamba2 / GDN layers export a prefill checkpoint (0.29+): a chunk
    keeps a real block just below its running state (not a null one) and a
    speculative block there stays for it; with retention 0 only the chunk
    reaching the prefill end does. Counts, tables and the pool as 0.33.0's,
    the coordinator's count with `prefill_end` too."""
    ref, ours, api, s = _pair("align", 60, num_spec=2, checkpoint=1, retention=retention)
    seen: dict[str, list[Any]] = {"vllm": [], "hc": []}
    reserved = []
    for name, m in (("vllm", ref), ("hc", ours)):
        r = api.make_request(s, "a", list(range(70)))
        for n in (20, 20, 30):  # chunks ending mid-block, then the prompt's end
            view = m.coordinator.get_num_blocks_to_allocate(
                request_id="a", num_tokens=r.num_computed_tokens + n, new_computed_blocks=m.empty_kv_cache_blocks.blocks,
                num_encoder_tokens=0, total_computed_tokens=r.num_computed_tokens,
                num_local_computed_tokens=r.num_computed_tokens, num_tokens_main_model=r.num_computed_tokens + n,
                apply_admission_cap=True, prefill_end=70)
            assert m.allocate_slots(r, n) is not None
            if m is ref:
                reserved.append(bool(ref.coordinator.single_type_managers[1]._checkpoints))
            r.num_computed_tokens += n
            seen[name].append((view, _ids(m, "a")))
    assert seen["hc"] == seen["vllm"]
    # A chunk starting on the hash grid reserves one; with retention 0 only
    # the chunk reaching the prefill end.
    assert reserved == ([True, False, True] if retention is None else [False, False, True])
    assert ours.block_pool.get_num_free_blocks() == ref.block_pool.get_num_free_blocks()
    ours.check_invariants()
