"""hybridcache's vLLM 0.34.0 facade (`hybridcache.releases.v0_34.manager`)
against vLLM 0.34.0's own `KVCacheManager`, call by call, where 0.34.0
differs from 0.33.0: lookups gated and bounded by the request's
`prefix_cache_hit_limit`, the `get_num_cached_tokens` probe (no side
effect), `block_pool.free_blocks(..., evict_first=True)`, zeroing read from
the config's `needs_kv_cache_zeroing` field, `get_num_common_prefix_blocks`
gone, a manager without caching that hashes lookahead tokens, and the
scheduler's `cache_blocks` when a Mamba request stops."""

from __future__ import annotations

from typing import Any

import pytest

from hybridcache_dev import oracle

pytestmark = pytest.mark.vllm("0.34.0")
oracle.module_needs_vllm("0.34.0")

from hybridcache.tools.compare import pool_state  # noqa: E402
from hybridcache_dev.fuzz_setup import Group, Setup  # noqa: E402
from hybridcache_dev.pair import OURS, REF, ManagerPair  # noqa: E402

BS = 4


def _setup(groups: tuple[Group, ...] = (Group("full", BS),), caching: bool = True, log_stats: bool = False,
           num_blocks: int = 40, hash_lookahead: int = 0) -> Setup:
    return Setup(mix="test", caching=caching, groups=groups, scheduler_block_size=groups[0].block_size,
                 hash_block_size=groups[0].block_size, num_blocks=num_blocks, use_eagle=False, events=True,
                 log_stats=log_stats, max_model_len=1024, release="0.34.0", hash_lookahead=hash_lookahead)


def _tokens(n: int, base: int = 1000) -> list[int]:
    return [base + i for i in range(n)]


def _pair(**kw: Any) -> ManagerPair:
    p = ManagerPair(_setup(**kw), strict=True)
    assert "KVCacheManager034" in [c.__name__ for c in type(p.ours).__mro__]
    return p


def _request(p: ManagerPair, rid: str, tokens: list[int], limit: int | None = None) -> None:
    p.request(rid, tokens)
    for side in (REF, OURS):
        p.req(rid, side).prefix_cache_hit_limit = limit


def _cache(p: ManagerPair, rid: str, n: int) -> None:
    """Request `rid` of `n` tokens computed and freed: its blocks cached."""
    _request(p, rid, _tokens(n))
    p.admit(rid)
    p.both(lambda m, side: m.free(p.req(rid, side)))


@pytest.mark.parametrize("limit, bound, hit", [
    (None, None, 40), (0, None, 0), (10, None, 8), (40, None, 40), (39, None, 36), (None, 21, 20), (30, 13, 12), (9, 30, 8),
    (0, 30, 0), (None, 0, 0),
])
def test_hit_limit_bounds_the_lookup(limit: int | None, bound: int | None, hit: int) -> None:
    """A hit reaches at most min(num_tokens - 1, the request's limit, the
    caller's bound), whole blocks; a limit of 0 skips the lookup."""
    p = _pair()
    _cache(p, "a", 40)
    _request(p, "b", _tokens(40) + [7], limit)
    got = p.both(lambda m, side: m.get_computed_blocks(p.req("b", side), bound)[1], lambda x: x)
    assert got == hit
    conn = p.both(lambda m, side: m.get_computed_blocks_for_connector(p.req("b", side), bound)[1], lambda x: x)
    assert conn == hit
    assert p.ours.prefix_cache_lookup_enabled(p.req("b", OURS)) is (limit != 0)


def test_stats_skip_requests_whose_limit_is_zero() -> None:
    p = _pair(log_stats=True)
    _cache(p, "a", 40)
    for rid, limit in (("b", 0), ("c", 10), ("d", None)):
        _request(p, rid, _tokens(40) + [7], limit)
        p.both(lambda m, side, rid=rid: m.record_prefix_cache_stats(p.req(rid, side), 8))
    stats = p.both(lambda m, side: m.make_prefix_cache_stats(), p.api.norm_stats)
    assert stats.requests == 2


@pytest.mark.parametrize("limit", [None, 0, 5])
def test_probe_counts_cached_tokens_and_changes_nothing(limit: int | None) -> None:
    """`get_num_cached_tokens`: the hit bounded by num_tokens - 1 (not by a
    non-zero limit), 0 for a limit of 0; no reference, touch, event, stat or
    registered request."""
    p = _pair(log_stats=True)
    _cache(p, "a", 40)
    _cache(p, "x", 12)  # freed later than a's blocks: a touch would reorder the queue
    _request(p, "b", _tokens(40), limit)
    before = pool_state(p.ours)
    n = p.both(lambda m, side: m.get_num_cached_tokens(p.req("b", side)), lambda x: x)
    assert n == (0 if limit == 0 else 36)
    assert pool_state(p.ours) == before
    assert p.ours.take_events() == [] and p.ref.take_events() == []
    assert p.ours.request_ids() == []
    stats = p.ours.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (0, 0, 0)
    # The whole prompt cached: the last token is not counted.
    _request(p, "c", _tokens(12, 1000))
    assert p.both(lambda m, side: m.get_num_cached_tokens(p.req("c", side)), lambda x: x) == 8


def test_probe_without_caching_is_zero() -> None:
    p = _pair(caching=False)
    _request(p, "b", _tokens(20))
    assert p.both(lambda m, side: m.get_num_cached_tokens(p.req("b", side)), lambda x: x) == 0


@pytest.mark.parametrize("evict_first", [False, True])
def test_free_blocks_evict_first_puts_cached_blocks_in_front(evict_first: bool) -> None:
    """Deferred frees with `evict_first`: cached blocks join the front of
    the free queue too (reused before other cached blocks)."""
    p = _pair()
    _cache(p, "x", 17)
    _request(p, "a", _tokens(30, 5000))
    p.admit("a")
    theirs, ours = p.ref.pop_blocks_for_free(p.req("a", REF)), p.ours.pop_blocks_for_free(p.req("a", OURS))
    assert [b.block_id for b in ours] == [b.block_id for b in theirs]
    del p.reqs["a"]
    p.ref.block_pool.free_blocks(reversed(theirs), evict_first=evict_first)
    p.ours.block_pool.free_blocks(reversed(ours), evict_first=evict_first)
    p.check_pool()
    # a's first (cached) block is among the first reused iff evict_first.
    assert (ours[0].block_id in p.ours.free_queue()[:len(ours)]) is evict_first


@pytest.mark.parametrize("field", [False, True])
def test_zeroing_follows_the_config_field(field: bool) -> None:
    """0.34.0's engine ORs `needs_kv_cache_zeroing` over the workers: a
    full-attention-only config can carry True (another worker needs it),
    and new block ids are then recorded for zeroing."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    from hybridcache.releases.v0_34.manager import KVCacheManager034
    from hybridcache_dev.release_api import release

    s = _setup()
    api = release("0.34.0")
    cfg = api.kv_cache_config(s)
    assert cfg.needs_kv_cache_zeroing is False
    cfg.needs_kv_cache_zeroing = field
    managers = [cls(kv_cache_config=cfg, **api.manager_kwargs(s)) for cls in (KVCacheManager, KVCacheManager034)]
    for m in managers:
        r = api.make_request(s, "r", _tokens(10))
        r.prefix_cache_hit_limit = None
        assert m.allocate_slots(r, 10) is not None
    theirs, ours = (m.take_new_block_ids() for m in managers)
    assert ours == theirs and bool(ours) is field


def test_get_num_common_prefix_blocks_is_gone() -> None:
    p = _pair()
    assert not hasattr(p.ref, "get_num_common_prefix_blocks")
    assert not hasattr(p.ours, "get_num_common_prefix_blocks")
    with pytest.raises(AttributeError, match="get_num_common_prefix_blocks"):
        p.ours.get_num_common_prefix_blocks("r")


def test_lookahead_hashes_without_caching() -> None:
    """Connectors with lookahead support: a manager without prefix caching
    built with lookahead hash tokens (0.34.0 allows it)."""
    p = _pair(caching=False, hash_lookahead=2)
    _request(p, "a", _tokens(20))
    p.admit("a")
    p.step("a", 1)
    p.both(lambda m, side: m.free(p.req("a", side)))


def test_cache_blocks_when_a_mamba_request_stops() -> None:
    """0.34.0's scheduler publishes a stopping request's Mamba states with
    `cache_blocks(request, num_computed_tokens)` (prefix caching,
    synchronous scheduling): the same cached keys, events and pool."""
    groups = (Group("full", BS), Group("mamba", BS, mode="align"))
    p = ManagerPair(Setup(mix="test", caching=True, groups=groups, scheduler_block_size=BS, hash_block_size=BS,
                          num_blocks=40, use_eagle=False, events=True, log_stats=False, max_model_len=1024,
                          release="0.34.0"), strict=True)
    _request(p, "a", _tokens(18))
    p.admit("a")
    for _ in range(5):
        p.step("a", 1)
        for side in (REF, OURS):
            p.req("a", side).append_output_token_ids(7)
    p.both(lambda m, side: m.cache_blocks(p.req("a", side), p.req("a", side).num_computed_tokens))
    p.both(lambda m, side: m.free(p.req("a", side)))
    _request(p, "b", _tokens(18) + [7] * 5 + [9])
    assert p.lookup("b")[2] > 16
