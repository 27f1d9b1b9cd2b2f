"""What the hostile-caller tests share: the managers under test (every
supported release's facade from the release table, and the plain
`hybridcache.KVCacheManager`), a small world of requests in every state, a
full state snapshot, and `in_child`, which runs a case in a child process
so that a crash, an abort or a hang is reported as that case's failure.

A case is a module-level function `case_*(flavour)` of a test module; the
test calls `in_child(case_x, flavour)`. In the child the case runs with
vLLM hidden (hybridcache's own event and stats classes: no torch import per
child), and an AssertionError or any other exception fails the test with
the child's traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

BS = 4
MAX_LEN = 64
NUM_BLOCKS = 32
CHILD_ENV = "HYBRIDCACHE_HOSTILE_CHILD"
CHILD_TIMEOUT_S = 120


def _release_versions() -> tuple[str, ...]:
    from hybridcache.releases import SUPPORTED_VLLM_VERSIONS

    return tuple(SUPPORTED_VLLM_VERSIONS)


# "plain": hybridcache.KVCacheManager; a version: that release's facade class.
FLAVOURS: tuple[str, ...] = ("plain", *_release_versions())


def manager_class(flavour: str) -> type:
    if flavour == "plain":
        from hybridcache import KVCacheManager

        return KVCacheManager
    from hybridcache.releases import find

    release = find(flavour)
    assert release is not None, flavour
    return release.facade_class()


def groups(layout: str) -> list[Any]:
    from hybridcache import FullAttentionSpec, KVCacheGroupSpec, SlidingWindowSpec

    out = [KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=BS))]
    if layout == "swa":
        out.append(KVCacheGroupSpec(["swa"], SlidingWindowSpec(block_size=BS, sliding_window=8)))
    return out


def make(flavour: str, num_blocks: int = NUM_BLOCKS, layout: str = "full", **kw: Any) -> Any:
    from hybridcache import KVCacheConfig

    kw.setdefault("enable_kv_cache_events", True)
    kw.setdefault("log_stats", True)
    return manager_class(flavour)(KVCacheConfig(num_blocks, [], groups(layout)), MAX_LEN, BS, BS, **kw)


def lookup(m: Any, request: Any) -> tuple[Any, int]:
    """`get_computed_blocks` in every release's shape: (blocks, hit tokens)."""
    out = m.get_computed_blocks(request)
    return out[0], out[1]


def snapshot(m: Any, extra_ids: tuple[str, ...] = ()) -> dict[str, Any]:
    """Everything a call could change, through reads every facade has: the
    pool (free count, free-queue order, ref counts, block hashes), every
    held request's block ids per group and known hashes, the prefix-cache
    stats so far and the events not yet taken."""
    n = m._native
    bp = m.block_pool
    rids = sorted(set(n.request_ids()) | set(extra_ids))
    stats = m.prefix_cache_stats
    return {
        "num_free": bp.get_num_free_blocks(),
        "free_queue": [b.block_id for b in bp.free_block_queue.get_all_free_blocks()],
        "ref_cnt": [n.ref_cnt(b) for b in range(n.num_blocks)],
        "hashes": [n.block_hash(b) for b in range(n.num_blocks)],
        "held": sorted(n.request_ids()),
        "block_ids": {r: tuple(map(tuple, m.get_block_ids(r))) for r in rids},
        "known_hashes": {r: n.num_known_hashes(r) for r in rids},
        "stats": None if stats is None else (stats.requests, stats.queries, stats.hits, stats.preempted_requests,
                                             stats.preempted_queries, stats.preempted_hits),
        "events": [repr(e) for e in m._events],
    }


def diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    return "; ".join(f"{k}: {a[k]!r} != {b[k]!r}" for k in a if a[k] != b.get(k))


def assert_unchanged(before: dict[str, Any], after: dict[str, Any], what: str) -> None:
    assert before == after, f"{what} changed the state: {diff(before, after)}"


class World:
    """A manager holding two running requests `a` (10 tokens) and `b` (7),
    a finished request whose cached blocks wait in the free queue, and a
    waiting request `w` sharing a's first 8 tokens (a prefix hit of 2
    blocks). Deterministic: two worlds of one flavour are equal, so a
    hostile call on one is judged against the plain call on its twin."""

    def __init__(self, flavour: str, layout: str = "full", num_blocks: int = NUM_BLOCKS,
                 request_class: Any = None, **kw: Any) -> None:
        from hybridcache import Request

        self.flavour = flavour
        self.m = make(flavour, num_blocks, layout, **kw)
        self.Request = Request = request_class or Request
        self.a = self.admit(Request("a", range(10), BS))
        self.b = self.admit(Request("b", range(500, 507), BS))
        f = self.admit(Request("f", range(100, 113), BS))
        self.m.free(f)
        self.w = Request("w", [*range(8), 50, 51, 52], BS)
        self.m.take_events()
        self.m.make_prefix_cache_stats()
        self.m.new_step_starts()
        self.m.check_invariants()

    def lookup(self, r: Any) -> tuple[Any, int]:
        return lookup(self.m, r)

    def admit(self, r: Any) -> Any:
        blocks, hit = lookup(self.m, r)
        assert self.m.allocate_slots(r, r.num_tokens - hit, hit, blocks) is not None
        r.num_computed_tokens = r.num_tokens
        return r

    def decode_ready(self, r: Any, tokens: int = 1) -> int:
        """Appends `tokens` sampled tokens; the step's num_new_tokens."""
        r.append_output_token_ids([7] * tokens)
        return r.num_tokens - r.num_computed_tokens

    def snap(self) -> dict[str, Any]:
        return snapshot(self.m, ("a", "b", "f", "w"))


def ids_of(result: Any) -> Any:
    """An allocation's result as plain data (None stays None)."""
    if result is None:
        return None
    return tuple(map(tuple, result.get_block_ids()))


# -- running a case in a child process -------------------------------------------------


def in_child(case: Callable[..., Any], *args: Any) -> Any:
    """Runs `case(*args)` in a child process and returns what it returned
    (JSON); fails the test with the child's output when the case fails,
    the child dies (signal, abort) or hangs."""
    import pytest

    if os.environ.get(CHILD_ENV):
        return case(*args)
    module = sys.modules[case.__module__]
    here = str(Path(module.__file__).resolve().parent)  # type: ignore[arg-type]
    code = (
        "import sys, json\n"
        "sys.modules.setdefault('vllm', None)\n"
        f"sys.path.insert(0, {here!r})\n"
        f"import {case.__module__} as mod\n"
        f"out = mod.{case.__name__}(*json.loads(sys.argv[1]))\n"
        "sys.stdout.write('\\nCASE-RESULT ' + json.dumps(out) + '\\n')\n"
    )
    env = dict(os.environ, **{CHILD_ENV: "1"}, PYTHONFAULTHANDLER="1")
    try:
        p = subprocess.run([sys.executable, "-c", code, json.dumps(list(args))], capture_output=True, text=True,
                           timeout=CHILD_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{case.__name__}{args}: hung (no answer in {CHILD_TIMEOUT_S} s): {e.stdout!r} {e.stderr!r}")
    tail = (p.stdout[-3000:] + "\n" + p.stderr[-6000:]).strip()
    if p.returncode < 0:
        pytest.fail(f"{case.__name__}{args}: the child died of signal {-p.returncode}:\n{tail}")
    if p.returncode != 0:
        pytest.fail(f"{case.__name__}{args}: failed in the child (rc {p.returncode}):\n{tail}", pytrace=False)
    results = [ln for ln in p.stdout.splitlines() if ln.startswith("CASE-RESULT ")]
    assert results, f"{case.__name__}{args}: the child gave no result:\n{tail}"
    return json.loads(results[-1][len("CASE-RESULT "):])
