"""vLLM 0.33.0's partial hash hits with copy-on-write, hybridcache's 0.33.0
facade against vLLM 0.33.0's own manager on the same calls: a Mamba align
block of 64 tokens beside full attention of 32 over hash blocks of 16, so
hits land on hash blocks and may end inside a block of either group. The
request that hits such a tail gets a private copy of it (one more block, a
`KVCacheBlockCopy`, both ends retained until the scheduler frees them);
the request that cached its own prompt boundary inside its running Mamba
block (a producer) copies it on its next allocation, the cache entry moving
to the copy; `finalize_partial_tail_offloads` hands a finishing producer's
boundary block to a connector."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.vllm("0.33.0")

vllm = pytest.importorskip("vllm", reason="needs vLLM 0.33.0 (the 0.33 venv)")
from hybridcache_dev.oracle import module_needs_vllm  # noqa: E402

module_needs_vllm("0.33.0")

from hybridcache_dev.fuzz_setup import Group, Setup  # noqa: E402
from hybridcache_dev.pair import ManagerPair as Pair  # noqa: E402


def _setup(full: int = 32, mamba: int = 64, hbs: int = 16, num_blocks: int = 30) -> Setup:
    return Setup(mix="full_mamba_wide", caching=True,
                 groups=(Group("full", full), Group("mamba", mamba, mode="align")),
                 scheduler_block_size=max(full, mamba), hash_block_size=hbs, num_blocks=num_blocks,
                 use_eagle=False, events=True, log_stats=False, release="0.33.0")


PROMPT = list(range(1000, 1050))  # 50 tokens: the last reusable hash boundary is 48


def test_layout_turns_partial_hash_hits_on_only_where_vllm_does() -> None:
    assert Pair(_setup()).ours.coordinator.enable_partial_hash_hits is True
    same = Pair(_setup(full=16, mamba=16, hbs=16))
    assert same.ours.coordinator.enable_partial_hash_hits is same.ref.coordinator.enable_partial_hash_hits
    assert same.ours.coordinator.enable_partial_hash_hits is False


def test_hit_ending_inside_blocks_copies_both_tails() -> None:
    """A's first chunk (48 tokens) keys its prompt boundary inside full
    block 1 (a partial tail) and inside its Mamba block 0 (a producer
    tail). B, the same prompt, hits 48 tokens: both groups' last hit
    blocks are shared only up to 48, so B's allocation takes one more block
    per group and queues two copies; their ends stay held until freed."""
    p = Pair(_setup())
    p.request("a", PROMPT)
    p.admit("a", 48)
    p.events()
    # A state cached this step serves hits from the next one on.
    p.new_step()
    p.request("b", PROMPT)
    free_before = p.ours.block_pool.get_num_free_blocks()
    assert p.admit("b") == 48
    a_blocks = p.ref.get_blocks("a").get_block_ids()
    pairs = p.copies()
    assert len(pairs) == 2
    # Full attention copies A's second block, Mamba A's state block.
    assert pairs[0][0] == a_blocks[0][1] and pairs[1][0] == a_blocks[1][0]
    b_blocks = p.ours.get_blocks("b").get_block_ids()
    assert b_blocks[0][1] == pairs[0][1] and pairs[1][1] in b_blocks[1]
    # B took fresh blocks: its copies, the rest of its prompt, Mamba's
    # running state (vLLM's count, +1 per copy); nothing is left over.
    assert free_before - p.ours.block_pool.get_num_free_blocks() >= 2
    p.events()
    assert p.copies() == []


def test_producer_copies_its_own_tail_and_moves_the_key() -> None:
    """A's next allocation after caching its boundary inside its running
    Mamba block: the block stays in A's table (the worker's table is
    append-only), a fresh block takes the cache entry and the copy, and is
    offered to a KV connector as A's boundary state."""
    p = Pair(_setup())
    p.request("a", PROMPT)
    p.admit("a", 48)
    a_state = p.ref.get_blocks("a").get_block_ids()[1][0]
    p.step("a", 2)
    pairs = p.copies()
    assert len(pairs) == 1 and pairs[0][0] == a_state
    assert p.ours.get_blocks("a").get_block_ids()[1][0] == a_state
    offloads = p.both(lambda m, side: m.take_boundary_state_offloads())
    assert (1, pairs[0][1], 48) in offloads["a"]
    p.events()


def test_finalize_partial_tail_offloads_of_a_finished_producer() -> None:
    """A producer that finishes at its boundary (nothing forwarded past
    it) hands its table block over; a second call has nothing left."""
    p = Pair(_setup())
    p.request("a", PROMPT)
    p.admit("a", 48)
    a_state = p.ref.get_blocks("a").get_block_ids()[1][0]
    got = p.both(lambda m, side: m.finalize_partial_tail_offloads(p.req("a", side)))
    assert got == [(1, a_state, 48)]
    assert p.both(lambda m, side: m.finalize_partial_tail_offloads(p.req("a", side))) == []
    p.both(lambda m, side: m.free(p.req("a", side)))
    assert p.copies() == []


def test_dcp_turns_partial_hash_hits_on_for_a_mamba_block_as_wide_as_the_hash_block() -> None:
    """Under dcp 2 the full-attention block of 8 holds 16 tokens and the
    replicated Mamba block is 16, the hash block too: 0.33.0 turns partial
    hash hits on (dcp accepts equality), so cacheable tokens are not
    rounded to the scheduler block; hits and copies follow vLLM's."""
    import dataclasses

    s = dataclasses.replace(_setup(full=8, mamba=16, hbs=16), scheduler_block_size=16, dcp=2, pcp=1,
                            replicated=(1,))
    p = Pair(s)
    assert p.ref.coordinator.enable_partial_hash_hits is True
    assert p.ours.coordinator.enable_partial_hash_hits is True
    p.request("a", PROMPT)
    p.admit("a", 48)
    p.step("a", 2)
    p.new_step()
    p.copies()
    p.request("b", PROMPT)
    # The hit and every block, copy and event agree with vLLM's (compared).
    p.admit("b")
    p.copies()
    p.events()


def _reported(events: list[Any]) -> list[tuple[int, int]]:
    """(group, blocks) of each BlockStored a batch of events holds."""
    out = []
    for batch in events:
        for e in getattr(batch, "events", [batch]):
            if type(e).__name__ == "BlockStored":
                out.append((e.group_idx, len(e.block_hashes)))
    return out


def test_reused_hit_events_for_a_hit_inside_a_block_the_prompt_fills() -> None:
    """`kv_cache_report_mode="full"`: a hit ending inside a block whose
    prompt goes past it reports every hit block, as vLLM does."""
    p = Pair(_setup())
    p.request("a", PROMPT)
    p.admit("a", 48)
    p.new_step()
    p.events()
    p.request("b", PROMPT + list(range(50)))
    for r in p.reqs["b"]:
        r.kv_cache_report_mode = "full"
    assert p.admit("b", 8) == 48
    assert _reported(p.events())


def test_reused_hit_events_for_a_hit_inside_the_prompts_last_block_where_vllm_raises() -> None:
    """The same hit for a prompt that ends inside that block: vLLM 0.33.0
    indexes past the block's hashes (IndexError in
    `emit_cached_block_events`); hybridcache reports the hit blocks that
    have a block hash (full attention's first block) and returns the hit."""
    p = Pair(_setup())
    p.request("a", PROMPT)
    p.admit("a", 48)
    p.new_step()
    p.events()
    p.request("b", PROMPT)
    t_req, o_req = p.reqs["b"]
    for r in (t_req, o_req):
        r.kv_cache_report_mode = "full"
    with pytest.raises(IndexError):
        p.ref.get_computed_blocks(t_req)
    blocks, hit, _ = p.ours.get_computed_blocks(o_req)
    assert hit == 48 and [len(g) for g in blocks.get_block_ids()] == [2, 1]
    assert _reported(p.ours.take_events()) == [(0, 1)]
    p.ours.check_invariants()
