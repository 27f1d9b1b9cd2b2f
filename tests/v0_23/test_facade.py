"""Behaviour of the `hybridcache` facade, with hybridcache's own config and
request classes (no vLLM needed for most tests).

Where a behaviour is specified by vLLM 0.23.0, the test runs the very same
scenario on vLLM's own `KVCacheManager` and asserts equal traces (results and
full pool state after every operation); those tests are skipped when vLLM is
not installed. Every hybridcache operation in these scenarios is followed by
`check_invariants()`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Compares against vLLM 0.23.0 (tests/conftest.py: left to that release's venv elsewhere).
pytestmark = pytest.mark.vllm("0.23.0")

import hybridcache
from hybridcache import (
    FullAttentionSpec,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    Request,
)

BS = 4  # block size of every test manager
MAX_LEN = 64

# The field names of vLLM 0.23.0's KV events, in order.
VLLM_EVENT_FIELDS = {
    "BlockStored": [
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window",
    ],
    "BlockRemoved": ["block_hashes", "medium", "group_idx"],
    "AllBlocksCleared": [],
}
VLLM_STATS_FIELDS = [
    "reset",
    "requests",
    "queries",
    "hits",
    "preempted_requests",
    "preempted_queries",
    "preempted_hits",
]


# ---------------------------------------------------------------------------
# builders


def hc_config(num_blocks: int, block_size: int = BS, groups: int = 1) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec([f"layer{i}"], FullAttentionSpec(block_size=block_size))
            for i in range(groups)
        ],
    )


def make_hc(num_blocks: int = 16, groups: int = 1, **kw: Any) -> KVCacheManager:
    return KVCacheManager(hc_config(num_blocks, BS, groups), MAX_LEN, BS, BS, **kw)


def make_vllm(num_blocks: int = 16, groups: int = 1, **kw: Any) -> Any:
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec as VSpec
    from vllm.v1.kv_cache_interface import KVCacheConfig as VConfig
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec as VGroup

    cfg = VConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            VGroup(
                [f"layer{i}"],
                VSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32),
            )
            for i in range(groups)
        ],
    )
    return VllmManager(cfg, MAX_LEN, BS, BS, **kw)


def req(rid: str, tokens: Any) -> Request:
    return Request(rid, list(tokens), BS)


# ---------------------------------------------------------------------------
# observation


def event_fields(e: Any) -> list[str]:
    names = getattr(type(e), "__struct_fields__", None)  # vLLM's msgspec structs
    if names is None:
        names = [f.name for f in dataclasses.fields(e)]
    return list(names)


def norm_event(e: Any) -> tuple[str, dict[str, Any]]:
    return type(e).__name__, {n: getattr(e, n) for n in event_fields(e)}


def pool_state(m: Any, rids: list[str]) -> dict[str, Any]:
    """Everything observable about the pool, read through the vLLM API."""
    bp = m.block_pool
    return {
        "num_free": bp.get_num_free_blocks(),
        "free_queue": [b.block_id for b in bp.free_block_queue.get_all_free_blocks()],
        "usage": round(m.usage, 12),
        "ref_cnt": [b.ref_cnt for b in bp.blocks],
        "hashes": [b.block_hash for b in bp.blocks],
        "block_ids": {r: m.get_block_ids(r) for r in rids},
    }


class Trace:
    """Records each operation's (normalized) result and the pool state after it."""

    def __init__(self, m: Any) -> None:
        self.m = m
        self.rids: list[str] = []
        self.items: list[Any] = []

    def norm(self, x: Any) -> Any:
        m = self.m
        if x is m.empty_kv_cache_blocks:
            return "EMPTY"
        if x is None or isinstance(x, (int, float, bool, str)):
            return x
        if isinstance(x, tuple):
            return tuple(self.norm(v) for v in x)
        if isinstance(x, list):
            return [self.norm(v) for v in x]
        if hasattr(x, "get_block_ids"):
            return ("blocks", x.get_block_ids())
        return norm_event(x)

    def rec(self, label: str, result: Any = None) -> Any:
        if isinstance(self.m, KVCacheManager):
            self.m.check_invariants()
        self.items.append((label, self.norm(result), pool_state(self.m, self.rids)))
        return result

    # scheduler-like helpers -------------------------------------------------

    def admit(self, r: Request, num_new: int | None = None, **kw: Any) -> Any:
        """get_computed_blocks + allocate_slots of a waiting request."""
        if r.request_id not in self.rids:
            self.rids.append(r.request_id)
        blocks, hit = self.rec(f"gcb {r.request_id}", self.m.get_computed_blocks(r))
        n = r.num_tokens - hit if num_new is None else num_new
        out = self.rec(f"alloc {r.request_id}", self.m.allocate_slots(r, n, hit, blocks, **kw))
        if out is not None:
            r.num_computed_tokens = hit + n
        return out

    def decode(self, r: Request, token: int) -> Any:
        r.append_output_token_ids(token)
        out = self.rec(f"decode {r.request_id}", self.m.allocate_slots(r, 1))
        if out is not None:
            r.num_computed_tokens += 1
        return out

    def free(self, r: Request) -> None:
        self.m.free(r)
        self.rec(f"free {r.request_id}")


Scenario = Callable[[Trace], None]


def run_hc(scenario: Scenario, **kw: Any) -> Trace:
    t = Trace(make_hc(**kw))
    scenario(t)
    return t


def assert_same_as_vllm(scenario: Scenario, **kw: Any) -> Trace:
    """Runs `scenario` on both managers and asserts identical traces."""
    ours = run_hc(scenario, **kw)
    theirs = Trace(make_vllm(**kw))
    scenario(theirs)
    assert len(ours.items) == len(theirs.items)
    for a, b in zip(ours.items, theirs.items):
        assert a == b, f"diverged at {a[0]!r}"
    return ours


@pytest.fixture
def vllm(vllm_available: bool) -> bool:
    return vllm_available


# ---------------------------------------------------------------------------
# import hygiene


def _run_python(code: str) -> subprocess.CompletedProcess[str]:
    # The child imports the same hybridcache as this process (installed or not).
    pkg_parent = str(Path(hybridcache.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [pkg_parent, os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_import_loads_neither_torch_nor_vllm() -> None:
    r = _run_python(
        """
        import sys, json
        import hybridcache
        from hybridcache import KVCacheManager, KVCacheConfig, KVCacheGroupSpec, FullAttentionSpec, Request
        m = KVCacheManager(KVCacheConfig(8, [], [KVCacheGroupSpec(["l"], FullAttentionSpec(4))]), 64, 4, 4)
        m.allocate_slots(Request("a", range(9), 4), 9)
        bad = sorted(k for k in sys.modules if k.split(".")[0] in ("torch", "vllm", "numpy", "transformers"))
        print(json.dumps(bad))
        """
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


# ---------------------------------------------------------------------------
# KVCacheBlocks API


def test_kv_cache_blocks_views_and_ids() -> None:
    m = make_hc(num_blocks=10)
    a = req("a", range(10))
    blocks, hit = m.get_computed_blocks(a)
    assert hit == 0
    out = m.allocate_slots(a, 10, hit, blocks)
    assert isinstance(out, KVCacheBlocks)
    assert out.get_block_ids() == ([1, 2, 3],)
    assert out.get_block_ids(allow_none=True) == ([1, 2, 3],)
    views = out.blocks
    assert len(views) == 1
    assert [b.block_id for b in views[0]] == [1, 2, 3]
    assert [b.ref_cnt for b in views[0]] == [1, 1, 1]
    assert [b.is_null for b in views[0]] == [False, False, False]
    # Two full blocks were cached at allocation time; the partial one was not.
    h = [b.block_hash for b in views[0]]
    assert h[0] == a.block_hashes[0] + (0).to_bytes(4, "big")
    assert h[1] == a.block_hashes[1] + (0).to_bytes(4, "big")
    assert h[2] is None
    assert out.get_unhashed_block_ids() == [3]
    assert out.get_unhashed_block_ids_all_groups() == [[3]]
    # The views are live: the ref count follows the pool.
    m.free(a)
    assert [b.ref_cnt for b in views[0]] == [0, 0, 0]
    assert m.block_pool.null_block.is_null and m.block_pool.null_block.block_id == 0


def test_kv_cache_blocks_add_and_new_empty() -> None:
    m = make_hc(num_blocks=10)
    a = req("a", range(10))
    first = m.allocate_slots(a, 6)
    a.num_computed_tokens = 6
    second = m.allocate_slots(a, 4)
    assert first.get_block_ids() == ([1, 2],)
    assert second.get_block_ids() == ([3],)
    both = first + second
    assert both.get_block_ids() == ([1, 2, 3],)
    assert [b.ref_cnt for b in both.blocks[0]] == [1, 1, 1]
    assert both.get_block_ids() == m.get_block_ids("a") == m.get_blocks("a").get_block_ids()
    # Adding does not change the operands.
    assert first.get_block_ids() == ([1, 2],)
    empty = both.new_empty()
    assert empty.get_block_ids() == ([],)
    assert empty.get_block_ids(allow_none=True) is None
    assert empty.blocks == ([],) or empty.blocks == ((),)
    assert (empty + first).get_block_ids() == ([1, 2],)


def test_kv_cache_blocks_match_vllm(vllm: bool) -> None:
    """get_block_ids / get_unhashed_* / __add__ / new_empty against vLLM's own
    KVCacheBlocks over the same block ids (null block included)."""
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks as VBlocks

    def build(m: Any) -> list[Any]:
        a = req("a", range(10))
        b, n = m.get_computed_blocks(a)
        m.allocate_slots(a, 10, n, b)
        return [m.block_pool.blocks[i] for i in (0, 1, 2, 3, 5)]

    ours_m, theirs_m = make_hc(num_blocks=10), make_vllm(num_blocks=10)
    ours_b, theirs_b = build(ours_m), build(theirs_m)
    for ids in ([0, 1, 3], [2, 5], [], [0]):
        o = KVCacheBlocks((ids,), ours_m._native)
        t = VBlocks(([theirs_b[[0, 1, 2, 3, 5].index(i)] for i in ids],))
        assert o.get_block_ids() == t.get_block_ids()
        assert o.get_block_ids(allow_none=True) == t.get_block_ids(allow_none=True)
        assert o.get_unhashed_block_ids() == t.get_unhashed_block_ids()
        assert o.get_unhashed_block_ids_all_groups() == t.get_unhashed_block_ids_all_groups()
        assert (o + o).get_block_ids() == (t + t).get_block_ids()
        assert o.new_empty().get_block_ids(allow_none=True) == t.new_empty().get_block_ids(allow_none=True)
        assert [(v.block_id, v.ref_cnt, v.block_hash, v.is_null) for v in o.blocks[0]] == [
            (v.block_id, v.ref_cnt, v.block_hash, v.is_null) for v in t.blocks[0]
        ]


def test_two_groups_without_caching_match_vllm(vllm: bool) -> None:
    def sc(t: Trace) -> None:
        a, b = req("a", range(10)), req("b", range(20, 27))
        out = t.admit(a)
        t.rec("unhashed all groups", out.get_unhashed_block_ids_all_groups())
        t.rec("new ids", t.m.take_new_block_ids())
        t.admit(b)
        t.decode(a, 99)
        t.rec("common", t.m.get_num_common_prefix_blocks("a"))
        t.free(a)
        t.free(b)

    ours = assert_same_as_vllm(sc, num_blocks=12, groups=2, enable_caching=False)
    assert ours.items[1][1] == ("blocks", ([1, 2, 3], [4, 5, 6]))


# ---------------------------------------------------------------------------
# empty singleton, prefix hits


def test_no_hit_returns_the_empty_singleton() -> None:
    m = make_hc()
    a = req("a", range(10))
    blocks, hit = m.get_computed_blocks(a)
    assert blocks is m.empty_kv_cache_blocks and hit == 0
    assert m.empty_kv_cache_blocks.get_block_ids() == ([],)
    assert m.empty_kv_cache_blocks.get_block_ids(allow_none=True) is None
    # No new block needed: allocate_slots answers the singleton too.
    m.allocate_slots(a, 6)
    a.num_computed_tokens = 6
    assert m.allocate_slots(a, 1) is m.empty_kv_cache_blocks
    # Caching off, and requests that skip reading the cache, never hit.
    off = make_hc(enable_caching=False)
    assert off.get_computed_blocks(req("b", range(10)))[0] is off.empty_kv_cache_blocks
    m.cache_blocks(a, 4)
    skip = Request("c", range(10), BS, skip_reading_prefix_cache=True)
    assert m.get_computed_blocks(skip) == (m.empty_kv_cache_blocks, 0)
    assert m.get_computed_blocks(skip)[0] is m.empty_kv_cache_blocks


def test_prefix_hit_of_second_request() -> None:
    m = make_hc(num_blocks=10)
    a = req("a", range(10))
    m.allocate_slots(a, 10)
    a.num_computed_tokens = 10
    b = req("b", [*range(9), 99, 100])  # shares the first two blocks with a
    blocks, hit = m.get_computed_blocks(b)
    assert hit == 8
    assert blocks.get_block_ids() == ([1, 2],)
    assert [v.ref_cnt for v in blocks.blocks[0]] == [1, 1]  # not touched yet
    out = m.allocate_slots(b, b.num_tokens - hit, hit, blocks)
    assert out.get_block_ids() == ([4],)
    assert m.get_block_ids("b") == ([1, 2, 4],)
    assert [m.block_pool.blocks[i].ref_cnt for i in (1, 2, 3, 4)] == [2, 2, 1, 1]
    assert m.get_num_common_prefix_blocks("a") == [2]
    m.check_invariants()


def test_prefix_hits_match_vllm(vllm: bool) -> None:
    def sc(t: Trace) -> None:
        a = req("a", range(12))
        b = req("b", [*range(9), 50, 51])
        c = req("c", range(12))  # full hit: the last block is recomputed
        t.admit(a)
        t.admit(b)
        t.rec("common a", t.m.get_num_common_prefix_blocks("a"))
        t.admit(c)
        t.rec("common c", t.m.get_num_common_prefix_blocks("c"))
        t.decode(a, 7)
        t.free(a)
        d = req("d", [*range(8), 0, 0, 0, 0, 1])  # hits a's freed, cached blocks
        t.admit(d)
        t.free(b)
        t.free(c)
        t.free(d)

    ours = assert_same_as_vllm(sc, num_blocks=12)
    gcb_c = next(r for label, r, _ in ours.items if label == "gcb c")
    assert gcb_c == (("blocks", ([1, 2],)), 8)


# ---------------------------------------------------------------------------
# free queue, eviction, reset


def test_free_order_puts_tail_blocks_first() -> None:
    m = make_hc(num_blocks=10)
    a, b = req("a", range(10)), req("b", range(100, 107))
    m.allocate_slots(a, 10)
    m.allocate_slots(b, 7)
    queue = lambda: [v.block_id for v in m.block_pool.free_block_queue.get_all_free_blocks()]  # noqa: E731
    assert queue() == [6, 7, 8, 9]
    m.free(a)
    # Freed blocks go to the back in reverse order (tail evicted first).
    assert queue() == [6, 7, 8, 9, 3, 2, 1]
    m.free(b)
    assert queue() == [6, 7, 8, 9, 3, 2, 1, 5, 4]
    assert m.block_pool.free_block_queue.num_free_blocks == m.block_pool.get_num_free_blocks() == 9
    m.check_invariants()


def test_free_order_and_eviction_match_vllm(vllm: bool) -> None:
    def sc(t: Trace) -> None:
        rs = [req(f"r{i}", range(10 * i, 10 * i + 9)) for i in range(3)]
        for r in rs:
            t.admit(r)
        t.free(rs[1])
        t.free(rs[0])
        # Needs cached free blocks: evicts from the head of the free queue.
        t.admit(req("big", range(500, 520)))
        t.free(rs[2])
        t.rec("new ids", t.m.take_new_block_ids())

    assert_same_as_vllm(sc, num_blocks=12, enable_kv_cache_events=True)


def test_evict_blocks() -> None:
    m = make_hc(num_blocks=10)
    a = req("a", range(10))
    m.allocate_slots(a, 10)
    a.num_computed_tokens = 10
    b = req("b", range(100, 109))
    m.allocate_slots(b, 9)
    m.free(b)  # blocks 4, 5 cached and free, block 6 unhashed
    before_queue = m._native.free_queue()
    m.evict_blocks({1, 4, 6})  # in use + cached, free + cached, free + unhashed
    assert m.block_pool.blocks[1].block_hash is None
    assert m.block_pool.blocks[1].ref_cnt == 1  # still owned by a
    assert m.block_pool.blocks[4].block_hash is None
    assert m.block_pool.blocks[5].block_hash is not None
    assert m._native.free_queue() == before_queue  # eviction moves no block
    assert m.get_block_ids("a") == ([1, 2, 3],)
    # The evicted prefix no longer hits.
    assert m.get_computed_blocks(req("c", range(10)))[1] == 0
    assert m.get_computed_blocks(req("d", range(100, 109)))[1] == 0
    m.evict_blocks([])
    m.check_invariants()


def test_evict_blocks_matches_vllm(vllm: bool) -> None:
    def sc(t: Trace) -> None:
        a, b = req("a", range(10)), req("b", range(100, 113))
        t.admit(a)
        t.admit(b)
        t.free(b)
        t.m.evict_blocks({1, 5, 7})
        t.rec("evict")
        t.rec("events", t.m.take_events())
        t.admit(req("c", range(10)))
        t.admit(req("d", range(100, 113)))

    assert_same_as_vllm(sc, num_blocks=12, enable_kv_cache_events=True)


def test_reset_prefix_cache_refuses_while_blocks_in_use() -> None:
    m = make_hc(num_blocks=10, log_stats=True)
    a = req("a", range(10))
    m.allocate_slots(a, 10)
    hashes = [v.block_hash for v in m.block_pool.blocks]
    assert m.reset_prefix_cache() is False
    assert [v.block_hash for v in m.block_pool.blocks] == hashes
    assert m.make_prefix_cache_stats().reset is False
    m.free(a)
    assert m.reset_prefix_cache() is True
    assert all(v.block_hash is None for v in m.block_pool.blocks)
    assert m.make_prefix_cache_stats().reset is True
    assert m.get_computed_blocks(req("b", range(10)))[1] == 0
    m.check_invariants()


def test_reset_prefix_cache_matches_vllm(vllm: bool) -> None:
    def sc(t: Trace) -> None:
        a = req("a", range(10))
        t.admit(a)
        t.rec("reset in use", t.m.reset_prefix_cache())
        t.rec("events", t.m.take_events())
        t.free(a)
        t.rec("reset", t.m.reset_prefix_cache())
        t.rec("events", t.m.take_events())
        t.rec("stats", dataclasses.astuple(t.m.make_prefix_cache_stats()))
        t.admit(req("b", range(10)))

    assert_same_as_vllm(sc, num_blocks=10, enable_kv_cache_events=True, log_stats=True)


# ---------------------------------------------------------------------------
# running out of blocks


def _snapshot(m: KVCacheManager, rids: list[str]) -> dict[str, Any]:
    return pool_state(m, rids)


def test_out_of_blocks_returns_none_and_changes_nothing() -> None:
    m = make_hc(num_blocks=8)  # 7 usable
    a, b = req("a", range(10)), req("b", range(100, 110))
    m.allocate_slots(a, 10)
    a.num_computed_tokens = 10
    m.allocate_slots(b, 10)
    b.num_computed_tokens = 10
    m.free(b)  # b's cached blocks stay in the free queue
    c = req("c", [*range(100, 108), *range(200, 220)])  # hits b's 2 blocks, needs 7 blocks
    blocks, hit = m.get_computed_blocks(c)
    assert hit == 8
    rids = ["a", "b", "c"]
    before = _snapshot(m, rids)
    assert m.allocate_slots(c, c.num_tokens - hit, hit, blocks) is None
    assert _snapshot(m, rids) == before
    m.check_invariants()
    # A decode that needs a block it cannot get also fails cleanly.
    m2 = make_hc(num_blocks=4)
    d = req("d", range(12))
    m2.allocate_slots(d, 12)
    d.num_computed_tokens = 12
    d.append_output_token_ids(1)
    before = _snapshot(m2, ["d"])
    assert m2.allocate_slots(d, 1) is None
    assert _snapshot(m2, ["d"]) == before
    # ...as do the admission gates.
    e = req("e", range(40))
    before = _snapshot(m, rids + ["e"])
    assert m.allocate_slots(e, 4, full_sequence_must_fit=True) is None
    assert m.allocate_slots(e, 4, reserved_blocks=m.block_pool.get_num_free_blocks()) is None
    assert _snapshot(m, rids + ["e"]) == before
    m.check_invariants()


def test_out_of_blocks_matches_vllm(vllm: bool) -> None:
    def sc(t: Trace) -> None:
        a, b = req("a", range(10)), req("b", range(100, 110))
        t.admit(a)
        t.admit(b)
        t.free(b)
        t.admit(req("c", [*range(100, 108), *range(200, 220)]))
        t.admit(req("e", range(40)), num_new=4, full_sequence_must_fit=True)
        t.admit(req("f", range(300, 304)), reserved_blocks=3)
        t.admit(req("g", range(300, 304)), reserved_blocks=2)
        for tok in range(6):
            t.decode(a, tok)

    assert_same_as_vllm(sc, num_blocks=8)


# ---------------------------------------------------------------------------
# new block ids, events, stats


def test_take_new_block_ids() -> None:
    m = make_hc(num_blocks=10)
    a = req("a", range(10))
    m.allocate_slots(a, 10)
    a.num_computed_tokens = 10
    assert m.take_new_block_ids() == [1, 2, 3]
    assert m.take_new_block_ids() == []
    b = req("b", range(12))
    blocks, hit = m.get_computed_blocks(b)
    m.allocate_slots(b, b.num_tokens - hit, hit, blocks)
    # Prefix-hit blocks are not new; only the freshly allocated one is.
    assert hit == 8 and m.take_new_block_ids() == [4]
    m.new_step_starts()
    assert m.take_new_block_ids() == []


def test_take_new_block_ids_matches_vllm(vllm: bool) -> None:
    def sc(t: Trace) -> None:
        a = req("a", range(10))
        t.admit(a)
        t.rec("ids", t.m.take_new_block_ids())
        b = req("b", range(12))
        t.admit(b)
        t.admit(req("x", range(70, 75)), num_new=1, num_external_computed_tokens=4)
        t.rec("ids", t.m.take_new_block_ids())
        t.m.new_step_starts()
        t.decode(a, 5)
        t.decode(a, 6)
        t.rec("ids", t.m.take_new_block_ids())

    assert_same_as_vllm(sc, num_blocks=12)


def _event_scenario(t: Trace) -> None:
    a = req("a", range(10))
    t.admit(a)
    for tok in range(3):
        t.decode(a, 10 + tok)  # completes a block: one more stored event
    t.free(a)
    t.admit(req("b", range(100, 140)))  # evicts a's cached blocks
    t.rec("events", t.m.take_events())
    t.m.free(req("b", []))
    t.rec("reset", t.m.reset_prefix_cache())
    t.rec("events", t.m.take_events())
    t.rec("events again", t.m.take_events())


def test_events_have_vllm_field_names() -> None:
    t = run_hc(_event_scenario, num_blocks=12, enable_kv_cache_events=True)
    first, second, again = (r for label, r, _ in t.items if label.startswith("events"))
    kinds = [k for k, _ in first]
    assert kinds[0] == "BlockStored" and "BlockRemoved" in kinds
    assert [k for k, _ in second] == ["AllBlocksCleared"]
    assert again == []
    for kind, fields in first + second:
        assert list(fields) == VLLM_EVENT_FIELDS[kind]
    stored = first[0][1]
    assert stored["token_ids"] == list(range(8))
    assert stored["block_size"] == BS and stored["group_idx"] == 0 and stored["medium"] == "GPU"
    assert stored["parent_block_hash"] is None and len(stored["block_hashes"]) == 2


def test_events_match_vllm(vllm: bool) -> None:
    from vllm.distributed import kv_events

    assert_same_as_vllm(_event_scenario, num_blocks=12, enable_kv_cache_events=True)
    # With vLLM importable the events are vLLM's own classes.
    m = make_hc(num_blocks=12, enable_kv_cache_events=True)
    m.allocate_slots(req("a", range(8)), 8)
    (ev,) = m.take_events()
    assert type(ev) is kv_events.BlockStored


def test_events_without_vllm_are_lookalikes() -> None:
    """With vLLM not importable, events are hybridcache's dataclasses with
    vLLM's field names in vLLM's order, and stats a PrefixCacheStats lookalike."""
    r = _run_python(
        """
        import sys, json, dataclasses
        sys.modules["vllm"] = None   # makes vllm unimportable
        sys.modules["torch"] = None
        from hybridcache import KVCacheManager, KVCacheConfig, KVCacheGroupSpec, FullAttentionSpec, Request
        m = KVCacheManager(KVCacheConfig(6, [], [KVCacheGroupSpec(["l"], FullAttentionSpec(4))]), 64, 4, 4,
                           enable_kv_cache_events=True, log_stats=True)
        a = Request("a", range(9), 4)
        m.get_computed_blocks(a)
        m.allocate_slots(a, 9)
        m.free(a)
        b = Request("b", range(100, 116), 4)
        m.get_computed_blocks(b)
        m.allocate_slots(b, 16)
        m.free(b)
        m.reset_prefix_cache()
        evs = m.take_events()
        st = m.make_prefix_cache_stats()
        out = {
            "events": [[type(e).__module__, type(e).__name__,
                        [[f.name, getattr(e, f.name)] for f in dataclasses.fields(e)]] for e in evs],
            "stats": [type(st).__module__, [[f.name, getattr(st, f.name)] for f in dataclasses.fields(st)]],
            "loaded": sorted(k for k in sys.modules if k.split(".")[0] in ("vllm", "torch") and sys.modules[k] is not None),
        }
        print(json.dumps(out))
        """
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["loaded"] == []
    kinds = [name for _, name, _ in out["events"]]
    # a's 2 full blocks stored; b (4 blocks) evicts a's tail block; b stored; reset.
    assert kinds == ["BlockStored", "BlockRemoved", "BlockStored", "AllBlocksCleared"]
    for module, name, fields in out["events"]:
        assert module == "hybridcache.events"
        assert [f for f, _ in fields] == VLLM_EVENT_FIELDS[name]
    stored = dict(out["events"][0][2])
    assert stored["token_ids"] == list(range(8)) and stored["block_size"] == 4
    assert stored["medium"] == "GPU" and stored["group_idx"] == 0
    assert stored["kv_cache_spec_kind"] == "full_attention"
    assert all(isinstance(h, int) for h in stored["block_hashes"])
    removed = dict(out["events"][1][2])
    assert removed == {"block_hashes": stored["block_hashes"][1:], "medium": "GPU", "group_idx": 0}
    assert len(dict(out["events"][2][2])["token_ids"]) == 16
    module, stats = out["stats"]
    assert module == "hybridcache.events"
    assert [f for f, _ in stats] == VLLM_STATS_FIELDS
    assert dict(stats) == {
        "reset": True, "requests": 2, "queries": 25, "hits": 0,
        "preempted_requests": 0, "preempted_queries": 0, "preempted_hits": 0,
    }


def test_prefix_cache_stats() -> None:
    m = make_hc(num_blocks=16, log_stats=True)
    assert make_hc().make_prefix_cache_stats() is None
    a = req("a", range(10))
    m.get_computed_blocks(a)
    m.allocate_slots(a, 10)
    b = req("b", range(13))
    b.num_preemptions = 1
    m.get_computed_blocks(b)
    stats = m.make_prefix_cache_stats()
    assert [getattr(stats, f) for f in VLLM_STATS_FIELDS] == [False, 1, 10, 0, 1, 13, 8]
    fresh = m.make_prefix_cache_stats()
    assert [getattr(fresh, f) for f in VLLM_STATS_FIELDS] == [False, 0, 0, 0, 0, 0, 0]


def test_prefix_cache_stats_match_vllm(vllm: bool) -> None:
    from vllm.v1.metrics.stats import PrefixCacheStats

    def sc(t: Trace) -> None:
        a = req("a", range(10))
        t.admit(a)
        t.rec("stats", dataclasses.astuple(t.m.make_prefix_cache_stats()))
        b = req("b", range(13))
        b.num_preemptions = 2
        t.admit(b)
        t.admit(req("c", range(9)))
        t.rec("stats", dataclasses.astuple(t.m.make_prefix_cache_stats()))
        t.rec("stats", dataclasses.astuple(t.m.make_prefix_cache_stats()))

    assert_same_as_vllm(sc, num_blocks=16, log_stats=True)
    assert type(make_hc(log_stats=True).make_prefix_cache_stats()) is PrefixCacheStats


# ---------------------------------------------------------------------------
# unsupported configurations


class SinkFullAttentionSpec:
    """A stand-in named like a vLLM spec that 0.23.0 cannot build a manager
    for (only the class name and block size matter)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size


class EncoderOnlyAttentionSpec(SinkFullAttentionSpec):
    pass


@pytest.mark.parametrize("kwargs", [{"dcp_world_size": 2}, {"pcp_world_size": 2}])
def test_context_parallel_needs_vllms_hash_block_size(kwargs: dict[str, Any]) -> None:
    # vLLM's scheduler hashes at block_size * dcp * pcp (tests/v0_23/test_context_parallel.py).
    with pytest.raises(ValueError, match="hash_block_size .* times dcp_world_size"):
        make_hc(**kwargs)
    m = KVCacheManager(hc_config(16, BS, 1), MAX_LEN, 2 * BS, 2 * BS, **kwargs)
    assert (m.dcp_world_size, m.pcp_world_size) == (kwargs.get("dcp_world_size", 1), kwargs.get("pcp_world_size", 1))


def test_metrics_collector_is_the_callers() -> None:
    collector = object()
    m = make_hc(metrics_collector=collector)
    assert m.metrics_collector is collector and m.block_pool.metrics_collector is collector
    assert make_hc().block_pool.metrics_collector is None


@pytest.mark.parametrize("spec_cls", [SinkFullAttentionSpec, EncoderOnlyAttentionSpec])
def test_unsupported_spec_raises_not_implemented(spec_cls: type) -> None:
    cfg = KVCacheConfig(8, [], [KVCacheGroupSpec(["m"], spec_cls(block_size=BS))])
    with pytest.raises(NotImplementedError, match=spec_cls.__name__):
        KVCacheManager(cfg, MAX_LEN, BS, BS, enable_caching=False)


def test_unknown_spec_raises_not_implemented() -> None:
    class WeirdSpec:
        block_size = BS

    cfg = KVCacheConfig(8, [], [KVCacheGroupSpec(["u"], WeirdSpec())])
    with pytest.raises(NotImplementedError, match="WeirdSpec"):
        KVCacheManager(cfg, MAX_LEN, BS, BS)


# ---------------------------------------------------------------------------
# invariants


def test_check_invariants_after_every_op() -> None:
    """A small mixed scenario; Trace.rec runs check_invariants after each op."""

    def sc(t: Trace) -> None:
        a, b = req("a", range(10)), req("b", range(6))
        t.admit(a)
        t.admit(b, num_new=4)  # chunked prefill
        t.rec("cache", t.m.cache_blocks(b, 4))
        b.num_computed_tokens = 4
        t.rec("chunk 2", t.m.allocate_slots(b, 2))
        b.num_computed_tokens = 6
        t.decode(a, 1)
        t.decode(b, 2)
        t.rec("evict", t.m.evict_blocks([1, 2]))
        t.rec("remove skipped", t.m.remove_skipped_blocks("a", 11))
        t.free(a)
        t.admit(req("c", range(10)))
        t.rec("reset refused", t.m.reset_prefix_cache())
        t.free(b)
        t.m.free(req("c", []))
        t.rec("reset", t.m.reset_prefix_cache())

    t = run_hc(sc, num_blocks=10)
    assert t.items[-1][1] is True
    final = t.items[-1][2]
    assert final["num_free"] == 9 and final["usage"] == 0.0
    assert all(h is None for h in final["hashes"])


def test_check_invariants_scenario_matches_vllm(vllm: bool) -> None:
    def sc(t: Trace) -> None:
        a, b = req("a", range(10)), req("b", range(6))
        t.admit(a)
        t.admit(b, num_new=4)
        t.m.cache_blocks(b, 4)
        t.rec("cache")
        b.num_computed_tokens = 4
        t.rec("chunk 2", t.m.allocate_slots(b, 2))
        b.num_computed_tokens = 6
        t.decode(a, 1)
        t.decode(b, 2)
        t.m.evict_blocks({1, 2})
        t.rec("evict")
        t.free(a)
        t.admit(req("c", range(10)))
        t.free(b)

    assert_same_as_vllm(sc, num_blocks=10)


def test_version_and_public_api() -> None:
    assert hybridcache.SUPPORTED_VLLM_VERSIONS[0] == "0.23.0"
    assert isinstance(hybridcache.__version__, str) and hybridcache.__version__
    m = make_hc(num_blocks=7)
    assert m.block_pool.num_gpu_blocks == 7 and len(m.block_pool.blocks) == 7
    assert m.num_kv_cache_groups == 1
    assert m.usage == 0.0 and m.block_pool.get_usage() == 0.0
    with pytest.raises(IndexError):
        m.block_pool.blocks[7]


# ---------------------------------------------------------------------------
# read-only compatibility views of vLLM internals (what vLLM's own tests read)


def test_internal_read_views_follow_native_state() -> None:
    m = make_hc(num_blocks=8)
    pool = m.block_pool
    r = req("a", range(3 * BS + 1))
    blocks = m.allocate_slots(r, 3 * BS + 1)
    assert blocks is not None
    ids = blocks.get_block_ids()
    # get_cached_block: first cached block per group, None on any miss.
    for i, h in enumerate(r.block_hashes):
        got = pool.get_cached_block(h, kv_cache_group_ids=[0])
        assert got is not None and [b.block_id for b in got] == [ids[0][i]]
        assert pool.cached_block_hash_to_block.get_one_block(got[0].block_hash) == got[0]
        assert pool.get_cached_block(h, kv_cache_group_ids=[0, 1]) is None  # a miss in group 1
    assert pool.get_cached_block(b"\x00" * len(r.block_hashes[0]), [0]) is None
    assert len(pool.cached_block_hash_to_block) == len(r.block_hashes) == 3
    # req_to_blocks: block views per request, built on access.
    for g in range(1):
        rtb = m.coordinator.single_type_managers[g].req_to_blocks
        assert list(rtb) == ["a"] and "a" in rtb and "b" not in rtb
        assert [b.block_id for b in rtb["a"]] == ids[g]
        with pytest.raises(KeyError):
            rtb["b"]
    # free list links walk the same order as get_all_free_blocks().
    fq = pool.free_block_queue
    m.free(r)
    order, node = [], fq.fake_free_list_head.next_free_block
    while node is not fq.fake_free_list_tail:
        order.append(node.block_id)
        node = node.next_free_block
    assert order == [b.block_id for b in fq.get_all_free_blocks()] and len(order) == 7
    back, node = [], fq.fake_free_list_tail.prev_free_block
    while node is not fq.fake_free_list_head:
        back.append(node.block_id)
        node = node.prev_free_block
    assert back == order[::-1]
    assert dict(m.coordinator.single_type_managers[0].req_to_blocks) == {}
    assert m.reset_prefix_cache() and not pool.cached_block_hash_to_block
    m.check_invariants()
