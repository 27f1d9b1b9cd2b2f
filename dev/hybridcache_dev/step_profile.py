"""Where the whole scheduler step goes, for `hybridcache bench --step`: a
pass of the step bench's lockstep (not timed) with stopwatches around every
manager call and every request's `append_output_token_ids` (where the step
hashes a request's new blocks); their own cost is measured and taken out of
the shares.

The hasher itself is not wrapped: `install()`'s native append recognises
its native hasher and tests for a new block without calling it, and a
wrapper would send every token through a Python call instead, timing a path
that is never shipped. The appends are timed in every variant alike, so the
shares compare: vLLM's method (the list appends, then its hasher) against
the native one (the appends and the hashing in one call)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from hybridcache_dev.step_bench import Lockstep, StepConfig, gc_paused_steps

class _Stopwatch:
    def __init__(self) -> None:
        self.ns = 0
        self.calls = 0
        self.on = False


def _timed_callable(fn: Callable[..., Any], watch: _Stopwatch,
                    per_call: Callable[[int, Any], None] | None = None) -> Callable[..., Any]:
    """`fn` with its time inside going to `watch`; `per_call(ns, result)`
    gets each call's time and answer as well (per-method accounts)."""
    clock = time.perf_counter_ns

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        result = fn(*args, **kwargs)
        if watch.on:
            dt = clock() - t0
            watch.ns += dt
            watch.calls += 1
            if per_call is not None:
                per_call(dt, result)
        return result

    return timed


def _stopwatch_overhead_ns() -> tuple[float, float]:
    """What one stopwatch adds to a call: inside what it measures, and in all
    (the wrapper, the clock reads), so the shares can leave it out."""
    watch = _Stopwatch()
    watch.on = True
    timed = _timed_callable(_noop, watch)
    clock = time.perf_counter_ns
    inner = full = float("inf")
    for _ in range(5):
        t0 = clock()
        for _ in range(2000):
            _noop()
        bare = clock() - t0
        watch.ns = 0
        t0 = clock()
        for _ in range(2000):
            timed()
        wrapped = clock() - t0
        inner = min(inner, (watch.ns - bare) / 2000)
        full = min(full, (wrapped - bare) / 2000)
    return max(inner, 0.0), max(full, 0.0)


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def allocation_kind(result: Any) -> str:
    """`allocate_slots` split by its answer: a decode that hands out blocks
    costs a manager far more than one that hands out none."""
    if result is None:
        return "allocate_slots (None)"
    if any(result.get_block_ids()):
        return "allocate_slots (new blocks)"
    return "allocate_slots (no new block)"


class _TimedManager:
    """Forwards to the manager; the time inside its calls goes to a
    stopwatch, and per method (`allocate_slots` by its answer) to `methods`."""

    def __init__(self, inner: Any, watch: _Stopwatch, methods: dict[str, _Stopwatch]) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_watch", watch)
        object.__setattr__(self, "_methods", methods)

    def _account(self, name: str) -> Callable[[int, Any], None]:
        methods = self._methods

        def add(ns: int, result: Any) -> None:
            key = allocation_kind(result) if name == "allocate_slots" else name
            w = methods.setdefault(key, _Stopwatch())
            w.ns += ns
            w.calls += 1

        return add

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if callable(attr) and not name.startswith("__"):
            attr = _timed_callable(attr, self._watch, self._account(name))
            object.__setattr__(self, name, attr)  # wrap once
        return attr

    @property
    def usage(self) -> Any:
        return self._inner.usage


class StepProfile(NamedTuple):
    """`profile_step`'s accounts, per variant."""

    # Each profiled variant's shares of its step: manager, hashing, scheduler.
    shares: dict[str, dict[str, float]]
    # Per manager method: calls per step, ns per call (the floor's too).
    calls: dict[str, dict[str, dict[str, float]]]
    # µs per step of the whole step and of the manager's calls (the floor's
    # too), the stopwatches' own cost taken out.
    totals: dict[str, dict[str, float]]


def profile_step(cfg: StepConfig, variants: Sequence[str] = ("hybridcache", "hc+native"),
                 recording: Any = None) -> StepProfile:
    """The profiled pass: each variant's shares of its step in the manager,
    in the token appends with their block hashing ("hashing"), and in the
    rest (vLLM's scheduler), from stopwatches around the manager's calls and
    each request's `append_output_token_ids`; and, per manager method, calls
    per step and ns per call in situ, for those variants and (given the stock
    run's `recording`) the floor, whose manager calls are the least any
    drop-in manager's cost there."""
    timed = tuple(variants) + (("floor",) if recording is not None else ())
    watches = {v: (_Stopwatch(), _Stopwatch()) for v in timed}
    methods: dict[str, dict[str, _Stopwatch]] = {v: {} for v in timed}

    def wrap(v: str, s: Any) -> None:
        s.kv_cache_manager = _TimedManager(s.kv_cache_manager, watches[v][0], methods[v])

    run = Lockstep(cfg, timed, recording, wrap=wrap)
    admit = run._admit

    def admit_timing_appends() -> None:
        # A new request's prompt is hashed when it is made, outside the timed
        # schedule() + update_from_output() (and outside the appends): not the
        # step's hashing. Its appends get a stopwatch, as an instance
        # attribute (hc+native's is the native method bound to the request).
        admit()
        for v in timed:
            for request in run.scheds[v].requests.values():
                if "_profile_append" not in request.__dict__:
                    request._profile_append = True
                    request.append_output_token_ids = _timed_callable(
                        request.append_output_token_ids, watches[v][1])

    run._admit = admit_timing_appends  # type: ignore[method-assign]
    # A third of the timed steps, at least 20; no more than were recorded.
    steps = min(cfg.steps, max(20, cfg.steps // 3))
    total = {v: 0 for v in timed}

    def switch(i: int) -> None:
        for m, h in watches.values():
            m.on = h.on = i >= cfg.warmup

    # The GC as in the timed run: a collection inside one variant's step
    # would be charged to it.
    for i, ns in gc_paused_steps(run, cfg.warmup + steps, before=switch):
        if i >= cfg.warmup:
            for v in timed:
                total[v] += ns[v]
    inner, full = _stopwatch_overhead_ns()
    shares, totals = {}, {}
    for v in timed:
        m, h = watches[v]
        # The appends run inside update_from_output, never inside a manager
        # call. Each stopwatch's own cost is taken out of what it measured
        # and out of the step (the wrapper around it is not the scheduler's).
        manager = max(m.ns - m.calls * inner, 0.0)
        hashing = max(h.ns - h.calls * inner, 0.0)
        step = total[v] - (m.calls + h.calls) * full
        totals[v] = {"step_us": step / steps / 1000, "manager_us": manager / steps / 1000}
        if v in variants:
            shares[v] = {"manager": manager / step, "hashing": hashing / step,
                         "scheduler": 1 - (manager + hashing) / step}
    calls = {v: {name: {"calls_per_step": w.calls / steps,
                        "ns_per_call": max(w.ns / w.calls - inner, 0.0)}
                 for name, w in methods[v].items() if w.calls}
             for v in timed}
    return StepProfile(shares, calls, totals)


def excess_over_floor(calls: dict[str, dict[str, dict[str, float]]], variant: str = "hybridcache",
                      top: int = 6) -> list[tuple[str, float, float, float, float]]:
    """Per manager method, where `variant`'s calls cost more than the
    floor's (`profile_step`'s accounts): (method, calls per step, ns per
    call of the variant, of the floor, us per step over the floor), the
    largest excess first."""
    mine, floor = calls.get(variant, {}), calls.get("floor", {})
    rows = []
    for name, c in mine.items():
        base = floor.get(name, {"ns_per_call": 0.0})["ns_per_call"]
        over = c["calls_per_step"] * (c["ns_per_call"] - base) / 1000
        rows.append((name, c["calls_per_step"], c["ns_per_call"], base, over))
    return sorted(rows, key=lambda r: -r[4])[:top]


def excess_split(totals: dict[str, dict[str, float]], variant: str = "hybridcache") -> tuple[float, float, float]:
    """`variant`'s step over the floor's in the profiled pass (`StepProfile.totals`),
    in µs per step: in all, inside the manager's calls, and outside them
    (vLLM's own code running slower or faster around those calls)."""
    mine, floor = totals[variant], totals["floor"]
    over = mine["step_us"] - floor["step_us"]
    inside = mine["manager_us"] - floor["manager_us"]
    return over, inside, over - inside
