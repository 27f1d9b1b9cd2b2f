"""Bad input through the facade: a clear Python exception naming the problem
(ValueError / TypeError / KeyError / NotImplementedError, never a pyo3
PanicException nor the RuntimeError a caught panic becomes), and the manager's
state left exactly as it was."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hybridcache import (
    FullAttentionSpec,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    Request,
)

BS = 4
MAX_LEN = 64
LIVE = ["a", "b", "f"]  # every request id the fixture's manager may know


def config(num_blocks: Any = 12, block_size: Any = BS, groups: int = 1) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks,
        [],
        [KVCacheGroupSpec([f"layer{i}"], FullAttentionSpec(block_size=block_size)) for i in range(groups)],
    )


def make(num_blocks: int = 12, **kw: Any) -> KVCacheManager:
    return KVCacheManager(config(num_blocks), MAX_LEN, BS, BS, **kw)


def req(rid: str, tokens: Any) -> Request:
    return Request(rid, list(tokens), BS)


def snapshot(m: KVCacheManager) -> dict[str, Any]:
    bp = m.block_pool
    return {
        "num_free": bp.get_num_free_blocks(),
        "free_queue": [b.block_id for b in bp.free_block_queue.get_all_free_blocks()],
        "usage": m.usage,
        "block_ids": {r: m.get_block_ids(r) for r in LIVE},
        "ref_cnt": [b.ref_cnt for b in bp.blocks],
        "hashes": [b.block_hash for b in bp.blocks],
    }


class World:
    """A manager with a running request `a` (3 blocks, 2 cached), a finished
    request `f` whose cached blocks wait in the free queue, and a waiting
    request `b` that shares a's first two blocks."""

    def __init__(self) -> None:
        self.m = make()
        self.other = make()
        self.a = req("a", range(10))
        self.m.allocate_slots(self.a, 10)
        self.a.num_computed_tokens = 10
        f = req("f", range(100, 113))
        self.m.allocate_slots(f, 13)
        self.m.free(f)
        self.b = req("b", [*range(8), 50, 51, 52])
        self.hit_blocks, self.hit = self.m.get_computed_blocks(self.b)
        assert self.hit == 8 and self.hit_blocks.get_block_ids() == ([1, 2],)
        self.m.take_new_block_ids()
        self.m.check_invariants()


@pytest.fixture
def w() -> World:
    return World()


def assert_rejected(
    m: KVCacheManager, call: Callable[[], Any], exc: type[Exception], *words: str
) -> Exception:
    """`call` raises `exc` whose message contains every one of `words`, and
    leaves the manager's state as it was."""
    before = snapshot(m)
    with pytest.raises(exc) as info:
        call()
    e = info.value
    assert type(e).__name__ != "PanicException"
    assert not isinstance(e, RuntimeError), f"looks like a caught panic: {e}"
    msg = str(e)
    for word in words:
        assert word in msg, f"{word!r} not in {msg!r}"
    assert snapshot(m) == before
    m.check_invariants()
    return e


def assert_still_works(w: World) -> None:
    """The waiting request can still be admitted as if nothing happened."""
    m, b = w.m, w.b
    m.take_new_block_ids()
    blocks, hit = m.get_computed_blocks(b)
    assert hit == 8 and blocks.get_block_ids() == ([1, 2],)
    out = m.allocate_slots(b, b.num_tokens - hit, hit, blocks)
    assert out is not None and m.get_block_ids("b")[0][:2] == [1, 2]
    assert m.take_new_block_ids() == out.get_block_ids()[0]
    m.check_invariants()


# ---------------------------------------------------------------------------
# allocate_slots counts


def test_zero_new_tokens_without_external_tokens(w: World) -> None:
    assert_rejected(
        w.m,
        lambda: w.m.allocate_slots(w.b, 0, w.hit, w.hit_blocks),
        ValueError,
        "num_new_tokens must be greater than 0",
    )
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.a, 0), ValueError, "num_new_tokens")
    assert_still_works(w)


@pytest.mark.vllm("0.23.0")
def test_zero_new_tokens_message_matches_vllm(vllm_available: bool, make_vllm_kv_cache_config: Any) -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager

    v = VllmManager(make_vllm_kv_cache_config(12, BS), MAX_LEN, BS, BS)
    with pytest.raises(ValueError) as theirs:
        v.allocate_slots(req("x", range(5)), 0)
    with pytest.raises(ValueError) as ours:
        make().allocate_slots(req("x", range(5)), 0)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_new_tokens": -1}, "num_new_tokens"),
        ({"num_new_computed_tokens": -4}, "num_new_computed_tokens"),
        ({"num_lookahead_tokens": -1}, "num_lookahead_tokens"),
        ({"num_external_computed_tokens": -4}, "num_external_computed_tokens"),
        ({"num_encoder_tokens": -1}, "num_encoder_tokens"),
        ({"reserved_blocks": -1}, "reserved_blocks"),
    ],
)
def test_negative_counts(w: World, kwargs: dict[str, int], name: str) -> None:
    args = {"num_new_tokens": 3, **kwargs}
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.b, **args), ValueError, name, ">= 0")
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.a, **args), ValueError, name, ">= 0")
    assert_still_works(w)


def test_negative_num_computed_tokens(w: World) -> None:
    w.a.num_computed_tokens = -1
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.a, 1), ValueError, "num_computed_tokens", "-1")
    w.a.num_computed_tokens = 10
    assert_rejected(w.m, lambda: w.m.cache_blocks(w.a, -1), ValueError, "num_computed_tokens", "-1")
    assert_rejected(
        w.m, lambda: w.m.remove_skipped_blocks("a", -1), ValueError, "total_computed_tokens", "-1"
    )
    assert_still_works(w)


@pytest.mark.parametrize("bad", ["3", 3.0, None])
def test_non_int_counts(w: World, bad: Any) -> None:
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.b, bad), TypeError, "num_new_tokens")
    if bad is not None:  # None for an optional count means "left at its default"
        assert_rejected(
            w.m, lambda: w.m.allocate_slots(w.b, 3, num_lookahead_tokens=bad), TypeError, "num_lookahead_tokens"
        )
    assert_still_works(w)


@pytest.mark.parametrize("name", ["num_new_tokens", "num_lookahead_tokens", "reserved_blocks"])
def test_counts_beyond_int64(w: World, name: str) -> None:
    """BUG: ints that do not fit an i64 fail in pyo3's argument conversion
    with a bare OverflowError ("Python int too large to convert to C long")
    that does not name the argument (nor is it a ValueError)."""
    args = {"num_new_tokens": 3, name: 2**64}
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.b, **args), ValueError, name)


# ---------------------------------------------------------------------------
# new_computed_blocks


def test_new_computed_blocks_with_wrong_number_of_groups(w: World) -> None:
    two = KVCacheBlocks(([1, 2], [1, 2]), w.m._native)
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.b, 3, 8, two), ValueError, "2 groups", "1")
    none = KVCacheBlocks((), w.m._native)
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.b, 3, 8, none), ValueError, "0 groups")
    assert_still_works(w)


@pytest.mark.parametrize("bad_id", [12, 100, 2**32, 2**40])
def test_new_computed_blocks_with_out_of_range_ids(w: World, bad_id: int) -> None:
    blocks = KVCacheBlocks(([1, bad_id],), w.m._native)
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.b, 3, 8, blocks), ValueError, str(bad_id), "out of range")
    assert_still_works(w)


@pytest.mark.parametrize("bad_id", [-1, -(2**40)])
def test_new_computed_blocks_with_negative_id(w: World, bad_id: int) -> None:
    """BUG: the binding converts block ids to u32 before checking them, so a
    negative id (or one >= 2**32) surfaces as a bare OverflowError ("out of
    range integral type conversion attempted") naming neither the argument
    nor the id."""
    blocks = KVCacheBlocks(([1, bad_id],), w.m._native)
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.b, 3, 8, blocks), ValueError, str(bad_id))
    assert_still_works(w)


def test_new_computed_blocks_from_another_manager(w: World) -> None:
    ob = req("ob", range(8))
    w.other.allocate_slots(ob, 8)
    w.other.free(ob)
    foreign, hit = w.other.get_computed_blocks(req("b2", [*range(8), 1]))
    assert hit == 8
    assert_rejected(
        w.m, lambda: w.m.allocate_slots(w.b, 3, 8, foreign), ValueError, "another KVCacheManager"
    )
    assert_still_works(w)


def test_new_computed_blocks_given_to_a_running_request(w: World) -> None:
    blocks = KVCacheBlocks(([4],), w.m._native)
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.a, 1, 4, blocks), ValueError, "running request")
    # Its own blocks again, too.
    own = w.m.get_blocks("a")
    assert_rejected(w.m, lambda: w.m.allocate_slots(w.a, 1, 12, own), ValueError, "running request")
    assert_still_works(w)


def test_new_computed_blocks_of_wrong_type(w: World) -> None:
    assert_rejected(
        w.m, lambda: w.m.allocate_slots(w.b, 3, 8, ([1, 2],)), TypeError, "KVCacheBlocks", "tuple"
    )
    assert_still_works(w)


# ---------------------------------------------------------------------------
# block hashes


@pytest.mark.parametrize(
    "hashes, type_name",
    [
        (["x", "y"], "str"),
        ([1, 2], "int"),
        ([None, None], "NoneType"),
        ("KEEP_FIRST", "str"),  # a good first hash followed by a str
    ],
)
@pytest.mark.parametrize("op", ["get_computed_blocks", "allocate_slots", "cache_blocks"])
def test_block_hashes_that_are_not_bytes(w: World, hashes: Any, type_name: str, op: str) -> None:
    r = req("h", range(10))
    if op == "cache_blocks":
        # Allocated before any hash is known; the bad hashes come with caching.
        good, r.block_hashes = r.block_hashes, []
        w.m.allocate_slots(r, 10, delay_cache_blocks=True)
        r.block_hashes = good
    r.block_hashes = [r.block_hashes[0], "bad"] if hashes == "KEEP_FIRST" else list(hashes)
    call = {
        "get_computed_blocks": lambda: w.m.get_computed_blocks(r),
        "allocate_slots": lambda: w.m.allocate_slots(r, 10),
        "cache_blocks": lambda: w.m.cache_blocks(r, 8),
    }[op]
    e = assert_rejected(w.m, call, TypeError, type_name)
    assert "hash" in str(e)
    assert_still_works(w)


def test_block_hashes_that_are_lists_of_ints(w: World) -> None:
    """BUG: pyo3 converts any sequence of small ints to Vec<u8>, so a list of
    token ids passed as `block_hashes` is silently taken as hashes (and
    cached) instead of being rejected like str / int elements are."""
    r = req("h", range(10))
    r.block_hashes = [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert_rejected(w.m, lambda: w.m.allocate_slots(r, 10), TypeError, "bytes")


def test_caching_beyond_known_hashes(w: World) -> None:
    r = req("h", range(10))
    r.block_hashes = r.block_hashes[:1]  # 2 full blocks, 1 hash
    assert_rejected(w.m, lambda: w.m.allocate_slots(r, 10), ValueError, "1 block hashes", "needs 2")
    # Allocated without caching, then cached with too few hashes.
    r2 = req("h2", range(10))
    hashes = r2.block_hashes
    r2.block_hashes = []
    w.m.allocate_slots(r2, 10, delay_cache_blocks=True)
    assert_rejected(w.m, lambda: w.m.cache_blocks(r2, 8), ValueError, "0 block hashes", "needs 2")
    r2.block_hashes = hashes
    w.m.cache_blocks(r2, 8)
    assert [w.m.block_pool.blocks[i].block_hash is not None for i in w.m.get_block_ids("h2")[0]] == [True, True, False]
    w.m.free(r2)
    w.m.free(r)
    assert_still_works(w)


def test_caching_beyond_allocated_blocks(w: World) -> None:
    assert_rejected(w.m, lambda: w.m.cache_blocks(w.a, 13), ValueError, '"a"', "needs 3")
    assert_rejected(w.m, lambda: w.m.cache_blocks(w.a, 20), ValueError, '"a"', "20")
    assert_rejected(w.m, lambda: w.m.cache_blocks(req("nobody", range(8)), 8), ValueError, "nobody")
    assert_still_works(w)


# ---------------------------------------------------------------------------
# evict_blocks


@pytest.mark.parametrize("ids", [[12], [100], [-1], [1, 4, 12], [4, -5]])
def test_evict_blocks_with_bad_ids(w: World, ids: list[int]) -> None:
    bad = next(i for i in ids if not 0 <= i < 12)
    # All-or-nothing: the valid ids in the same call are not evicted either.
    assert_rejected(w.m, lambda: w.m.evict_blocks(ids), ValueError, f"block id {bad}", "out of range")
    assert_still_works(w)


@pytest.mark.parametrize("ids", [["1"], [None], [1.0]])
def test_evict_blocks_with_non_int_ids(w: World, ids: list[Any]) -> None:
    assert_rejected(w.m, lambda: w.m.evict_blocks(ids), TypeError, "block_ids")
    assert_still_works(w)


# ---------------------------------------------------------------------------
# constructor


@pytest.mark.parametrize("num_blocks", [0, -3, 1.5, "3", True, None])
def test_bad_num_blocks(num_blocks: Any) -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        KVCacheManager(config(num_blocks), MAX_LEN, BS, BS)


@pytest.mark.parametrize("block_size", [0, -4, 2.0, "4", None])
def test_bad_block_size(block_size: Any) -> None:
    with pytest.raises(ValueError, match="block_size"):
        KVCacheManager(config(12, block_size), MAX_LEN, BS, BS)


@pytest.mark.parametrize(
    "args, name",
    [
        ((0, BS, BS), "max_model_len"),
        ((MAX_LEN, 0, BS), "scheduler_block_size"),
        ((MAX_LEN, BS, 0), "hash_block_size"),
        ((MAX_LEN, BS, "4"), "hash_block_size"),
        ((MAX_LEN, 6, BS), "scheduler_block_size"),
    ],
)
def test_bad_sizes(args: tuple[Any, ...], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        KVCacheManager(config(), *args)


@pytest.mark.parametrize("value", [-1, 0, "64", 64.0, True])
def test_bad_max_num_batched_tokens(value: Any) -> None:
    # The rule every count of the constructor follows: a positive int.
    with pytest.raises(ValueError, match=f"max_num_batched_tokens must be a positive int, got {value!r}"):
        KVCacheManager(config(), MAX_LEN, BS, BS, max_num_batched_tokens=value)


def test_hash_block_size_must_equal_block_size_with_caching() -> None:
    with pytest.raises(ValueError, match="hash_block_size"):
        KVCacheManager(config(12, 8), MAX_LEN, 8, 4)
    # Without prefix caching the hash block size is not used: accepted, as in vLLM.
    m = KVCacheManager(config(12, 8), MAX_LEN, 8, 4, enable_caching=False)
    assert m.allocate_slots(req("x", range(9)), 9).get_block_ids() == ([1, 2],)


@pytest.mark.vllm("0.23.0")
def test_hash_block_size_mismatch_is_rejected_by_vllm_too(
    vllm_available: bool, make_vllm_kv_cache_config: Any
) -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager

    with pytest.raises(AssertionError, match="hash_block_size"):
        VllmManager(make_vllm_kv_cache_config(12, 8), MAX_LEN, 8, 4)
    VllmManager(make_vllm_kv_cache_config(12, 8), MAX_LEN, 8, 4, enable_caching=False)


def test_bad_kv_cache_config_objects() -> None:
    with pytest.raises(TypeError, match="kv_cache_groups"):
        KVCacheManager(object(), MAX_LEN, BS, BS)
    with pytest.raises(TypeError, match="kv_cache_spec"):
        KVCacheManager(KVCacheConfig(12, [], [object()]), MAX_LEN, BS, BS)


# ---------------------------------------------------------------------------
# KVCacheBlocks


def test_get_unhashed_block_ids_with_two_groups() -> None:
    m = KVCacheManager(config(12, BS, groups=2), MAX_LEN, BS, BS, enable_caching=False)
    out = m.allocate_slots(req("x", range(9)), 9)
    assert out.get_block_ids() == ([1, 2, 3], [4, 5, 6])
    with pytest.raises(ValueError, match="one KV cache group"):
        out.get_unhashed_block_ids()
    assert out.get_unhashed_block_ids_all_groups() == [[1, 2, 3], [4, 5, 6]]


def test_rejected_calls_leave_no_hidden_request_state(w: World) -> None:
    """BUG: allocate_slots stores the request's hashes in the core before the
    core validates the call, so a call the core rejects leaves an entry for a
    request it never admitted (NativeManager.num_requests grows, and
    num_known_hashes disagrees with the facade's record of what it sent).
    lib.rs says "Hashes are stored only once the call is known to be valid"."""
    native = w.m._native
    n = req("n", range(10))  # never seen by the manager
    before = (native.num_requests, native.num_known_hashes("n"))
    with pytest.raises(ValueError, match="groups"):
        w.m.allocate_slots(n, 3, 8, KVCacheBlocks(([1, 2], [1, 2]), native))
    with pytest.raises(ValueError, match="greater than 0"):
        w.m.allocate_slots(n, 0)
    assert before[1] == 0
    assert (native.num_requests, native.num_known_hashes("n")) == before
