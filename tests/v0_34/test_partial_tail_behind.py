"""A Mamba "align" partial tail cached behind the request, vLLM 0.34.0's
`KVCacheManager` against hybridcache's 0.34.0 facade.

With partial hash hits (a Mamba block of 8 tokens over hash blocks of 4,
prefix caching on), `cache_blocks(request, n)` at the prompt's partial-tail
boundary (`n` = 4 for an 8-token prompt) keys the Mamba block that holds
`n` as the request's own partial tail and records a copy-on-write for the
next allocation. Sent after the request has already computed past that
block (here: the prompt, one decode, then `cache_blocks(request, 4)`), the
next `allocate_slots` first frees the block (`remove_skipped_blocks`: Mamba
keeps only the running state's block) and then copies from it: vLLM 0.34.0
(and 0.33.0, same code) raises an AssertionError in
`MambaManager.allocate_new_blocks` (`req_blocks[block_idx] is source_block`).

vLLM's scheduler does not send this sequence: it calls `cache_blocks` with
the request's processed tokens (`num_computed_tokens -
num_in_flight_tokens` after outputs, the loaded tokens after a KV load),
which never fall behind a block the request has computed past, and its
Mamba chunking ends a prefill chunk at the partial-tail boundary
(`_mamba_block_aligned_split`) so the boundary is keyed while its block is
the running one. The call is legal at the manager's API only: it claims the
state after 4 tokens lives in a block that holds the state after 8 (both
managers then serve that block as a 4-token hit).

hybridcache keys the block as vLLM does, and its allocation drops the
redirect whose block the skip has just freed (there is no state left to
copy), so its pool stays consistent.
"""

from __future__ import annotations

from typing import Any

import pytest

from hybridcache_dev import oracle

pytestmark = pytest.mark.vllm("0.34.0")
oracle.module_needs_vllm("0.34.0")

from hybridcache_dev.fuzz_setup import Group, Setup  # noqa: E402
from hybridcache_dev.release_api import release  # noqa: E402

NUM_BLOCKS = 20
PROMPT = list(range(100, 108))  # 8 tokens: the partial-tail boundary is 4 (hash block 1 of Mamba block 0)
SETUP = Setup(mix="test", caching=True, groups=(Group("full", 4), Group("mamba", 8, mode="align")),
              scheduler_block_size=8, hash_block_size=4, num_blocks=NUM_BLOCKS, use_eagle=False, events=True,
              log_stats=False, max_model_len=1024, release="0.34.0")


def _managers() -> tuple[Any, Any]:
    """Stock vLLM 0.34.0's manager and hybridcache's facade, same setup."""
    api = release("0.34.0")
    ours = api.build_facade(SETUP)
    assert "KVCacheManager034" in [c.__name__ for c in type(ours).__mro__]
    return api.build_reference(SETUP), ours


def _behind(m: Any) -> Any:
    """The prompt computed, one decode, then the partial tail cached behind
    the request; the request, ready for its next decode."""
    r = release("0.34.0").make_request(SETUP, "a", PROMPT)
    assert m.allocate_slots(r, len(PROMPT)) is not None
    r.num_computed_tokens = len(PROMPT)
    r.append_output_token_ids([7])
    m.cache_blocks(r, 8)  # the scheduler's own call after the output (Mamba, prefix caching)
    assert m.allocate_slots(r, 1) is not None
    r.num_computed_tokens = 9
    r.append_output_token_ids([8])
    m.cache_blocks(r, 9)
    m.cache_blocks(r, 4)  # behind the request: Mamba block 0 holds the state after 8 tokens
    return r


def test_both_managers_agree_up_to_the_allocation() -> None:
    ref, ours = _managers()
    _behind(ref), _behind(ours)
    assert ours.get_block_ids("a") == ref.get_block_ids("a") == ([1, 2, 4], [3, 5])
    assert ours.block_pool.get_num_free_blocks() == ref.block_pool.get_num_free_blocks()


def test_vllm_asserts_in_the_mamba_copy_on_write() -> None:
    ref, _ = _managers()
    r = _behind(ref)
    with pytest.raises(AssertionError) as e:
        ref.allocate_slots(r, 1)
    assert e.traceback[-1].name == "allocate_new_blocks"
    assert "is source_block" in str(e.traceback[-1].statement)


def test_hybridcache_stays_consistent() -> None:
    """The allocation vLLM asserts on: hybridcache's pool stays consistent
    (its invariants; no free block referenced; every block back in the free
    queue once the step's copies are given back and the request is freed)."""
    _, ours = _managers()
    r = _behind(ours)
    ours.allocate_slots(r, 1)
    r.num_computed_tokens = 10
    _consistent(ours, held=True)
    _, kept = ours.take_kv_cache_block_copies()
    ours.block_pool.free_blocks(kept)
    _consistent(ours, held=True)
    ours.free(r)
    _consistent(ours, held=False)
    assert ours.block_pool.get_num_free_blocks() == NUM_BLOCKS - 1  # all but the null block
    assert ours.reset_prefix_cache()


def _consistent(m: Any, held: bool) -> None:
    """The facade's invariants, and the free queue against the ref counts
    and request "a"'s table (`held`: the request is still allocated)."""
    m.check_invariants()
    free = {b.block_id for b in m.block_pool.free_block_queue.get_all_free_blocks()}
    table = {b for group in m.get_block_ids("a") for b in group} - {0} if held else set()
    assert not free & table, f"blocks in the request's table are free: {sorted(free & table)}"
    assert all(m.block_pool.blocks[b].ref_cnt == 0 for b in free)
    assert len(free) == m.block_pool.get_num_free_blocks()
