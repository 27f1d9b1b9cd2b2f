"""Timed replay of a bench recording (`bench_trace.Recording`) against fresh
managers of each implementation, alternating implementations every few steps
(ABBA order) so machine noise hits both. Only the manager calls are timed;
every result must agree with the recording (a shipped one keeps whether each
allocation got blocks and each lookup's hit length) and equal the other
implementations' results (else `BenchDivergence`)."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .bench_trace import (ADMIT_KW, ALLOC_NEW, ALLOC_RUN, BLOCKS, CACHE_BLOCKS, COMMON_PREFIX, DRAINS, FREE, GET_BLOCKS,
                          GET_COMPUTED, NEW_STEP, NO_BLOCKS, OP_NAMES, RECORD_STATS, TAKE_NEW_IDS, Op, Recording)
from .compare import norm_drained, norm_stats, norm_usage, same, same_ids

# Timing buckets.
KINDS = ("decode_allocate_slots", "prefill_allocate_slots", "admit_allocate_slots", "get_computed_blocks",
         "get_blocks", "free", "other")


class ReplayRequest:
    """What a manager reads of a request; state is set from the recording
    before each call. Tokens and block hashes only ever grow."""

    __slots__ = ("request_id", "num_tokens", "num_computed_tokens", "num_preemptions", "num_prompt_tokens",
                 "block_hashes", "_all_hashes", "all_token_ids", "prompt_token_ids", "lora_request",
                 "cache_salt", "skip_reading_prefix_cache", "mm_features", "prompt_embeds", "spec_token_ids",
                 # read by the partial-block-hits manager (no async steps, watermark 0, one lookup boundary)
                 "num_in_flight_tokens", "shared_prefix_boundary", "status", "session_id",
                 # the hit-limit read gate's bound (None: unbounded)
                 "prefix_cache_hit_limit")

    def __init__(self, rid: str, num_prompt_tokens: int, token_ids: list[int], hashes: list[bytes]):
        self.request_id = rid
        self.num_tokens = num_prompt_tokens
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.num_prompt_tokens = num_prompt_tokens
        self.block_hashes: list[bytes] = []
        self._all_hashes = hashes
        self.all_token_ids = token_ids
        self.prompt_token_ids = token_ids[:num_prompt_tokens]
        self.lora_request = None
        self.cache_salt = None
        self.skip_reading_prefix_cache = False
        self.mm_features: list[Any] = []
        self.prompt_embeds = None
        self.spec_token_ids: list[int] = []
        self.num_in_flight_tokens = 0
        self.shared_prefix_boundary = 0
        self.status = None
        self.session_id = None
        self.prefix_cache_hit_limit = None

    def get_max_cache_hit_length(self, bound: int | None = None) -> int:
        """The longest hit the hit-limit gate allows: the least of `num_tokens - 1`, the limit and `bound`."""
        limits = (self.num_tokens - 1, self.prefix_cache_hit_limit, bound)
        return min(limit for limit in limits if limit is not None)


class BenchDivergence(AssertionError):
    """An implementation's answer differs from the recording's or the other's."""


@dataclass
class Impl:
    name: str
    manager: Any
    reqs: list[ReplayRequest]
    block_size: int
    computed: dict[int, Any] = field(default_factory=dict)
    step_ns: list[int] = field(default_factory=list)
    kind_ns: dict[str, list[int]] = field(default_factory=lambda: {k: [] for k in KINDS})
    # Calls made before the first measured step, per kind.
    kind_warmup: dict[str, int] = field(default_factory=dict)
    timer_overhead_ns: int = 0


def new_impl(name: str, factory: Callable[[Recording], Any], rec: Recording) -> Impl:
    reqs = [
        ReplayRequest(rid, p, t, h)
        for rid, p, t, h in zip(rec.request_ids, rec.num_prompt_tokens, rec.token_ids, rec.block_hashes)
    ]
    return Impl(name, factory(rec), reqs, rec.meta["block_size"])


def _diverged(impl: Impl, step: int, op: Op, got: Any, expected: Any, what: str = "the recording") -> BenchDivergence:
    rid = impl.reqs[op[1]].request_id if op[1] >= 0 else "-"
    return BenchDivergence(
        f"{impl.name} differs from {what} at step {step}, {OP_NAMES[op[0]]}({rid}, {op[2]!r}, {op[3]!r}):\n"
        f"  expected {expected!r}\n  got      {got!r}"
    )


def _agrees(got: Any, expected: Any) -> bool:
    """A result against the recording's: None, `BLOCKS` and `(BLOCKS, hit)`
    stand for what a shipped recording leaves out."""
    if expected is None or got == expected:
        return True
    if expected == BLOCKS:
        return got != NO_BLOCKS
    if isinstance(expected, tuple) and expected[0] == BLOCKS:
        return got[1] == expected[1]
    return same_ids(got, expected)


CLOCKS: dict[str, Callable[[], int]] = {"perf_counter": time.perf_counter_ns, "thread_time": time.thread_time_ns}


def timer_overhead_ns(clock: Callable[[], int], samples: int = 20_000) -> int:
    """Median of an empty timed interval: subtracted from every timed call."""
    deltas = []
    for _ in range(samples):
        t0 = clock()
        deltas.append(clock() - t0)
    deltas.sort()
    return deltas[len(deltas) // 2]


def _cold_call(impl: Impl, code: int, idx: int, req: Any, a: Any, b: Any, drains: Sequence[str]) -> tuple[
        Callable[..., Any], tuple[Any, ...], dict[str, Any], str, Callable[[Any], Any]]:
    """(method, args, keywords, timing bucket, how its answer is read): one
    of the calls a step makes a few of. The method is bound, and its
    arguments built, before the timer starts."""
    m, computed = impl.manager, impl.computed
    if code in (ALLOC_NEW, ADMIT_KW):
        hit, extra = (b, {}) if code == ALLOC_NEW else (b[0], {"has_scheduled_reqs": b[1]})
        kw = dict(num_new_computed_tokens=hit, new_computed_blocks=computed.pop(idx), num_lookahead_tokens=0, **extra)
        return (m.allocate_slots, (req, a), kw, "admit_allocate_slots",
                lambda r: NO_BLOCKS if r is None else r.get_block_ids())
    if code == GET_COMPUTED:
        def read(found: Any) -> Any:
            blocks = computed[idx] = found[0]
            if len(found) > 2:  # the partial-block-hits lookup's shared-prefix boundary
                req.shared_prefix_boundary = found[2]
            return (blocks.get_block_ids(), found[1])
        return m.get_computed_blocks, (req,), {}, "get_computed_blocks", read
    if code == GET_BLOCKS:  # the scheduler reads the ids of what it gets
        return lambda rid: m.get_blocks(rid).get_block_ids(), (req.request_id,), {}, "get_blocks", same
    if code == FREE:
        computed.pop(idx, None)
        return m.free, (req,), {}, "free", same
    if code == RECORD_STATS:
        return m.record_prefix_cache_stats, (req, a), {}, "other", same
    if code == DRAINS:
        return lambda: [getattr(m, name)() for name in drains], (), {}, "other", lambda r: tuple(map(norm_drained, r))
    if code == NEW_STEP:
        return m.new_step_starts, (), {}, "other", same
    if code == COMMON_PREFIX:
        return m.get_num_common_prefix_blocks, (req.request_id,), {}, "other", list
    if code == TAKE_NEW_IDS:
        return m.take_new_block_ids, (), {}, "other", list
    # STATS: what the scheduler's make_stats reads
    return (lambda: (m.make_prefix_cache_stats(), m.usage), (), {}, "other",
            lambda r: (norm_stats(r[0]), norm_usage(r[1])))


def _replay_steps(
    impl: Impl, rec: Recording, first: int, last: int, clock: Callable[[], int], overhead: int,
    answers: list[Any], reference: str | None,
) -> None:
    """Replays steps [first, last) on `impl`, timing each manager call. The
    results go to `answers`, or, with the name of the implementation that
    ran these steps first, are compared with its `answers`."""
    m, reqs, bs, kind = impl.manager, impl.reqs, impl.block_size, impl.kind_ns
    decode_ns, prefill_ns, other_ns = kind["decode_allocate_slots"], kind["prefill_allocate_slots"], kind["other"]
    warmup, drains = rec.meta["warmup_steps"], rec.meta["drains"]
    j = 0
    for s in range(first, last):
        if s == warmup:
            impl.kind_warmup = {k: len(v) for k, v in kind.items()}
        total = 0
        for op in rec.steps[s]:
            code, idx, a, b, state, expected = op
            req: Any = reqs[idx] if idx >= 0 else None
            if state is not None:
                num_tokens, req.num_computed_tokens, req.num_preemptions = state
                req.num_tokens = num_tokens
                hashes = req.block_hashes
                need = num_tokens // bs
                if len(hashes) < need:
                    hashes.extend(req._all_hashes[len(hashes):need])
            # The calls made once per running request each step are spelled
            # out: no dispatch inside their timed interval.
            if code == ALLOC_RUN:
                t0 = clock()
                blocks = m.allocate_slots(req, a, num_lookahead_tokens=0)
                got = NO_BLOCKS if blocks is None else blocks.get_block_ids(allow_none=True)
                dt = clock() - t0
                bucket = decode_ns if b else prefill_ns
            elif code == CACHE_BLOCKS:
                t0 = clock()
                got = m.cache_blocks(req, a)
                dt = clock() - t0
                bucket = other_ns
            else:
                fn, args, kw, name, read = _cold_call(impl, code, idx, req, a, b, drains)
                t0 = clock()
                answer = fn(*args, **kw)
                dt = clock() - t0
                got, bucket = read(answer), kind[name]
            dt = max(0, dt - overhead)
            bucket.append(dt)
            total += dt
            if not _agrees(got, expected):
                raise _diverged(impl, s, op, got, expected)
            if reference is None:
                answers.append(got)
            elif got != answers[j] and not same_ids(got, answers[j]):
                raise _diverged(impl, s, op, got, answers[j], reference)
            j += 1
        impl.step_ns.append(total)
        free = m.block_pool.get_num_free_blocks()
        if free != rec.free_after_step[s]:
            raise BenchDivergence(
                f"{impl.name}: {free} free blocks after step {s}, the recording has {rec.free_after_step[s]}"
            )


def replay_timed(
    rec: Recording,
    factories: Sequence[tuple[str, Callable[[Recording], Any]]],
    chunk_steps: int = 8,
    clock: str = "perf_counter",
    on_chunk: Callable[[int], None] | None = None,
) -> list[Impl]:
    """Replays `rec` against every implementation, alternating chunks of
    steps (ABBA order), each call timed; raises BenchDivergence."""
    impls = [new_impl(name, factory, rec) for name, factory in factories]
    timer = CLOCKS[clock]
    overhead = timer_overhead_ns(timer)
    for impl in impls:
        impl.timer_overhead_ns = overhead
    n = len(rec.steps)
    gc.collect()
    was_enabled = gc.isenabled()
    try:
        for k, first in enumerate(range(0, n, chunk_steps)):
            last = min(n, first + chunk_steps)
            order = impls if k % 2 == 0 else impls[::-1]
            answers: list[Any] = []
            for impl in order:
                gc.disable()
                try:
                    reference = None if impl is order[0] else order[0].name
                    _replay_steps(impl, rec, first, last, timer, overhead, answers, reference)
                finally:
                    if was_enabled:
                        gc.enable()
                gc.collect(0)
                if on_chunk:
                    on_chunk(last - first)
    finally:
        if was_enabled:
            gc.enable()
    return impls


# --------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------


def summary_us(values_ns: Sequence[int]) -> dict[str, float | int | None]:
    """Count, mean, p50 and p90 (linear interpolation between the closest ranks), in µs."""
    if not values_ns:
        return {"count": 0, "mean_us": None, "p50_us": None, "p90_us": None}
    deciles = statistics.quantiles(values_ns, n=10, method="inclusive") if len(values_ns) > 1 else [values_ns[0]] * 9
    return {"count": len(values_ns), "mean_us": statistics.fmean(values_ns) / 1e3, "p50_us": deciles[4] / 1e3,
            "p90_us": deciles[8] / 1e3}


def impl_result(impl: Impl, warmup: int, series: bool = False) -> dict[str, Any]:
    """The measured steps' and calls' summaries (and every step's µs, warm-up included, with `series`)."""
    calls = {k: summary_us(v[impl.kind_warmup.get(k, len(v)):]) for k, v in impl.kind_ns.items()}
    out = {"step": summary_us(impl.step_ns[warmup:]), "calls": calls}
    return {**out, "step_us_all": [x / 1e3 for x in impl.step_ns]} if series else out


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


