"""The bench's workload and its recording: `Workload` (one configuration:
model layout, batch size, trace shape) and `record`, which runs the shared
scheduler loop (`scheduler.SchedulerSim`) over hybridcache's manager on the
serving hot path (FCFS, recompute preemption, no connector, no encoder) and
writes every manager call down, with the request's state at that moment and
the result, for the wheel's timed replay (`hybridcache.tools.timed_replay`).
`Workload.release` picks the vLLM release: hybridcache's facade for it is
recorded, its scheduler's calls are the ones written down (`release_api`: the
partial-block-hits API adds `record_prefix_cache_stats`, `has_scheduled_reqs`,
the per-step drains and `cache_blocks` after outputs, and drops the
common-prefix query).

The wheel ships the recordings of the bench's default grid (`encode`, read by
`hybridcache.tools.bench_trace`); `hybridcache bench` records any other size
or seed live with this module.

  python -m hybridcache_dev.bench_trace [--check]

rewrites (or checks) python/hybridcache/traces/bench-*.json.xz.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import lzma
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridcache import releases
from hybridcache.request import Request
from hybridcache.tools.bench_trace import (
    ADMIT_KW,
    ALLOC_NEW,
    ALLOC_RUN,
    CACHE_BLOCKS,
    COMMON_PREFIX,
    CONFIGS,
    DRAINS,
    FREE,
    GET_BLOCKS,
    GET_COMPUTED,
    NEW_STEP,
    NO_BLOCKS,
    RECORD_STATS,
    RUNNING,
    STATEFUL,
    STATS,
    STEPS,
    TAKE_NEW_IDS,
    Op,
    Recording,
    request_tokens,
    shipped_name,
)
from hybridcache.tools.compare import norm_drained, norm_stats, norm_usage
from hybridcache.tools.release_api import ReleaseApi, release

from . import configs
from .configs import GroupSpec
from .scheduler import SchedulerSim, mamba_block_aligned_split, spelling
from .workload import Seq, bit_tokens, bursty_drafts, shared_prefix_len

TRACES = Path(__file__).resolve().parents[2] / "python" / "hybridcache" / "traces"



def manager_kwargs(running: int = 256, block_size: int = 16, max_model_len: int = 2048) -> dict[str, Any]:
    """The bench workloads' constructor keywords (the whole-block-hits API's
    spelling: `ReleaseApi.tool_kwargs` gives another release's form)."""
    return dict(max_model_len=max_model_len, scheduler_block_size=block_size, hash_block_size=block_size,
                max_num_batched_tokens=max(2048, min(16384, 16 * running)), enable_caching=True, use_eagle=False,
                log_stats=True, enable_kv_cache_events=False)


@dataclass(frozen=True)
class Workload:
    """One benchmark configuration: model layout, batch size and trace shape."""

    config: str = "full"
    running: int = 256  # max_num_seqs; the trace keeps about this many running
    steps: int = 300  # measured scheduler steps (after warm-up)
    seed: int = 0
    block_size: int = 16
    max_model_len: int = 2048
    min_prompt_len: int = 32
    max_prompt_len: int = 512
    min_output_len: int = 32
    max_output_len: int = 512
    num_shared_prefixes: int = 16
    min_shared_prefix_len: int = 64
    max_shared_prefix_len: int = 384
    shared_prefix_prob: float = 0.6
    max_drafts: int = 16
    no_draft_prob: float = 0.3
    abort_rate: float = 0.002  # per running request per step
    sliding_window: int = 128
    num_mamba_groups: int = 3
    # Pool: full-attention blocks for this many tokens per running request
    # (plus what the window / Mamba groups need), tight enough that the pool
    # runs dry now and then; None: 330 + 560 / sqrt(running) (usage spreads
    # less with more requests).
    pool_tokens_per_request: int | None = None
    # The vLLM release whose manager is compared and whose scheduler's calls
    # are recorded (`release_api`); hybridcache's facade for it is recorded.
    release: str = releases.DEFAULT.version

    def __post_init__(self) -> None:
        if self.config not in CONFIGS:
            raise ValueError(f"config must be one of {', '.join(CONFIGS)}, got {self.config!r}")
        if self.running <= 0 or self.steps <= 0:
            raise ValueError("running and steps must be positive")
        release(self.release)  # ValueError naming the releases the tools know

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.manager_kwargs()["max_num_batched_tokens"])

    @property
    def mamba_align(self) -> bool:
        return self.config == "full+3xmamba-align"

    @property
    def num_speculative_blocks(self) -> int:
        # vLLM sets MambaSpec.num_speculative_blocks = num_speculative_tokens.
        return self.max_drafts

    @property
    def warmup_steps(self) -> int:
        return 10 + math.ceil(self.running * 300 / self.max_num_batched_tokens)

    @property
    def num_blocks(self) -> int:
        bs = self.block_size
        tokens = self.pool_tokens_per_request or round(330 + 560 / math.sqrt(self.running))
        per_request = -(-tokens // bs)
        if self.config == "full+swa":
            per_request += -(-self.sliding_window // bs) + 1
        elif self.mamba_align:
            per_request += self.num_mamba_groups * (2 + self.num_speculative_blocks)
        return 1 + self.running * per_request + -(-self.max_model_len // bs)

    def groups(self) -> tuple[GroupSpec, ...]:
        """The model's KV-cache groups."""
        bs = self.block_size
        groups = [configs.full(bs)]
        if self.config == "full+swa":
            groups.append(configs.sliding_window(self.sliding_window, bs))
        elif self.mamba_align:
            groups += [configs.mamba("align", self.num_speculative_blocks, bs)] * self.num_mamba_groups
        return tuple(groups)

    @property
    def api(self) -> ReleaseApi:
        return release(self.release)

    def meta(self) -> dict[str, Any]:
        """What the timed replay needs of the workload (`Recording.meta`)."""
        return dict(config=self.config, running=self.running, steps=self.steps, seed=self.seed,
                    release=self.release, block_size=self.block_size, warmup_steps=self.warmup_steps,
                    num_blocks=self.num_blocks, groups=[dataclasses.asdict(g) for g in self.groups()],
                    kwargs=self.manager_kwargs(), drains=list(spelling(self.api).step_drains))

    def manager_kwargs(self) -> dict[str, Any]:
        """The constructor keywords (`manager_kwargs`)."""
        return manager_kwargs(self.running, self.block_size, self.max_model_len)


def hybridcache_kv_cache_config(w: Workload, num_blocks: int | None = None) -> Any:
    """hybridcache's own config objects for `w` (no vLLM, no torch)."""
    return configs.hybridcache_kv_cache_config(w.groups(), num_blocks or w.num_blocks)


def vllm_kv_cache_config(w: Workload, num_blocks: int | None = None) -> Any:
    """The same layout as vLLM's own config objects (imports vLLM and torch)."""
    return configs.vllm_kv_cache_config(w.groups(), num_blocks or w.num_blocks)




def make_hybridcache_manager(w: Workload) -> Any:
    """hybridcache's facade for `w.release`, on its own config classes."""
    return w.api.tool_facade(hybridcache_kv_cache_config(w), w.manager_kwargs())


def _ids(blocks: Any) -> Any:
    return NO_BLOCKS if blocks is None else blocks.get_block_ids()


def _running_ids(blocks: Any) -> Any:
    """What the scheduler reads of a running request's allocation
    (`_make_cached_request_data`): None when no group got a new block."""
    return NO_BLOCKS if blocks is None else blocks.get_block_ids(allow_none=True)


class Recorder(SchedulerSim):
    """The shared scheduler loop over one manager, writing every call down."""

    def __init__(self, w: Workload, manager: Any):
        super().__init__(random.Random(w.seed), w.max_num_batched_tokens, w.running, w.max_model_len)
        self.w = w
        self.m = manager
        self.api, self.calls = w.api, spelling(w.api)
        self.admit_kw = self.calls.admission_keywords
        self.drains = () if self.calls.queries_common_prefix else self.calls.step_drains
        self.cache_after_output = self.calls.caches_after_output(w.max_drafts)
        tokens = bit_tokens(self.rng)
        self.prefixes = [
            tokens(shared_prefix_len(self.rng, w.min_shared_prefix_len, w.max_shared_prefix_len, w.block_size))
            for _ in range(w.num_shared_prefixes)
        ]
        self.seqs: list[Seq] = []
        # Per request: (prefix index or -1, prefix tokens used, tokens drawn, prompt length)
        # and every token it may hold.
        self.shapes: list[tuple[int, int, int, int]] = []
        self.tokens: list[list[int]] = []
        self.ops: list[Op] = []
        self.counters = dict(finished=0, aborted=0, preemptions=0, admitted=0, hit_tokens=0,
                             failed_admissions=0, decode_allocs=0)

    # ---- workload ----------------------------------------------------------

    def arrive(self) -> None:
        w, rng = self.w, self.rng
        while len(self.waiting) < max(4, w.running // 8):
            n = rng.randint(w.min_prompt_len, w.max_prompt_len)
            k = rng.randrange(len(self.prefixes)) if rng.random() < w.shared_prefix_prob else -1
            shared = self.prefixes[k][:n] if k >= 0 else []
            idx = len(self.seqs)
            max_tokens = rng.randint(w.min_output_len, w.max_output_len)
            # A request's own tokens come from its own stream, so a recording ships without them.
            tokens = request_tokens(w.seed, idx, shared, n + max_tokens)
            seq = Seq(Request(f"req-{idx}", tokens[:n], w.block_size), max_tokens, index=idx)
            self.shapes.append((k, len(shared), len(tokens), n))
            self.tokens.append(tokens)
            self.seqs.append(seq)
            self.waiting.append(seq)

    def next_drafts(self, seq: Seq) -> int:
        return bursty_drafts(self.rng, self.w.max_drafts, self.w.no_draft_prob)

    # ---- recorded calls ------------------------------------------------------

    @staticmethod
    def _state(seq: Seq) -> tuple[int, int, int]:
        r = seq.req
        return (r.num_tokens, r.num_computed_tokens, r.num_preemptions)

    def _rec(self, code: int, idx: int, a: Any, b: Any, state: Any, expected: Any) -> None:
        self.ops.append((code, idx, a, b, state, expected))

    def new_step_starts(self) -> None:
        self.m.new_step_starts()
        self._rec(NEW_STEP, -1, None, None, None, None)

    def free(self, seq: Seq) -> None:
        self.m.free(seq.req)
        self._rec(FREE, seq.index, None, None, self._state(seq), None)

    def allocate_running(self, seq: Seq, n: int) -> Any:
        req = seq.req
        state = self._state(seq)
        decode = req.num_computed_tokens == req.num_tokens - 1
        blocks = self.m.allocate_slots(req, n, num_lookahead_tokens=0)
        self._rec(ALLOC_RUN, seq.index, n, decode, state, _running_ids(blocks))
        self.counters["decode_allocs"] += decode
        return blocks

    def split(self, req: Request, n: int, hit: int = 0) -> int:
        """vLLM's `Scheduler._mamba_block_aligned_split` (no EAGLE)."""
        if not self.w.mamba_align:
            return n
        return mamba_block_aligned_split(req, n, req.num_computed_tokens + hit, self.w.block_size)

    # ---- one scheduler step ----------------------------------------------------

    def before_schedule(self) -> None:
        """Aborts."""
        rng, w = self.rng, self.w
        k = int(w.abort_rate * len(self.running) + rng.random())
        for _ in range(min(k, len(self.running))):
            seq = self.running.pop(rng.randrange(len(self.running)))
            self.free(seq)
            self.counters["aborted"] += 1
        if self.waiting and rng.random() < w.abort_rate * 10:
            seq = self.waiting.pop(rng.randrange(len(self.waiting)))
            self.free(seq)  # holds nothing; vLLM frees it all the same
            self.counters["aborted"] += 1

    def after_schedule(self) -> None:
        if self.drains:
            # Later releases: no common-prefix query (always zeros); the drains every step.
            got = tuple(norm_drained(getattr(self.m, name)()) for name in self.drains)
            self._rec(DRAINS, -1, None, None, None, got)
            return
        if self.running:
            head = self.running[0]
            self._rec(COMMON_PREFIX, head.index, None, None, None,
                      list(self.m.get_num_common_prefix_blocks(head.rid)))
        if self.w.mamba_align:  # vLLM's needs_kv_cache_zeroing
            self._rec(TAKE_NEW_IDS, -1, None, None, None, list(self.m.take_new_block_ids()))

    def step(self) -> dict[Seq, int]:
        scheduled = super().step()
        stats = (norm_stats(self.m.make_prefix_cache_stats()), norm_usage(self.m.usage))
        self._rec(STATS, -1, None, None, None, stats)
        return scheduled

    def on_preempted(self, seq: Seq) -> None:
        self.counters["preemptions"] += 1

    def admit(self, seq: Seq, budget: int) -> int | None:
        req = seq.req
        state = self._state(seq)
        computed, hit = self.api.lookup(self.m, req)
        self._rec(GET_COMPUTED, seq.index, None, None, state, (_ids(computed), hit))
        n = min(req.num_tokens - hit, budget)
        if self.w.mamba_align:
            n = self.split(req, n, hit)
            if n == 0:
                return None
        kw = self.calls.admission_kwargs(bool(self.running))
        blocks = self.m.allocate_slots(req, n, num_new_computed_tokens=hit, new_computed_blocks=computed,
                                       num_lookahead_tokens=0, **kw)
        if self.admit_kw:
            self._rec(ADMIT_KW, seq.index, n, (hit, kw["has_scheduled_reqs"]), state, _ids(blocks))
        else:
            self._rec(ALLOC_NEW, seq.index, n, hit, state, _ids(blocks))
        if blocks is None:
            self.counters["failed_admissions"] += 1
            return None
        if self.calls.records_lookup_stats:
            self.m.record_prefix_cache_stats(req, hit)
            self._rec(RECORD_STATS, seq.index, hit, None, None, None)
        self._rec(GET_BLOCKS, seq.index, None, None, None, self.m.get_blocks(req.request_id).get_block_ids())
        req.num_computed_tokens = hit
        self.counters["admitted"] += 1
        self.counters["hit_tokens"] += hit
        return n

    def sample(self, seq: Seq, num_sampled: int) -> bool:
        w, req = self.w, seq.req
        room = min(seq.max_tokens - req.num_output_tokens, w.max_model_len - 1 - w.max_drafts - req.num_tokens)
        sampled = min(num_sampled, room)
        req.append_output_token_ids(self.tokens[seq.index][req.num_tokens:req.num_tokens + sampled])
        if self.cache_after_output:
            n = req.num_computed_tokens
            self.m.cache_blocks(req, n)
            self._rec(CACHE_BLOCKS, seq.index, n, None, self._state(seq), None)
        return sampled >= room

    def on_finished(self, seq: Seq) -> None:
        self.counters["finished"] += 1


def record(w: Workload, on_step: Callable[[], None] | None = None) -> Recording:
    """Runs the scheduler simulation once against hybridcache and records it."""
    start = time.perf_counter()
    rec = Recorder(w, make_hybridcache_manager(w))
    steps: list[list[Op]] = []
    free_after: list[int] = []
    running_after: list[int] = []
    counters: dict[str, list[int]] = {k: [] for k in rec.counters}
    for _ in range(w.warmup_steps + w.steps):
        rec.ops = []
        rec.step()
        steps.append(rec.ops)
        free_after.append(rec.m.block_pool.get_num_free_blocks())
        running_after.append(len(rec.running))
        for k, v in rec.counters.items():
            counters[k].append(v)
        if on_step:
            on_step()
    return Recording(
        meta=dict(w.meta(), prefixes=rec.prefixes, shapes=rec.shapes, counters_after_step=counters),
        steps=steps,
        free_after_step=free_after,
        running_after_step=running_after,
        request_ids=[s.req.request_id for s in rec.seqs],
        num_prompt_tokens=[s.req.num_prompt_tokens for s in rec.seqs],
        token_ids=[s.req.all_token_ids for s in rec.seqs],
        block_hashes=[s.req.block_hashes for s in rec.seqs],
        counters=dict(rec.counters),
        seconds=time.perf_counter() - start,
    )


def encode(rec: Recording) -> dict[str, Any]:
    """`rec` in the shipped form `hybridcache.tools.bench_trace.decode`
    reads: the workload, the requests' shapes (tokens are drawn again from
    their streams), the operations as integer columns (request index and
    state as deltas), each allocation's outcome (1: no blocks), each lookup's
    hit length, the free blocks and running requests after every step."""
    cols: dict[str, list[int]] = {name: [] for name in ("code", "idx", "a", "b", "tokens", "computed", "preempted",
                                                         "answer", "ops_per_step")}
    last: dict[int, tuple[int, int, int]] = {}
    prev_idx = -1
    for step in rec.steps:
        cols["ops_per_step"].append(len(step))
        for code, idx, a, b, state, expected in step:
            old = last.get(idx, (0, 0, 0))
            if code in STATEFUL:
                last[idx] = state
                # Computed tokens mostly advance with the tokens: their difference is stored.
                dt, dc, dp = (x - y for x, y in zip(state, old))
                delta = [dt, dc - dt, dp]
            else:
                delta = [0, 0, 0]
            if code in (ALLOC_NEW, ALLOC_RUN, ADMIT_KW):
                answer = int(expected == NO_BLOCKS)
            elif code == GET_COMPUTED:
                answer = expected[1]
            else:
                answer = 0
            b_int = int(b[0]) * 2 + int(b[1]) if code == ADMIT_KW else int(b or 0)
            a_int = a - state[1] if code == CACHE_BLOCKS else int(a or 0)  # cache_blocks(req, computed)
            row = [code, idx - prev_idx, a_int, b_int, *delta, answer]
            for name, value in zip(cols, row):
                cols[name].append(value)
            prev_idx = idx
    return dict(format=1, meta=rec.meta, columns=cols, free_after_step=rec.free_after_step,
                running_after_step=rec.running_after_step)


def shipped_workloads(version: str) -> list[Workload]:
    """The bench's default grid for vLLM `version` (--quick replays their first steps)."""
    row = releases.find(version)
    assert row is not None
    return [Workload(config=c, running=r, steps=STEPS, release=version)
            for c in CONFIGS if row.covers(c) for r in RUNNING]


def is_current(w: Workload) -> bool:
    """Whether the shipped recording of `w` is what `record` gives today."""
    path = TRACES / shipped_name(w.config, w.running, w.release)
    if not path.exists():
        return False
    shipped = json.loads(lzma.decompress(path.read_bytes()))
    return _without_release(shipped) == _without_release(json.loads(json.dumps(encode(record(w)))))


def stale(version: str) -> list[str]:
    """The shipped recordings that differ from what `record` gives for vLLM `version` today."""
    return [shipped_name(w.config, w.running, version) for w in shipped_workloads(version) if not is_current(w)]


def _without_release(data: dict[str, Any]) -> dict[str, Any]:
    return dict(data, meta={k: v for k, v in data["meta"].items() if k != "release"})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Record (or --check) the bench recordings the wheel ships.")
    parser.add_argument("--check", action="store_true", help="compare every release's recordings with the files")
    args = parser.parse_args(argv)
    if args.check:
        bad = [name for version in releases.SUPPORTED_VLLM_VERSIONS for name in stale(version)]
        print("\n".join(f"{name}: STALE" for name in bad) or "up to date")
        return 1 if bad else 0
    for version in {releases.of_profile(r.profile).version: None for r in releases.RELEASES}:
        for w in shipped_workloads(version):
            path = TRACES / shipped_name(w.config, w.running, version)
            blob = lzma.compress(json.dumps(encode(record(w)), separators=(",", ":")).encode(),
                                 preset=9 | lzma.PRESET_EXTREME)
            path.write_bytes(blob)
            print(f"wrote {path.name} ({len(blob):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
