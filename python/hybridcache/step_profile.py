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
from typing import Any

from hybridcache.step_bench import Lockstep, StepConfig

class _Stopwatch:
    def __init__(self) -> None:
        self.ns = 0
        self.calls = 0
        self.on = False


def _timed_callable(fn: Callable[..., Any], watch: _Stopwatch) -> Callable[..., Any]:
    clock = time.perf_counter_ns

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            if watch.on:
                watch.ns += clock() - t0
                watch.calls += 1

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


class _TimedManager:
    """Forwards to the manager; the time inside its calls goes to a stopwatch."""

    def __init__(self, inner: Any, watch: _Stopwatch) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_watch", watch)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if callable(attr) and not name.startswith("__"):
            attr = _timed_callable(attr, self._watch)
            object.__setattr__(self, name, attr)  # wrap once
        return attr

    @property
    def usage(self) -> Any:
        return self._inner.usage


def profile_shares(cfg: StepConfig, variants: Sequence[str] = ("hybridcache", "hc+native")) -> dict[str, dict[str, float]]:
    """Share of each variant's step in the manager, in the token appends
    with their block hashing ("hashing"), and in the rest (vLLM's
    scheduler), from stopwatches around the manager's calls and each
    request's `append_output_token_ids`."""
    watches = {v: (_Stopwatch(), _Stopwatch()) for v in variants}

    def wrap(v: str, s: Any) -> None:
        s.kv_cache_manager = _TimedManager(s.kv_cache_manager, watches[v][0])

    run = Lockstep(cfg, variants, wrap=wrap)
    admit = run._admit

    def admit_timing_appends() -> None:
        # A new request's prompt is hashed when it is made, outside the timed
        # schedule() + update_from_output() (and outside the appends): not the
        # step's hashing. Its appends get a stopwatch, as an instance
        # attribute (hc+native's is the native method bound to the request).
        admit()
        for v in variants:
            for request in run.scheds[v].requests.values():
                if "_profile_append" not in request.__dict__:
                    request._profile_append = True
                    request.append_output_token_ids = _timed_callable(
                        request.append_output_token_ids, watches[v][1])

    run._admit = admit_timing_appends  # type: ignore[method-assign]
    steps = max(20, cfg.steps // 3)
    total = {v: 0 for v in variants}
    for i in range(cfg.warmup + steps):
        measuring = i >= cfg.warmup
        for m, h in watches.values():
            m.on = h.on = measuring
        ns = run.step(i)
        if measuring:
            for v in variants:
                total[v] += ns[v]
    inner, full = _stopwatch_overhead_ns()
    shares = {}
    for v in variants:
        m, h = watches[v]
        # The appends run inside update_from_output, never inside a manager
        # call. Each stopwatch's own cost is taken out of what it measured
        # and out of the step (the wrapper around it is not the scheduler's).
        manager = max(m.ns - m.calls * inner, 0.0)
        hashing = max(h.ns - h.calls * inner, 0.0)
        step = total[v] - (m.calls + h.calls) * full
        shares[v] = {"manager": manager / step, "hashing": hashing / step,
                     "scheduler": 1 - (manager + hashing) / step}
    return shares
