"""Multi-module MTP under vLLM 0.33.0 (`num_prefill_lookahead` = the draft
count > 1): the last `num_prefill_lookahead - 1` computed tokens may be
re-prefilled, so neither vLLM nor hybridcache caches them. Random operations
on setups drawn with MTP forced on, against vLLM 0.33.0, every output
compared; and one scenario where the rule decides a later hit."""

from __future__ import annotations

import dataclasses
import os
import random

import pytest

pytestmark = pytest.mark.vllm("0.33.0")

from hybridcache_dev.oracle import module_needs_vllm  # noqa: E402

vllm = module_needs_vllm("0.33.0")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # 0.33.0 infers no device on a CPU machine

from hybridcache_dev import fuzz  # noqa: E402
from hybridcache_dev.drive import drive  # noqa: E402
from hybridcache_dev.release_api import release  # noqa: E402

API = release("0.33.0")


def _mtp_setup(mix: str, seed: int, lookahead_hashes: bool) -> fuzz.Setup:
    rng = random.Random(seed)
    s = API.random_setup(rng, mix, True)
    drafts = min(rng.randint(2, 4), s.scheduler_block_size)
    # EAGLE-family drafting with MTP: lookahead hashes (use_eagle=False), or
    # the last-block drop (use_eagle=True).
    return dataclasses.replace(s, spec_tokens=drafts, prefill_lookahead=drafts,
                               hash_lookahead=drafts if lookahead_hashes else 0, use_eagle=not lookahead_hashes)


@pytest.mark.parametrize("mix", ["full", "full_full", "full_sw", "full_chunked"])
@pytest.mark.parametrize("lookahead_hashes", [False, True])
def test_random_operations_match_vllm(mix: str, lookahead_hashes: bool) -> None:
    if mix == "full_chunked" and not lookahead_hashes:
        pytest.skip("vLLM 0.33.0 refuses EAGLE's block drop with chunked local attention (an assert)")
    f = drive(API, [_mtp_setup(mix, seed * 7 + len(mix), lookahead_hashes) for seed in range(3)], 800)
    assert (f.divergences, f.invariant_violations, f.reference_errors) == (0, 0, 0), f.reports
    assert f.calls["mtp_setups"] == 3 and f.allocations > 300 and f.hit_tokens > 0


def test_reprefillable_tokens_are_not_cached() -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    from hybridcache.releases.v0_33.manager import KVCacheManager033

    s = dataclasses.replace(_mtp_setup("full", 1, False), events=True)
    bs = s.groups[0].block_size
    kw = {**API.manager_kwargs(s), "num_prefill_lookahead": 3, "use_eagle": False}
    cfg = API.kv_cache_config(s)
    ref, hc = KVCacheManager(kv_cache_config=cfg, **kw), KVCacheManager033(kv_cache_config=cfg, **kw)
    assert hc.coordinator.num_reprefillable_tokens == ref.coordinator.num_reprefillable_tokens == 2
    tokens = list(range(3 * bs + 5))
    seen = []
    for m in (ref, hc):
        r = API.make_request(s, "a", tokens)
        # Two blocks and one token computed: the second block ends within the
        # two re-prefillable tokens, so only the first is cached.
        m.allocate_slots(r, 2 * bs + 1)
        r.num_computed_tokens = 2 * bs + 1
        m.cache_blocks(r, 2 * bs + 1)
        b = API.make_request(s, "b", tokens)
        blocks, hit, _ = m.get_computed_blocks(b)
        seen.append((hit, blocks.get_block_ids(), m.block_pool.get_num_free_blocks()))
    assert seen[0] == seen[1] and seen[0][0] == bs


@pytest.mark.parametrize("lookahead,num_tokens", [(2, 17), (2, 21), (3, 18), (3, 25)])
def test_sliding_window_hit_with_mtp_lookahead_hashes_where_vllm_raises(lookahead: int, num_tokens: int) -> None:
    """vLLM 0.33.0's sliding-window hit search indexes past the request's
    hashes when multi-module MTP lookahead hashes leave the last full blocks
    unhashed (IndexError in SlidingWindowManager.find_longest_cache_hit, a
    model with only sliding-window groups). hybridcache's hit stops at the
    last hashed block, as vLLM's does one token earlier or later."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    from hybridcache.releases.v0_33.manager import KVCacheManager033
    from hybridcache_dev.fuzz_setup import Group, Setup

    s = Setup(mix="sw", caching=True, groups=(Group("sw", 4, 8),), scheduler_block_size=4, hash_block_size=4,
              num_blocks=30, use_eagle=False, events=False, log_stats=False, release="0.33.0",
              hash_lookahead=lookahead, prefill_lookahead=lookahead, spec_tokens=lookahead)
    cfg, kw = API.kv_cache_config(s), API.manager_kwargs(s)
    ref, hc = KVCacheManager(kv_cache_config=cfg, **kw), KVCacheManager033(kv_cache_config=cfg, **kw)
    tokens = list(range(num_tokens))
    for m in (ref, hc):
        r = API.make_request(s, "a", tokens)
        m.allocate_slots(r, num_tokens)
        r.num_computed_tokens = num_tokens
        m.free(r)
    with pytest.raises(IndexError):
        ref.get_computed_blocks(API.make_request(s, "b", tokens))
    b = API.make_request(s, "b", tokens)
    blocks, hit, _ = hc.get_computed_blocks(b)
    hashed = len(b.block_hashes)
    assert hashed < num_tokens // 4 and hit == 4 * hashed
    # The window's last two blocks, nulls before them, as the cached run holds them.
    ids = blocks.get_block_ids()[0]
    assert len(ids) == hashed and ids[:-2] == [0] * (hashed - 2) and 0 not in ids[-2:]
    hc.check_invariants()
