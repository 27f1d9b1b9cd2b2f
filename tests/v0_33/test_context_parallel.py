"""Decode context parallelism in vLLM 0.33.0's form, against vLLM 0.33.0: only
`dcp_world_size` scales a block (to `block_size * dcp` tokens), and only of a
dcp-sharded spec; `pcp_world_size` scales nothing (the 0.33.0 scheduler passes
1). Every output that shows the size (allocation counts, hits, caching,
events, `estimate_cached_tokens`) must be vLLM's, and where vLLM 0.33.0
asserts (reused-hit events with dcp > 1), hybridcache stays correct."""

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
WORLDS = [(2, 1), (1, 2), (2, 2), (4, 1)]


def _setup(dcp: int, pcp: int, caching: bool, seed: int) -> fuzz.Setup:
    """A random full-attention setup of the 0.33 fuzz with this world."""
    rng = random.Random(seed)
    s = API.random_setup(rng, "full", caching)
    bs = s.groups[0].block_size
    # vLLM's block-size resolution for one group: both sizes are bs * dcp.
    return dataclasses.replace(s, dcp=dcp, pcp=pcp, scheduler_block_size=bs * dcp, hash_block_size=bs * dcp,
                               num_blocks=16 + seed % 9, prefill_lookahead=min(s.prefill_lookahead, 1),
                               hash_lookahead=min(s.hash_lookahead, 1))


@pytest.mark.parametrize("dcp,pcp", WORLDS)
@pytest.mark.parametrize("caching", [True, False])
def test_random_operations_match_vllm(dcp: int, pcp: int, caching: bool) -> None:
    f = drive(API, [_setup(dcp, pcp, caching, seed + 10 * dcp + 3 * pcp) for seed in range(3)], 700)
    assert (f.divergences, f.invariant_violations, f.reference_errors) == (0, 0, 0), f.reports
    assert f.context_parallel_setups == 3 and f.allocations > 300 and f.none_allocations > 0
    if caching:
        assert f.hit_tokens > 0


def _pair(dcp: int, pcp: int, sharded: bool = True, events: bool = True):
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    s = _setup(dcp, pcp, True, 1)
    s = dataclasses.replace(s, events=events, hash_lookahead=0, use_eagle=False)
    cfg = API.kv_cache_config(s)
    if not sharded:
        cfg.kv_cache_groups[0].kv_cache_spec = dataclasses.replace(cfg.kv_cache_groups[0].kv_cache_spec,
                                                                  dcp_sharded=False)
        s = dataclasses.replace(s, scheduler_block_size=s.groups[0].block_size,
                                hash_block_size=s.groups[0].block_size)
    kw = API.manager_kwargs(s)
    from hybridcache.releases.v0_33.manager import KVCacheManager033

    return s, KVCacheManager(kv_cache_config=cfg, **kw), KVCacheManager033(kv_cache_config=cfg, **kw)


@pytest.mark.parametrize("dcp,pcp,sharded", [(2, 1, True), (1, 2, True), (2, 2, True), (2, 1, False)])
def test_the_block_size_is_what_vllm_shows(dcp: int, pcp: int, sharded: bool) -> None:
    s, ref, hc = _pair(dcp, pcp, sharded)
    want = ref.coordinator.single_type_managers[0].block_size
    assert want == s.groups[0].block_size * (dcp if sharded else 1)
    assert hc.coordinator.single_type_managers[0].block_size == want
    # One request of three blocks and a bit: the same blocks, then the same hit.
    tokens = list(range(3 * want + 1))
    for m in (ref, hc):
        r = API.make_request(s, "a", tokens)
        blocks, hit, _ = m.get_computed_blocks(r)
        assert hit == 0
        new = m.allocate_slots(r, len(tokens), hit, blocks)
        assert [len(g) for g in new.get_block_ids()] == [4]
        r.num_computed_tokens = len(tokens)
        m.free(r)
    got = []
    for m in (ref, hc):
        r = API.make_request(s, "b", tokens)
        blocks, hit, _ = m.get_computed_blocks(r)
        got.append((blocks.get_block_ids(), hit, m.block_pool.get_num_free_blocks()))
    assert got[0] == got[1] and got[0][1] == 3 * want


def test_reused_hit_events_with_dcp_where_vllm_asserts() -> None:
    """vLLM 0.33.0 views the hashes at the spec's unscaled block size when it
    reports a reused hit (`kv_cache_report_mode="full"`), finer than the hash
    blocks: AssertionError in `resolve_block_hashes`. hybridcache reports the
    hit's blocks at the size they hold."""
    s, ref, hc = _pair(2, 1)
    bs = 2 * s.groups[0].block_size
    tokens = list(range(2 * bs + 1))
    for m in (ref, hc):
        r = API.make_request(s, "a", tokens)
        m.allocate_slots(r, len(tokens))
        r.num_computed_tokens = len(tokens)
        m.free(r)
        m.take_events()
    r_ref = API.make_request(s, "b", tokens, report_full=True)
    with pytest.raises(AssertionError):
        ref.get_computed_blocks(r_ref)
    r = API.make_request(s, "b", tokens, report_full=True)
    blocks, hit, _ = hc.get_computed_blocks(r)
    assert hit == 2 * bs
    (stored,) = hc.take_events()
    assert type(stored).__name__ == "BlockStored"
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    assert stored.block_size == bs
    assert list(stored.block_hashes) == [maybe_convert_block_hash(h) for h in r.block_hashes[:2]]
    assert list(stored.token_ids) == tokens[: 2 * bs]


def _hybrid_dcp_setups(n: int) -> list[fuzz.Setup]:
    """The fuzz's draws of context parallelism on several groups."""
    out = []
    for seed in range(500):
        mix = ("full_sw", "full_full", "full_full_sw", "full_chunked")[seed % 4]
        s = API.random_setup(random.Random(seed), mix, seed % 3 != 0)
        if s.dcp > 1:
            out.append(s)
        if len(out) == n:
            return out
    raise AssertionError("too few draws with dcp > 1")


def test_several_groups_with_dcp_match_vllm() -> None:
    """Full attention (dcp-sharded: blocks of block_size * dcp tokens) beside
    replicated sliding-window / chunked-local / full-attention groups."""
    setups = _hybrid_dcp_setups(6)
    f = drive(API, setups, 600)
    assert (f.divergences, f.invariant_violations, f.reference_errors) == (0, 0, 0), f.reports
    assert f.context_parallel_setups == 6 and f.allocations > 500
    assert any(len(s.groups) > 1 and s.replicated and s.caching for s in setups)


def test_several_groups_with_dcp_where_vllm_asserts() -> None:
    """A dcp-sharded sliding-window group beside full attention, with prefix
    caching: vLLM 0.33.0's hybrid coordinator asserts; hybridcache says why."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    from hybridcache.releases.v0_33.manager import KVCacheManager033

    s = next(s for s in _hybrid_dcp_setups(12) if s.caching and s.mix == "full_sw")
    s = dataclasses.replace(s, replicated=(), dcp=2, pcp=1)
    cfg, kw = API.kv_cache_config(s), API.manager_kwargs(s)
    with pytest.raises(AssertionError, match="DCP with hybrid"):
        KVCacheManager(kv_cache_config=cfg, **kw)
    with pytest.raises(ValueError, match=r"kv_cache_groups\[1\].*dcp_world_size=.*SlidingWindowSpec"):
        KVCacheManager033(kv_cache_config=cfg, **kw)
    with pytest.raises(ValueError, match="dcp_world_size"):
        KVCacheManager033(kv_cache_config=cfg, **{**kw, "dcp_world_size": 0})
