"""Re-entrancy: a caller's object calls back into the same manager while a
call on it is in progress (a request property, a list's `__len__`, an id's
`__index__`, a metrics collector, a finalizer run inside `free`), or
another thread calls it while a request attribute read yields the GIL.

The call back is refused with a RuntimeError naming the call in progress
(never a PanicException, never "core panicked"), and the outer call
completes exactly as it does on a twin manager whose caller behaves: same
result, same state."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hostile_objects import Hooked, HookedIndex, HookedList, Reentry
from hostile_world import BS, FLAVOURS, World, ids_of, in_child

# The outer call's name as the refusal must spell it.
OUTER_NAMES = {
    "decode_noop": "allocate_slots",
    "decode_new_block": "allocate_slots",
    "decode_hashes": "allocate_slots",
    "admit": "allocate_slots",
    "lookup": "get_computed_blocks",
    "cache_blocks": "cache_blocks",
    "evict_len": "evict_blocks",
    "evict_index": "evict_blocks",
    "decode_batch": "allocate_decode_batch",
    "decode_batch_len": "allocate_decode_batch",
    "reset_collector": "reset_prefix_cache",
}


class Collector:
    """A metrics collector whose calls can run a hook."""

    def __init__(self) -> None:
        self.hook: Callable[[], Any] | None = None

    def _fire(self, *_: Any) -> None:
        fn, self.hook = self.hook, None
        if fn is not None:
            fn()

    on_block_allocated = on_block_accessed = on_block_evicted = _fire

    def reset(self) -> None:
        self._fire()


def _world(flavour: str, where: str) -> World:
    kw = {"metrics_collector": Collector()} if where == "reset_collector" else {}
    w = World(flavour, request_class=Hooked, **kw)
    if where == "cache_blocks":
        # A delayed allocation (an async KV load): cached by a later cache_blocks.
        w.w = w.Request.__new__(Hooked)
        Hooked.__init__(w.w, "w", [*range(8), 50, 51, 52, 53], BS)
        blocks, hit = w.lookup(w.w)
        assert w.m.allocate_slots(w.w, w.w.num_tokens - hit, hit, blocks, delay_cache_blocks=True) is not None
        w.w.num_computed_tokens = w.w.num_tokens
        w.m.take_events()
    return w


def _outer(w: World, where: str, hook: Callable[[], Any] | None) -> Callable[[], Any]:
    """The outer call of `where`, its hostile object armed with `hook`
    (None: the behaving twin's call)."""
    m, a, b = w.m, w.a, w.b

    def arm(req: Any, name: str) -> None:
        if hook is not None:
            req.hook(name, hook)

    if where in ("decode_noop", "decode_new_block", "decode_hashes"):
        n = w.decode_ready(a, 1 if where == "decode_noop" else 3)
        arm(a, "block_hashes" if where == "decode_hashes" else "num_computed_tokens")
        return lambda: ids_of(m.allocate_slots(a, n))
    if where == "admit":
        blocks, hit = w.lookup(w.w)
        arm(w.w, "num_computed_tokens")
        return lambda: ids_of(m.allocate_slots(w.w, w.w.num_tokens - hit, hit, blocks))
    if where == "lookup":
        arm(w.w, "block_hashes")
        return lambda: (lambda r: (ids_of(r[0]), r[1]))(m.get_computed_blocks(w.w))
    if where == "cache_blocks":
        arm(w.w, "block_hashes")
        return lambda: m.cache_blocks(w.w, w.w.num_tokens)
    if where == "evict_len":
        ids = HookedList([1, 2], hook) if hook else [1, 2]
        return lambda: m.evict_blocks(ids)
    if where == "evict_index":
        ids = [HookedIndex(1, hook) if hook else 1, 2]
        return lambda: m.evict_blocks(ids)
    if where in ("decode_batch", "decode_batch_len"):
        na, nb = w.decode_ready(a, 3), w.decode_ready(b, 1)
        counts: Any = [na, nb]
        if where == "decode_batch":
            arm(a, "num_computed_tokens")
        elif hook is not None:
            counts = HookedList(counts, hook)
        return lambda: m.allocate_decode_batch([a, b], counts)
    if where == "reset_collector":
        m.free(a)
        m.free(b)
        if hook is not None:
            m.metrics_collector.hook = hook
        return lambda: m.reset_prefix_cache()
    raise AssertionError(where)


def _inner_call(w: World, inner: str) -> Callable[[], Any]:
    m = w.m
    if inner == "free":
        return lambda: m.free(w.b)
    if inner == "allocate":
        fresh = w.Request("late", range(900, 905), BS)
        return lambda: m.allocate_slots(fresh, 5)
    if inner == "reset":
        return lambda: m.reset_prefix_cache()
    raise AssertionError(inner)


def assert_refused(reentry: Reentry, outer_name: str) -> None:
    assert reentry.ran, "the hostile object was never read: the case tests nothing"
    e = reentry.error
    assert e is not None, f"the call back into the manager during {outer_name} was served ({reentry.result!r})"
    assert type(e).__name__ != "PanicException", f"a panic: {e}"
    assert isinstance(e, RuntimeError), f"{type(e).__name__}: {e}"
    msg = str(e)
    assert "panicked" not in msg, msg
    assert outer_name in msg, f"the refusal does not name the call in progress ({outer_name}): {msg}"


def case_reentry(flavour: str, where: str, inner: str) -> None:
    twin = _world(flavour, where)
    expected = _outer(twin, where, None)()
    twin.m.check_invariants()
    w = _world(flavour, where)
    reentry = Reentry(_inner_call(w, inner))
    got = _outer(w, where, reentry)()
    assert_refused(reentry, OUTER_NAMES[where])
    assert got == expected, f"the outer call's result: {got!r}, a behaving caller's: {expected!r}"
    w.m.check_invariants()
    assert w.snap() == twin.snap(), "the state differs from a behaving caller's"


@pytest.mark.parametrize("inner", ["free", "allocate"])
@pytest.mark.parametrize("where", sorted(OUTER_NAMES))
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_reentry_is_refused_and_the_outer_call_completes(flavour: str, where: str, inner: str) -> None:
    in_child(case_reentry, flavour, where, inner)


def case_reentry_reset_during_decode(flavour: str) -> None:
    case_reentry(flavour, "decode_new_block", "reset")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_reset_prefix_cache_from_a_property_is_refused(flavour: str) -> None:
    in_child(case_reentry_reset_during_decode, flavour)


class Finalized(Hooked):
    """A request whose finalizer runs a hook."""

    on_del: Callable[[], Any] | None = None

    def __del__(self) -> None:
        if self.on_del is not None:
            self.on_del()


def case_finalizer_inside_free(flavour: str) -> None:
    """The manager holds the only reference to a running request; `free`
    with a stand-in of the same id drops it, and its finalizer calls back."""
    w = World(flavour, request_class=Hooked)
    x = Finalized("x", range(300, 306), BS)
    w.admit(x)
    n = w.decode_ready(x, 1)
    assert w.m.allocate_slots(x, n) is not None  # a running request's decode: the hot path knows it
    x.num_computed_tokens += n
    reentry = Reentry(_inner_call(w, "free"))
    x.on_del = reentry
    del x
    gc.collect()
    assert not reentry.ran  # the manager still holds it (or nothing does)
    before_b = w.m.get_block_ids("b")
    w.m.free(Hooked("x", range(300, 307), BS))
    if reentry.ran:  # the finalizer ran inside free
        assert_refused(reentry, "free")
        assert w.m.get_block_ids("b") == before_b
    assert not any(w.m.get_block_ids("x"))
    w.m.check_invariants()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_finalizer_run_inside_free_is_refused(flavour: str) -> None:
    in_child(case_finalizer_inside_free, flavour)


class Yielding(Hooked):
    """A request whose `num_computed_tokens` read lets other threads run."""

    @property  # type: ignore[override]
    def num_computed_tokens(self) -> int:
        time.sleep(0)
        return self.__dict__["_computed"]

    @num_computed_tokens.setter
    def num_computed_tokens(self, v: int) -> None:
        self.__dict__["_computed"] = v


def case_threads(flavour: str) -> dict[str, int]:
    """Three threads decode their own requests on one manager, their
    attribute reads yielding the GIL: every call succeeds or is refused with
    the RuntimeError naming the call in progress, and the tables match the
    allocations that succeeded."""
    w = World(flavour, num_blocks=200)
    m = w.m
    errors: list[str] = []
    tally = {"ok": 0, "refused": 0}
    reqs = [w.admit(Yielding(f"t{i}-{k}", range(1000 * i + 10 * k, 1000 * i + 10 * k + 5), BS))
            for i in range(3) for k in range(2)]
    lock = threading.Lock()

    def run(mine: list[Any]) -> None:
        for _ in range(40):
            for r in mine:
                if r.num_tokens + 2 >= 60:
                    continue
                r.append_output_token_ids(5)
                n = r.num_tokens - r.num_computed_tokens
                try:
                    out = m.allocate_slots(r, n)
                except RuntimeError as e:
                    with lock:
                        tally["refused"] += 1
                        if "panicked" in str(e) or "in progress" not in str(e):
                            errors.append(f"{type(e).__name__}: {e}")
                    continue
                except BaseException as e:  # a PanicException included
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}")
                    continue
                with lock:
                    tally["ok"] += 1
                if out is not None:
                    r.num_computed_tokens += n

    threads = [threading.Thread(target=run, args=(reqs[2 * i:2 * i + 2],)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    m.check_invariants()
    for r in reqs:
        held = len(m.get_block_ids(r.request_id)[0])
        need = -(-r.num_computed_tokens // BS)
        # A refused decode leaves its token uncomputed; the next one asks for it.
        assert need <= held <= -(-(r.num_computed_tokens + 1) // BS), (r.request_id, held, r.num_computed_tokens)
    return tally


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_threads_get_answers_or_a_clear_refusal(flavour: str) -> None:
    tally = in_child(case_threads, flavour)
    assert tally["ok"] > 0


# -- pure reads during a call ------------------------------------------------------------

# Reads of the manager a callback may make while a call is in progress.
READS: dict[str, Callable[[Any], Any]] = {
    "usage": lambda m: m.block_pool.get_usage(),
    "num_free": lambda m: m.block_pool.get_num_free_blocks(),
    "ref_cnt": lambda m: m.block_pool.blocks[1].ref_cnt,
    "block_hash": lambda m: m._native.block_hash(1),
    "get_block_ids": lambda m: m.get_block_ids("b"),
    "request_ids": lambda m: m._native.request_ids(),
    "free_queue": lambda m: m._native.free_queue(),
    "num_requests": lambda m: m._native.num_requests,
}


class Reads:
    """A hook that makes every read of READS and keeps each outcome."""

    def __init__(self, m: Any) -> None:
        self.m = m
        self.outcomes: dict[str, Any] = {}

    def __call__(self) -> None:
        for name, read in READS.items():
            try:
                self.outcomes[name] = ("ok", read(self.m))
            except BaseException as e:  # judged by the test
                self.outcomes[name] = ("raised", e)


def case_pure_reads_during_a_call(flavour: str, where: str) -> None:
    """A read of the manager from a callback of a call in progress (its
    pool, usage, a request's blocks) is served or refused with the guard's
    RuntimeError naming that call: never PyO3's "Already borrowed", and the
    outer call completes as a behaving caller's does."""
    twin = _world(flavour, where)
    expected = _outer(twin, where, None)()
    w = _world(flavour, where)
    reads = Reads(w.m)
    got = _outer(w, where, reads)()
    assert reads.outcomes, "the hostile object was never read: the case tests nothing"
    outer = OUTER_NAMES[where]
    for name, (kind, value) in reads.outcomes.items():
        if kind == "ok":
            continue
        assert isinstance(value, RuntimeError), f"{name} during {outer}: {type(value).__name__}: {value}"
        msg = str(value)
        assert "borrowed" not in msg and "panicked" not in msg, f"{name} during {outer}: {msg}"
        assert outer in msg, f"{name} during {outer}: the refusal does not name the call in progress: {msg}"
    assert got == expected, f"the outer call's result: {got!r}, a behaving caller's: {expected!r}"
    w.m.check_invariants()
    assert w.snap() == twin.snap(), "the state differs from a behaving caller's"


@pytest.mark.parametrize("where", ["decode_noop", "decode_new_block", "decode_hashes", "admit", "lookup",
                                   "cache_blocks", "decode_batch", "evict_index"])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_pure_reads_during_a_call_are_served_or_name_the_call(flavour: str, where: str) -> None:
    in_child(case_pure_reads_during_a_call, flavour, where)
