"""Hostile-input fuzz: random types and values (huge, negative, bool, float,
None, wrong objects, stale or foreign blocks, mismatched lengths) sent to
every public entry point of `hybridcache.KVCacheManager`: the constructor,
the vLLM API, the batch, array, Mamba plan and view APIs; and callers whose
objects fight back (`hybridcache_dev.hostile_kinds`: re-entrant, raising and
identity-changing requests).

Each call either succeeds (then the manager's invariants must hold) or
raises a clear ValueError / TypeError / KeyError / IndexError /
NotImplementedError (never a caught panic, AttributeError or
OverflowError) with the manager's full state exactly as before. Each batch
of calls runs in its own subprocess, which announces every call before
making it: an abort (signal, out of memory) is caught and charged to the
call that was running.

    python -m hybridcache_dev.hostile_fuzz --batches 40 --calls 200 --seed 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hybridcache_dev.hostile_kinds import hostile_call

BS = 4
MAX_LEN = 96
NUM_BLOCKS = 48
CONFIGS = ("full", "full_nocache", "hybrid", "hybrid_eagle", "swa")
ACCEPTED = (ValueError, TypeError, KeyError, IndexError, NotImplementedError)
# A bad call must never surface as one of these (a caught panic is a
# RuntimeError; OverflowError names no argument).
REFUSED = (RuntimeError, AttributeError, OverflowError)


def _groups(config: str) -> list[Any]:
    from hybridcache import FullAttentionSpec, KVCacheGroupSpec, MambaSpec, SlidingWindowSpec

    groups = [KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=BS))]
    if config in ("hybrid", "hybrid_eagle", "swa"):
        groups.append(KVCacheGroupSpec(["swa"], SlidingWindowSpec(block_size=BS, sliding_window=8)))
    if config in ("hybrid", "hybrid_eagle"):
        spec = MambaSpec(block_size=BS, mamba_cache_mode="align", num_speculative_blocks=2)
        groups.append(KVCacheGroupSpec(["mamba"], spec))
    return groups


def make_manager(config: str, num_blocks: int = NUM_BLOCKS) -> Any:
    from hybridcache import KVCacheConfig, KVCacheManager

    return KVCacheManager(
        KVCacheConfig(num_blocks, [], _groups(config)),
        MAX_LEN,
        BS,
        BS,
        enable_caching=config != "full_nocache",
        use_eagle=config == "hybrid_eagle",
        enable_kv_cache_events=True,
        log_stats=True,
    )


def snapshot(m: Any, rids: list[str]) -> tuple:
    """Everything a call could change, read through side-effect-free reads."""
    n = m._native
    nb = n.num_blocks
    groups = m.num_kv_cache_groups

    def handle(r: str) -> Any:
        try:
            return n.request_handle(r)
        except KeyError:
            return None

    return (
        tuple(n.free_queue()),
        tuple(n.ref_cnt(b) for b in range(nb)),
        tuple(n.block_hash(b) for b in range(nb)),
        tuple(sorted(n.request_ids())),
        n.num_requests,
        n.num_free_blocks,
        n.num_cached_keys,
        tuple(tuple(map(tuple, n.get_block_ids(r))) for r in rids),
        tuple(n.num_known_hashes(r) for r in rids),
        tuple(n.align_state(r, g) for r in rids for g in range(groups)),
        tuple(handle(r) for r in rids),
        len(m._events),
    )


@dataclass
class Tally:
    calls: int = 0
    raised: int = 0
    accepted: int = 0
    failures: list[str] = field(default_factory=list)


class World:
    """A manager with running, finished (cached, free) and waiting requests,
    a second manager (for foreign blocks), and the hostile values to send."""

    def __init__(self, config: str, rng: random.Random) -> None:
        from hybridcache_dev.hostile_kinds import Hookable as Request  # armed by the hostile objects' calls

        self.config, self.rng = config, rng
        self.m = make_manager(config)
        self.other = make_manager(config)
        self.Request = Request
        self.serial = 0
        self.running: list[Any] = []
        self.waiting: list[Any] = []
        self.freed: list[Any] = []
        self.stale_ids: list[int] = []
        for _ in range(3):
            self.admit(self.new_request())
        for _ in range(2):
            self.finish()
        for _ in range(2):
            self.admit(self.new_request())
        self.waiting_hits: list[Any] = []  # taken now: a lookup stores the request's hashes
        for _ in range(2):
            w = self.new_request(prefix_of=self.rng.choice(self.freed + self.running))
            self.waiting_hits.append(self.m.get_computed_blocks(w)[0])
            self.waiting.append(w)
        ob = self.new_request()
        self.other.allocate_slots(ob, ob.num_tokens)
        self.foreign = self.other.get_blocks(ob.request_id)

    # -- legit moves -------------------------------------------------------

    def new_request(self, prefix_of: Any = None, length: int | None = None) -> Any:
        self.serial += 1
        n = length if length is not None else self.rng.randint(1, 40)
        base = list(prefix_of.all_token_ids[: self.rng.randint(0, prefix_of.num_tokens)]) if prefix_of else []
        tokens = (base + [self.rng.randrange(1000) for _ in range(n)])[: max(n, 1)]
        return self.Request(f"r{self.serial}", tokens, BS)

    def admit(self, r: Any) -> None:
        self.m.new_step_starts()  # each admission in a step of its own
        blocks, hit = self.m.get_computed_blocks(r)
        if self.m.allocate_slots(r, r.num_tokens - hit, hit, blocks) is not None:
            r.num_computed_tokens = r.num_tokens
            self.running.append(r)

    def finish(self) -> None:
        if self.running:
            r = self.running.pop(self.rng.randrange(len(self.running)))
            self.stale_ids.extend(b for g in self.m.get_block_ids(r.request_id) for b in g if b)
            self.m.free(r)
            self.freed.append(r)

    def decode(self) -> None:
        if self.running:
            r = self.rng.choice(self.running)
            if r.num_tokens + 3 >= MAX_LEN:
                return
            r.append_output_token_ids(self.rng.randrange(1000))
            n = r.num_tokens - r.num_computed_tokens  # as vLLM schedules it
            if self.m.allocate_slots(r, n) is not None:
                r.num_computed_tokens += n

    def legit_step(self) -> None:
        move = self.rng.random()
        if move < 0.3:
            self.decode()
        elif move < 0.5:
            self.admit(self.new_request(prefix_of=self.rng.choice(self.freed + self.running + [None])))
        elif move < 0.65:
            self.finish()
        self.m.take_events()

    def rids(self) -> list[str]:
        reqs = self.running + self.waiting + self.freed
        return [r.request_id for r in reqs] + ["nobody", "ghost"]

    # -- hostile values ----------------------------------------------------

    def count(self) -> Any:
        r = self.rng
        return r.choice(
            [0, 1, 2, 3, BS, MAX_LEN, MAX_LEN + 1, -1, -(2**40), 2**31, 2**32, 10**12, 2**63 - 1, 2**63,
             2**64, 10**30, True, False, 1.0, 2.5, float("nan"), None, "3", b"3", [], [1], object(),
             r.randint(0, 2 * MAX_LEN)]
        )

    def block_id(self) -> Any:
        r = self.rng
        stale = r.choice(self.stale_ids) if self.stale_ids else 1
        return r.choice([0, 1, stale, NUM_BLOCKS - 1, NUM_BLOCKS, -1, 2**32, 2**64, "1", None, 1.5, True])

    def blocks(self) -> Any:
        """new_computed_blocks: real hits, stale, foreign, null, live
        blocks of other requests, wrong group counts, wrong types."""
        from hybridcache import KVCacheBlocks

        r, m = self.rng, self.m
        ng = m.num_kv_cache_groups
        live = [b for q in self.running for g in m.get_block_ids(q.request_id) for b in g if b]
        pick = r.random()
        if pick < 0.15:
            return self.foreign
        if pick < 0.35 and live:
            return KVCacheBlocks(tuple(r.sample(live, min(len(live), r.randint(1, 3))) for _ in range(ng)), m)
        if pick < 0.5 and self.stale_ids:
            return KVCacheBlocks(tuple([r.choice(self.stale_ids)] for _ in range(ng)), m)
        if pick < 0.6:
            return KVCacheBlocks(tuple([0] * r.randint(1, 3) for _ in range(ng)), m)
        if pick < 0.7:
            return KVCacheBlocks(tuple([1] for _ in range(ng + r.choice((-1, 1)))), m)
        if pick < 0.8:
            return r.choice([None, (), ([1],), "blocks", 3, object(), m.empty_kv_cache_blocks])
        if pick < 0.9:
            return r.choice(self.waiting_hits)
        ids = [0, 1, NUM_BLOCKS - 1, NUM_BLOCKS, -1, 2**32, 2**40] + self.stale_ids[-3:]
        return KVCacheBlocks(tuple([r.choice(ids)] for _ in range(ng)), m)

    def request(self) -> Any:
        r = self.rng
        pick = r.random()
        pool = self.running + self.waiting + self.freed
        if pick < 0.4 and pool:
            return r.choice(pool)
        if pick < 0.55:
            return self.new_request(length=r.choice([1, 5, MAX_LEN, MAX_LEN + 1, 3 * MAX_LEN]))
        if pick < 0.75 and pool:
            return self.doctored(r.choice(pool))
        return r.choice([None, "r1", 7, object(), {"request_id": "r1"}, self.m])

    def doctored(self, base: Any) -> Any:
        """A copy of a request with one hostile attribute."""
        r = self.rng
        # Deliberately ill-typed attributes: Any, so mypy lets them through.
        x: Any = self.Request(base.request_id, list(base.all_token_ids), BS)
        x.num_computed_tokens = base.num_computed_tokens
        what = r.choice(["num_computed_tokens", "request_id", "block_hashes", "block_hashes_short"])
        if what == "num_computed_tokens":
            x.num_computed_tokens = self.count()
        elif what == "request_id":
            x.request_id = r.choice([None, 7, b"r1", ("r",), "x" * 5])
        elif what == "block_hashes":
            x.block_hashes = r.choice([None, "ab", [b"x"] * 40, [1, 2, 3], [[0, 1]] * 4, [None] * 9])
        else:
            x.block_hashes = list(x.block_hashes[: r.randint(0, len(x.block_hashes))])
        return x

    def rid(self) -> Any:
        r = self.rng
        return r.choice(self.rids() + [None, 7, b"r1", object(), ""])

    def int_list(self) -> Any:
        r = self.rng
        n = r.randint(0, 4)
        return r.choice(
            [[self.count() for _ in range(n)], [r.randint(0, 8) for _ in range(n)], None, "12", (1, 2), b"\x01\x00\x00",
             bytes(4 * n)]
        )

    # -- the calls -----------------------------------------------------------

    def calls(self) -> list[tuple[str, Callable[[], Any]]]:
        """(description, call) for one hostile call per entry point."""
        r, m = self.rng, self.m
        req = self.request()
        cnt = self.count
        kw_names = ["num_new_computed_tokens", "num_lookahead_tokens", "num_external_computed_tokens",
                    "num_encoder_tokens", "reserved_blocks", "delay_cache_blocks", "full_sequence_must_fit"]
        kw = {k: cnt() for k in r.sample(kw_names, r.randint(0, 3))}
        if r.random() < 0.5:
            kw["new_computed_blocks"] = self.blocks()
            kw.setdefault("num_new_computed_tokens", r.choice([0, BS, 2 * BS, 3, cnt()]))
        num_new = r.choice([cnt(), 1, 3, getattr(req, "num_tokens", 1)])
        rids = [self.rid() for _ in range(r.randint(0, 3))]
        handles = []
        for q in r.sample(self.running, min(len(self.running), r.randint(0, 3))):
            handles.append(m.request_handle(q.request_id))
        handles += [r.choice([0, 2**63, 12345])] * r.randint(0, 1)
        n = len(handles)
        one = lambda: [r.randint(0, MAX_LEN) for _ in range(n + r.choice((0, 0, 0, 1)))]  # noqa: E731
        batch = [self.request() for _ in range(r.randint(0, 3))]
        return [
            (f"allocate_slots({req!r}, {num_new!r}, **{kw!r})", lambda: m.allocate_slots(req, num_new, **kw)),
            (f"NativeManager.allocate_slots({req!r}, {num_new!r}, **{kw!r})",
             lambda: type(m).allocate_slots(m, req, num_new, **kw)),
            (f"get_computed_blocks({req!r})", lambda: m.get_computed_blocks(req)),
            ("free(not a request)", lambda: m.free(r.choice([None, "r1", 7, object(), {"request_id": "r1"}]))),
            (f"cache_blocks({req!r}, ...)", lambda: m.cache_blocks(req, cnt())),
            ("remove_skipped_blocks", lambda: m.remove_skipped_blocks(self.rid(), cnt())),
            ("evict_blocks", lambda: m.evict_blocks(r.choice([[self.block_id()], self.block_id(), "12", None]))),
            ("get_num_common_prefix_blocks", lambda: m.get_num_common_prefix_blocks(self.rid())),
            ("get_block_ids", lambda: m.get_block_ids(self.rid())),
            ("get_blocks", lambda: m.get_blocks(self.rid())),
            ("request_handle", lambda: m.request_handle(self.rid())),
            (f"allocate_decode_batch({batch!r})",
             lambda: m.allocate_decode_batch(batch, r.choice([[1] * len(batch), self.int_list()]),
                                             r.choice([0, 1, cnt()]),
                                             r.choice([None, self.int_list()]), r.choice([None, self.int_list()]))),
            (f"allocate_decode_arrays({handles!r})",
             lambda: m.allocate_decode_arrays(handles, r.choice([one(), self.int_list()]), one(), one(),
                                              r.choice([0, cnt()]), r.choice([None, batch, "x"]))),
            ("mamba_pre_copy_plan", lambda: m.mamba_pre_copy_plan(rids, r.choice([[cnt() for _ in rids], self.int_list()]))),
            ("mamba_post_select_plan",
             lambda: m.mamba_post_select_plan(rids, r.choice([[cnt() for _ in rids], self.int_list()]))),
            ("get_num_blocks_to_allocate",
             lambda: m.coordinator.get_num_blocks_to_allocate(self.rid(), cnt(), self.blocks(), cnt(), cnt(), cnt())),
            ("create_kv_cache_blocks", lambda: m.create_kv_cache_blocks(r.choice([("xy",), "xy", (None,), ([1.5],), ([2**70],)]))),
            ("KVCacheBlocks +", lambda: self.blocks() + self.blocks()),
            ("KVCacheBlocks views", lambda: self._views(self.blocks())),
            ("block_pool views", lambda: self._pool_views()),
            ("reads", lambda: self._reads()),
            ("constructor", lambda: self._construct()),
            hostile_call(r, m, self.running, lambda: self.new_request(length=r.randint(1, 12)), MAX_LEN),
        ]

    def _views(self, blocks: Any) -> Any:
        from hybridcache import KVCacheBlocks

        r = self.rng
        if not isinstance(blocks, KVCacheBlocks):
            blocks = self.foreign
        op = r.choice(["ids", "unhashed", "unhashed_all", "blocks", "new_empty", "eq"])
        if op == "ids":
            return blocks.get_block_ids(allow_none=r.choice([True, False]), group_ids=r.choice([None, [0], [5], [-1]]))
        if op == "unhashed":
            return blocks.get_unhashed_block_ids()
        if op == "unhashed_all":
            return blocks.get_unhashed_block_ids_all_groups()
        if op == "blocks":
            return [[(b.block_id, b.ref_cnt, b.block_hash) for b in g] for g in blocks.blocks]
        if op == "new_empty":
            return blocks.new_empty()
        return blocks == self.blocks()

    def _pool_views(self) -> Any:
        r, bp = self.rng, self.m.block_pool
        op = r.choice(["blocks", "cached", "queue", "one", "neighbors", "stm"])
        if op == "blocks":
            b = bp.blocks[self.block_id()]
            return (b.block_id, b.ref_cnt, b.block_hash)
        if op == "cached":
            return bp.get_cached_block(r.choice([b"x", b"", "x", None, 3]), r.choice([[0], [7], [-1], None, "0"]))
        if op == "queue":
            return [b.block_id for b in bp.free_block_queue.get_all_free_blocks()]
        if op == "one":
            return bp.cached_block_hash_to_block.get_one_block(r.choice([b"x", None, 3]))
        if op == "neighbors":
            return self.m._native.free_queue_neighbors(self.block_id())
        stm = self.m.coordinator.single_type_managers[r.randrange(self.m.num_kv_cache_groups)]
        return stm.req_to_blocks[self.rid()]

    def _reads(self) -> Any:
        r, n = self.rng, self.m._native
        op = r.choice(["ref_cnt", "block_hash", "unhashed", "align", "known", "has", "cached_ids"])
        if op == "ref_cnt":
            return n.ref_cnt(self.block_id())
        if op == "block_hash":
            return n.block_hash(self.block_id())
        if op == "unhashed":
            return n.unhashed([self.block_id()])
        if op == "align":
            return n.align_state(self.rid(), self.count())
        if op == "known":
            return n.num_known_hashes(self.rid())
        if op == "has":
            return n.has_request(self.rid())
        return n.cached_block_ids(r.choice([b"x", "x", None]), r.choice([[0], [-1], [2**40], None]))

    def _construct(self) -> Any:
        from hybridcache import KVCacheConfig, KVCacheManager

        r, c = self.rng, self.count
        num_blocks = r.choice([NUM_BLOCKS, c()])
        groups: Any = r.choice([_groups(self.config), [], [object()], None, "g"])
        args = [r.choice([MAX_LEN, c()]), r.choice([BS, c()]), r.choice([BS, c()])]
        kw = {k: c() for k in r.sample(["max_num_batched_tokens", "enable_caching", "use_eagle", "log_stats"],
                                       r.randint(0, 2))}
        m = KVCacheManager(KVCacheConfig(num_blocks, [], groups), *args, **kw)
        m.check_invariants()
        q = self.Request("c", list(range(9)), BS)
        m.allocate_slots(q, 9)
        m.check_invariants()
        return m


def run_batch(config: str, seed: int, calls: int, announce: Callable[[str], None] = lambda s: None) -> Tally:
    """One batch in this process: `calls` hostile calls on one world."""
    rng = random.Random(seed)
    w = World(config, rng)
    t = Tally()
    for i in range(calls):
        for _ in range(rng.randint(0, 2)):
            w.legit_step()
        try:
            name, call = rng.choice(w.calls())
        except ACCEPTED:  # a hostile value refused while being built (KVCacheBlocks(...))
            continue
        rids = w.rids()
        before = snapshot(w.m, rids)
        announce(f"{i} {name}")
        t.calls += 1
        try:
            call()
        except ACCEPTED as e:  # before REFUSED: NotImplementedError is a RuntimeError
            t.raised += 1
            if type(e).__name__ == "PanicException":  # pragma: no cover - PyO3 derives it from BaseException
                t.failures.append(f"{config} seed {seed} call {i} {name}: panic {e}")
            after = snapshot(w.m, rids)
            if after != before:
                t.failures.append(f"{config} seed {seed} call {i} {name}: {type(e).__name__}: {e} changed the state")
        except BaseException as e:  # REFUSED, and a PanicException (a BaseException)
            t.failures.append(f"{config} seed {seed} call {i} {name}: {type(e).__name__}: {e}")
            continue
        else:
            t.accepted += 1
        try:
            w.m.check_invariants()
        except BaseException as e:
            t.failures.append(f"{config} seed {seed} call {i} {name}: invariants broken: {e}")
            return t  # the world is corrupt: the rest of the batch says nothing
        w.m.take_events()
    return t


def _worker(config: str, seed: int, calls: int) -> None:
    # hybridcache's own event and stats classes: a child need not import
    # vLLM (and torch) when they are installed.
    sys.modules.setdefault("vllm", None)  # type: ignore[arg-type]
    # Test hook: abort in call k, to check that an abort is charged to it.
    abort_at = os.environ.get("HYBRIDCACHE_HOSTILE_ABORT_AT")

    def announce(line: str) -> None:
        sys.stdout.write(f"CALL {line}\n")
        sys.stdout.flush()
        if abort_at is not None and line.split(" ", 1)[0] == abort_at:
            os.abort()

    try:
        t = run_batch(config, seed, calls, announce)
    except BaseException:
        t = Tally(failures=[f"{config} seed {seed}: batch driver error: {traceback.format_exc()}"])
    sys.stdout.write("RESULT " + json.dumps(t.__dict__) + "\n")
    sys.stdout.flush()


def run_in_subprocess(config: str, seed: int, calls: int, timeout: float = 300) -> Tally:
    """One batch in a child process: an abort is charged to the call it died in."""
    cmd = [sys.executable, "-m", "hybridcache_dev.hostile_fuzz", "--worker", config, str(seed), str(calls)]
    env = dict(os.environ, PYTHONFAULTHANDLER="0")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        out = p.stdout
        rc: int | str = p.returncode  # or "timeout" below
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc = "timeout"
    lines = out.splitlines()
    result = [ln for ln in lines if ln.startswith("RESULT ")]
    if result and rc == 0:
        return Tally(**json.loads(result[-1][len("RESULT "):]))
    last = [ln for ln in lines if ln.startswith("CALL ")]
    where = last[-1][len("CALL "):] if last else "(before the first call)"
    calls_done = len(last)
    err = p.stderr.strip().splitlines()[-1:] if rc != "timeout" else []
    return Tally(calls=calls_done, failures=[f"{config} seed {seed}: process died ({rc}) in call {where}: {err}"])


def run(batches: int, calls: int, seed: int, configs: tuple[str, ...] = CONFIGS) -> Tally:
    total = Tally()
    for b in range(batches):
        t = run_in_subprocess(configs[b % len(configs)], seed * 100_003 + b, calls)
        total.calls += t.calls
        total.raised += t.raised
        total.accepted += t.accepted
        total.failures += t.failures
    return total


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        _worker(argv[1], int(argv[2]), int(argv[3]))
        return 0
    ap = argparse.ArgumentParser(prog="python -m hybridcache_dev.hostile_fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    t = run(a.batches, a.calls, a.seed)
    print(f"hostile fuzz: {a.batches} batches, {t.calls} calls ({t.raised} raised, {t.accepted} accepted), "
          f"{len(t.failures)} failures")
    for f in t.failures[:30]:
        print("  " + f)
    return 1 if t.failures else 0


if __name__ == "__main__":
    sys.exit(main())
