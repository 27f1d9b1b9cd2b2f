"""Never crash, never corrupt, part 2 (issue 15): each class of bad input
that used to abort the process or corrupt the pool now raises a clear
ValueError / TypeError naming the problem, with the manager's state as it
was, or behaves as vLLM does where vLLM is sound."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest
from test_bad_input import BS, MAX_LEN, World, assert_rejected, assert_still_works, config, make, req

from hybridcache import KVCacheBlocks, KVCacheManager, Request
from hybridcache.config import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec, SlidingWindowSpec


@pytest.fixture
def w() -> World:
    return World()


def hybrid(num_blocks: int = 40) -> KVCacheManager:
    groups = [
        KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=BS)),
        KVCacheGroupSpec(["swa"], SlidingWindowSpec(block_size=BS, sliding_window=8)),
        KVCacheGroupSpec(["m"], MambaSpec(block_size=BS, mamba_cache_mode="align", num_speculative_blocks=2)),
    ]
    return KVCacheManager(KVCacheConfig(num_blocks, [], groups), MAX_LEN, BS, BS)


# ---------------------------------------------------------------------------
# 1. counts that would size tables beyond max_model_len (process abort)


def test_huge_num_new_tokens_on_a_hybrid_manager_is_refused_in_a_subprocess() -> None:
    """It used to end the process (signal 6, a 250 GB allocation)."""
    code = textwrap.dedent(
        f"""
        from test_admission_checks import hybrid
        from hybridcache import Request
        m = hybrid()
        try:
            m.allocate_slots(Request("r", list(range(10)), {BS}), 10**12)
        except ValueError as e:
            assert "num_new_tokens" in str(e) and "max_model_len" in str(e), e
            print("refused")
        """
    )
    here = str(__import__("pathlib").Path(__file__).parent)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=here, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "refused", (p.returncode, p.stdout, p.stderr[-2000:])


@pytest.mark.parametrize("name", ["num_new_tokens", "request.num_computed_tokens"])
def test_counts_beyond_max_model_len(name: str) -> None:
    m = hybrid()
    r = Request("r", list(range(10)), BS)
    before = m.request_ids()
    with pytest.raises(ValueError, match=name.split(".")[-1]):
        if name == "num_new_tokens":
            m.allocate_slots(r, MAX_LEN + 1)
        else:
            r.num_computed_tokens = 10**12
            m.allocate_slots(r, 1, num_external_computed_tokens=2)
    assert m.request_ids() == before
    m.check_invariants()


def test_lookahead_is_clamped_as_in_vllm() -> None:
    """vLLM clamps lookahead with everything else to max_model_len before it
    sizes anything: a huge one is sound there, and here."""
    m = make(40)
    out = m.allocate_slots(req("x", range(10)), 10, num_lookahead_tokens=10**12)
    assert len(out.get_block_ids()[0]) == MAX_LEN // BS


# ---------------------------------------------------------------------------
# 2. a request longer than max_model_len (vLLM: IndexError while caching)


def test_prompt_longer_than_max_model_len(w: World) -> None:
    long = req("long", range(MAX_LEN + 2))
    assert_rejected(w.m, lambda: w.m.allocate_slots(long, MAX_LEN + 2), ValueError, "max_model_len", "num_tokens")
    assert_still_works(w)


# ---------------------------------------------------------------------------
# 3. computed blocks that are not this request's cache hits


def test_stale_block_freed_and_reused(w: World) -> None:
    # f's blocks wait in the free queue, cached; take one by allocating.
    stale = w.m.block_pool.free_block_queue.get_all_free_blocks()[0].block_id
    w.m.allocate_slots(req("taker", range(500, 540)), 40)
    blocks = KVCacheBlocks(([1, stale],), w.m._native)
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.b, 3, 8, blocks), ValueError, f"block {stale}", "position 1")


def test_another_live_requests_block(w: World) -> None:
    blocks = KVCacheBlocks(([1, 3],), w.m._native)  # 3: a's third block, not cached
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.b, 3, 8, blocks), ValueError, "block 3")
    other = req("o", range(200, 212))
    w.m.allocate_slots(other, 12)
    theirs = w.m.get_block_ids("o")[0][:2]  # cached, under other hashes
    blocks = KVCacheBlocks((theirs,), w.m._native)
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.b, 3, 8, blocks), ValueError, f"block {theirs[0]}", "another hash")


def test_null_block(w: World) -> None:
    blocks = KVCacheBlocks(([0, 2],), w.m._native)
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.b, 3, 8, blocks), ValueError, "block 0", "null block")
    assert_still_works(w)


@pytest.mark.parametrize("tokens", [4, 12, 6, 7])
def test_num_new_computed_tokens_against_the_blocks(w: World, tokens: int) -> None:
    """Smaller, larger or not block-aligned against the two hit blocks."""
    assert_rejected(
        w.m, lambda: w.m.allocate_slots(w.b, 3, tokens, w.hit_blocks), ValueError, "num_new_computed_tokens"
    )
    assert_still_works(w)


def test_computed_tokens_without_blocks(w: World) -> None:
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.b, 3, 8), ValueError, "num_new_computed_tokens", "no blocks")
    assert_still_works(w)


def test_real_hits_still_admit_on_a_hybrid_manager() -> None:
    m = hybrid()
    a = Request("a", list(range(20)), BS)
    m.allocate_slots(a, 20)
    m.free(a)
    m.new_step_starts()  # Mamba serves no hit from blocks cached this step
    b = Request("b", list(range(20)) + [7], BS)
    blocks, hit = m.get_computed_blocks(b)
    assert hit > 0
    assert m.allocate_slots(b, b.num_tokens - hit, hit, blocks) is not None
    m.check_invariants()


# ---------------------------------------------------------------------------
# 4. external computed tokens past the request


@pytest.mark.parametrize("with_hit", [False, True])
def test_external_tokens_past_the_prompt(w: World, with_hit: bool) -> None:
    hit, blocks = (w.hit, w.hit_blocks) if with_hit else (0, None)
    ext = w.b.num_tokens - hit + 1
    assert_rejected(
        w.m,
        lambda: w.m.allocate_slots(w.b, 1, hit, blocks, num_external_computed_tokens=ext),
        ValueError,
        "num_external_computed_tokens",
        "past the request",
    )
    assert_still_works(w)


# ---------------------------------------------------------------------------
# 5. something that is not a request


@pytest.mark.parametrize("bad", [None, "a", object()])
@pytest.mark.parametrize("op", ["allocate_slots", "class allocate_slots", "get_computed_blocks", "free", "batch"])
def test_not_a_request(w: World, bad: Any, op: str) -> None:
    call = {
        "allocate_slots": lambda: w.m.allocate_slots(bad, 1),
        "class allocate_slots": lambda: KVCacheManager.allocate_slots(w.m, bad, 1),
        "get_computed_blocks": lambda: w.m.get_computed_blocks(bad),
        "free": lambda: w.m.free(bad),
        "batch": lambda: w.m.allocate_decode_batch([w.a, bad], [1, 1]),
    }[op]
    assert_rejected(w.m, call, TypeError, "request must be a vLLM Request", type(bad).__name__)


# ---------------------------------------------------------------------------
# 6. allocate_decode_batch is all or nothing


def test_decode_batch_checks_everything_first() -> None:
    m = make(40)
    r0, r1 = req("r0", range(8)), req("r1", range(100, 108))
    for r in (r0, r1):
        m.allocate_slots(r, 8)
        r.num_computed_tokens = 8
        r.append_output_token_ids(1)
    bad = req("bad", range(MAX_LEN + 3))
    before = (m.get_block_ids("r0"), m.get_block_ids("r1"), m.free_queue())
    with pytest.raises(ValueError, match=r"requests\[2\].*max_model_len"):
        m.allocate_decode_batch([r0, r1, bad], [1, 1, 1])
    assert (m.get_block_ids("r0"), m.get_block_ids("r1"), m.free_queue()) == before
    with pytest.raises(ValueError, match="twice"):
        m.allocate_decode_batch([r0, r0], [1, 1])
    ok, _, ids = m.allocate_decode_batch([r0, r1], [1, 1])
    assert ok == [True, True] and len(ids) == 2
    m.check_invariants()


# ---------------------------------------------------------------------------
# 7. reads that create state


def test_common_prefix_of_an_unknown_id_makes_no_record_but_answers_as_vllm() -> None:
    m = make(40)
    a = req("a", range(12))
    m.allocate_slots(a, 12)
    assert m.get_num_common_prefix_blocks("a") == [3]
    ids = m.request_ids()
    assert m.get_num_common_prefix_blocks("ghost") == [0]
    assert m.request_ids() == ids and not m.has_request("ghost")
    with pytest.raises(KeyError):
        m.request_handle("ghost")
    # vLLM's defaultdict keeps an empty entry for "ghost": a shares nothing with it.
    assert m.get_num_common_prefix_blocks("a") == [0]
    m.free(req("ghost", range(3)))  # vLLM's free pops the entry
    assert m.get_num_common_prefix_blocks("a") == [3]


@pytest.mark.vllm("0.23.0")
def test_common_prefix_ghost_matches_vllm(vllm_available: bool, make_vllm_kv_cache_config: Any) -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager

    def answers(mgr: Any) -> list[list[int]]:
        out = []
        mgr.allocate_slots(req("a", range(12)), 12)
        out.append(list(mgr.get_num_common_prefix_blocks("a")))
        out.append(list(mgr.get_num_common_prefix_blocks("ghost")))
        out.append(list(mgr.get_num_common_prefix_blocks("a")))
        g = req("ghost", range(6))
        mgr.allocate_slots(g, 6)
        out.append(list(mgr.get_num_common_prefix_blocks("a")))
        mgr.free(g)
        out.append(list(mgr.get_num_common_prefix_blocks("a")))
        return out

    assert answers(make(40)) == answers(VllmManager(make_vllm_kv_cache_config(40, BS), MAX_LEN, BS, BS))


# ---------------------------------------------------------------------------
# 8. smaller holes


def test_adding_blocks_of_different_group_counts(w: World) -> None:
    with pytest.raises(ValueError, match="groups"):
        KVCacheBlocks(([1], [2]), w.m._native) + KVCacheBlocks(([1],), w.m._native)


@pytest.mark.parametrize("bad", ["xy", ("xy",), ([None],), ([1.5],)])
def test_create_kv_cache_blocks_with_non_ids(w: World, bad: Any) -> None:
    with pytest.raises(TypeError, match="block ids must be ints"):
        w.m.create_kv_cache_blocks(bad)


def test_decode_arrays_with_fewer_tokens_than_computed(w: World) -> None:
    h = w.m.request_handle("a")
    assert_rejected(
        w.m, lambda: w.m.allocate_decode_arrays([h], [1], [10], [9]), ValueError, "num_tokens[0]", "num_computed_tokens[0]"
    )


def test_mamba_plans_with_negative_counts() -> None:
    m = hybrid()
    r = Request("r", list(range(10)), BS)
    m.allocate_slots(r, 10)
    with pytest.raises(ValueError, match=r"num_accepted\[0\] must be >= 0"):
        m.mamba_pre_copy_plan(["r"], [-1])
    with pytest.raises(ValueError, match=r"num_draft\[0\] must be >= 0"):
        m.mamba_post_select_plan(["r"], [-1])
    with pytest.raises(ValueError, match="num_draft"):
        m.mamba_post_select_plan(["r"], [2**64])
    with pytest.raises(TypeError, match="num_accepted"):
        m.mamba_pre_copy_plan(["r"], ["1"])


def test_zero_max_num_batched_tokens() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        KVCacheManager(config(), MAX_LEN, BS, BS, max_num_batched_tokens=0)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda m: m.remove_skipped_blocks("a", 2**64), "total_computed_tokens"),
        (lambda m: m.ref_cnt(2**64), "block id"),
        (lambda m: m.allocate_decode_batch([], [], 2**64), "num_lookahead_tokens"),
        (lambda m: m.coordinator.get_num_blocks_to_allocate("a", 2**64, [[]], 0, 0, 0), "num_tokens"),
        (lambda m: m.block_pool.get_cached_block(b"x", [-1]), "kv_cache_group_ids"),
        (lambda m: m.get_blocks("a").get_block_ids(group_ids=[-1]), "group_ids"),
    ],
)
def test_out_of_range_ints_name_the_argument(w: World, call: Any, name: str) -> None:
    """No bare OverflowError from the argument conversion."""
    assert_rejected(w.m, lambda: call(w.m), ValueError, name)


@pytest.mark.parametrize("num_blocks", [2**27 + 1, 2**31, 2**32 - 1])
def test_num_blocks_no_pool_can_hold(num_blocks: int) -> None:
    """The pool's bookkeeping is sized from num_blocks: a count no GPU holds
    used to abort the process (allocation failure) instead of raising."""
    with pytest.raises(ValueError, match="num_blocks"):
        KVCacheManager(config(num_blocks), MAX_LEN, BS, BS)


def test_other_hashes_under_a_live_requests_id(w: World) -> None:
    """A different request under a's id (a shorter, other hash list) would
    leave a's cached blocks cached under hashes a no longer has: a second
    live request with a held id is refused."""
    impostor = req("a", range(300, 305))
    assert_rejected(w.m, lambda: w.m.get_computed_blocks(impostor), ValueError, '"a"', "another live request")
    assert_still_works(w)
