"""vLLM 0.33.0's partial-block prefix-cache entries, hybridcache's 0.33.0
facade against vLLM 0.33.0's own manager on the same calls: a
full-attention block wider than the hash block (two full-attention groups,
hash block = their gcd) caches the prompt's tail as a partial entry
(`FullAttentionManager._cache_partial_tail_block`); its promotion when the
block fills (BlockRemoved, then BlockStored), the eviction of a block
holding a full and a partial key, `estimate_cached_tokens`,
`block_hash_num_tokens`, `evict_blocks` and `reset_prefix_cache`."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

pytestmark = pytest.mark.vllm("0.33.0")

vllm = pytest.importorskip("vllm", reason="needs vLLM 0.33.0 (the 0.33 venv)")
from hybridcache_dev.oracle import module_needs_vllm  # noqa: E402

module_needs_vllm("0.33.0")

from hybridcache_dev.fuzz_setup import Group, Setup  # noqa: E402
from hybridcache_dev.pair import block_ids_of  # noqa: E402
from hybridcache_dev.release_api import release  # noqa: E402

API = release("0.33.0")


def _setup(wide: int, narrow: int, *, eagle: bool = False, num_blocks: int = 24) -> Setup:
    return Setup(mix="full_fullbs", caching=True, groups=(Group("full", wide), Group("full", narrow)),
                 scheduler_block_size=wide, hash_block_size=narrow, num_blocks=num_blocks, use_eagle=eagle,
                 events=True, log_stats=False, release="0.33.0")


class Pair:
    """vLLM 0.33.0's manager and the facade, driven by the same calls on
    one request object per request; every answer compared."""

    def __init__(self, s: Setup) -> None:
        self.s = s
        self.theirs = API.build_reference(s)
        self.ours = API.build_facade(s)

    def both(self, call: Any) -> Any:
        t, o = call(self.theirs), call(self.ours)
        assert block_ids_of(o) == block_ids_of(t)
        return t

    def events(self) -> list[Any]:
        t, o = self.theirs.take_events(), self.ours.take_events()
        assert [API.norm_event(e) for e in o] == [API.norm_event(e) for e in t]
        return t

    def hash_tokens(self, request_id: str) -> list[list[int | None]]:
        """`block_hash_num_tokens` of the request's blocks, per group."""
        t = [[b.block_hash_num_tokens for b in g] for g in self.theirs.get_blocks(request_id).blocks]
        o = [[b.block_hash_num_tokens for b in g] for g in self.ours.get_blocks(request_id).blocks]
        assert o == t
        return t

    def admit(self, r: Any) -> None:
        t_blocks, hit, _ = self.theirs.get_computed_blocks(r)
        o_blocks, o_hit, _ = self.ours.get_computed_blocks(r)
        assert (o_hit, block_ids_of(o_blocks)) == (hit, block_ids_of(t_blocks))
        t = self.theirs.allocate_slots(r, r.num_tokens - hit, hit, t_blocks)
        o = self.ours.allocate_slots(r, r.num_tokens - hit, hit, o_blocks)
        assert t is not None and block_ids_of(o) == block_ids_of(t)
        r.num_computed_tokens = r.num_tokens

    def decode(self, r: Any, n: int) -> None:
        for _ in range(n):
            r.append_output_token_ids(7)
            self.both(lambda m: m.allocate_slots(r, 1))
            r.num_computed_tokens = r.num_tokens

    def estimate(self, r: Any) -> int:
        return self.both(lambda m: m.estimate_cached_tokens(r))

    def free(self, r: Any) -> None:
        self.both(lambda m: m.free(r))


def test_partial_tail_is_promoted_when_its_block_fills() -> None:
    """EAGLE (the whole prompt is resendable, and the caching call reaches
    the tail): the 14-token prompt's boundary 12 sits inside the second
    8-token block, a partial entry of one hash block; when the block
    fills, BlockRemoved for it, then BlockStored for the full block (and
    the tail again, now a second key)."""
    p = Pair(_setup(8, 4, eagle=True))
    r = API.make_request(p.s, "a", list(range(100, 114)))
    p.admit(r)
    stored = p.events()
    partial = [e for e in stored if e.group_idx == 0 and e.block_size == 4]
    assert len(partial) == 1 and partial[0].token_ids == list(range(108, 112))
    assert p.hash_tokens("a")[0] == [8, 12]
    assert p.estimate(r) == 12
    p.decode(r, 2)
    # The partial key goes, the full block comes, and the tail (still the
    # prompt's) is registered again as the full block's second key.
    promoted = [(type(e).__name__, getattr(e, "block_size", None)) for e in p.events() if e.group_idx == 0]
    assert promoted == [("BlockRemoved", None), ("BlockStored", 8), ("BlockStored", 4)]
    assert p.hash_tokens("a")[0] == [8, 16]
    assert p.estimate(r) == 16


def test_block_with_full_and_partial_keys_is_evicted_whole() -> None:
    """Without EAGLE the tail boundary (prompt - 1 tokens: 4) is cached once
    its block is full, as a second key of that block; reusing the block
    removes both keys; evict_blocks does the same to a held block."""
    p = Pair(_setup(8, 4, num_blocks=13))
    a = API.make_request(p.s, "a", list(range(200, 206)))
    p.admit(a)
    p.decode(a, 10)
    assert p.hash_tokens("a")[0] == [8, 16]
    assert p.estimate(a) == 16
    kinds = [(type(e).__name__, e.block_size) for e in p.events() if e.group_idx == 0]
    assert ("BlockStored", 4) in kinds, kinds
    p.free(a)
    # A new request takes every free block: the cached ones are evicted.
    b = API.make_request(p.s, "b", list(range(900, 932)))
    p.admit(b)
    removed = [e for e in p.events() if type(e).__name__ == "BlockRemoved" and e.group_idx == 0]
    assert len(removed) == 3  # block 0's two keys, block 1's
    # A held block's keys go too (a connector's evict_blocks).
    c = API.make_request(p.s, "c", list(range(300, 306)))
    p.free(b)
    p.admit(c)
    p.decode(c, 10)
    p.events()
    first = p.theirs.get_blocks("c").blocks[0][0].block_id
    assert first == p.ours.get_blocks("c").blocks[0][0].block_id
    p.both(lambda m: m.evict_blocks({first}))
    assert len(p.events()) == 2
    assert p.hash_tokens("c")[0][0] is None
    p.decode(c, 1)  # the tail is registered again, now as the block's only key
    assert p.hash_tokens("c")[0][0] == 4
    assert [e.block_size for e in p.events() if type(e).__name__ == "BlockStored"] == [4]


def test_wide_block_keeps_its_keys_across_requests_and_reset_clears_them() -> None:
    """Blocks of 16 over hash blocks of 4: a second request hits the first
    one's blocks (block-aligned: partial hits stay off), adding its own
    tail keys; reset_prefix_cache clears every key."""
    p = Pair(_setup(16, 4, num_blocks=30))
    a = API.make_request(p.s, "a", list(range(40)))
    p.admit(a)
    p.decode(a, 8)
    b = API.make_request(p.s, "b", list(range(37)) + [5, 5, 5, 5])
    p.admit(b)
    # a: 48 tokens cached (its tail key at 36 sits on its third block);
    # b: the two blocks it hit (hits stay block-aligned) and no tail yet.
    assert (p.estimate(a), p.estimate(b)) == (48, 32)
    p.decode(b, 8)
    assert p.estimate(b) == 48
    assert any(e.block_size == 4 for e in p.events() if type(e).__name__ == "BlockStored")
    assert p.hash_tokens("b")[0] == [16, 32, 48, None]
    p.free(a)
    p.free(b)
    assert p.both(lambda m: m.reset_prefix_cache()) is True
    assert [type(e).__name__ for e in p.events()] == ["AllBlocksCleared"]
    c = API.make_request(p.s, "c", list(range(40)))
    t_blocks, hit, _ = p.theirs.get_computed_blocks(c)
    assert hit == 0 and p.ours.get_computed_blocks(c)[1] == 0


def test_facade_accepts_full_attention_over_smaller_hash_blocks() -> None:
    """The layout the facade used to refuse builds, and a lone group still
    needs its block to be the hash block (as vLLM's unitary coordinator)."""
    p = Pair(_setup(32, 16))
    assert p.ours.block_pool.hash_block_size == 16
    one = dataclasses.replace(_setup(32, 16), groups=(Group("full", 32),))
    with pytest.raises(Exception):
        API.build_reference(one)


@pytest.mark.parametrize("num_extra", [2, 3, 5])
def test_extra_keys_are_removed_in_vllm_set_order(num_extra: int) -> None:
    """A block with several extra keys (vLLM keeps them in a `set`): its
    BlockRemoved events come in that set's order, which the facade rebuilds
    from the keys in the order the core added them. vLLM's own BlockPool
    evicts such a block here, and the facade's events for the core's
    removal tuples must list the same hashes in the same order."""
    import os

    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    from hybridcache.events import EventBuilder

    hashes = [os.urandom(32) for _ in range(num_extra + 1)]
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=4, enable_kv_cache_events=True)
    block = pool.blocks[1]
    for i, h in enumerate(hashes):
        pool._insert_block_hash(make_block_hash_with_group_id(h, 1), block, num_tokens=4 * (i + 1))
    pool._maybe_evict_cached_block(block)
    theirs = [(e.block_hashes, e.group_idx) for e in pool.take_events()]
    raw = [("removed", hashes[0], 1), ("removed_set", [(h, 1) for h in hashes[1:]])]
    builder = EventBuilder([("full_attention", None), ("full_attention", None)], release="0.33.0")
    ours = [(e.block_hashes, e.group_idx) for e in builder.build(raw, None)]
    assert ours == theirs
