"""One scheduler simulation: the loop of vLLM's ``Scheduler.schedule``
(FCFS, recompute preemption of the newest running request, no admissions in a
step that preempted, draft tokens scheduled with decodes and accepted at
random), without the model. Subclasses say how a call reaches the manager(s)
and what else a step does:

- `simulation.ReplaySimulation` (``hybridcache replay``,
  the parity tests): every public manager call, connector tokens, async
  loads, aborts, evictions and resets, each call fanned out to several
  managers and compared;
- `bench_trace.Recorder` (``hybridcache bench``): the
  serving hot path on one manager, every call written down for timed replay.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from hybridcache.request import Request

from .workload import Seq


@dataclass(frozen=True)
class Spelling:
    """The scheduler calls a core profile spells its own way."""

    # Whether the scheduler records a lookup's stats after admitting on it.
    records_lookup_stats: bool
    # Whether the scheduler reads get_num_common_prefix_blocks.
    queries_common_prefix: bool
    # The manager's drain calls the scheduler makes every step, after scheduling (in order).
    step_drains: tuple[str, ...]
    # Whether an admission passes `has_scheduled_reqs`.
    admission_keywords: bool
    # Whether the scheduler calls `cache_blocks(request, computed)` after each
    # running request's sampled output when speculative decoding is on.
    caches_after_spec_output: bool

    def admission_kwargs(self, has_running: bool) -> dict[str, Any]:
        """The `allocate_slots` keywords a waiting request's admission adds."""
        return {"has_scheduled_reqs": has_running} if self.admission_keywords else {}

    def caches_after_output(self, num_spec_tokens: int) -> bool:
        return self.caches_after_spec_output and num_spec_tokens > 0


SPELLINGS = {
    "whole-block-hits": Spelling(False, True, ("take_new_block_ids",), False, False),
    "partial-block-hits": Spelling(True, False, ("take_boundary_state_offloads", "take_kv_cache_block_copies",
                                                 "take_new_block_ids"), True, True),
}


def spelling(api: Any) -> Spelling:
    """The spelling of the scheduler of `api`'s release (`hybridcache.tools.release_api`)."""
    return SPELLINGS[api.profile]


def mamba_block_aligned_split(
    req: Request, num_new_tokens: int, num_computed: int, block_size: int, use_eagle: bool = False
) -> int:
    """vLLM's ``Scheduler._mamba_block_aligned_split`` (Mamba "align"
    mode): non-final prefill chunks end on block boundaries, and the chunk that
    crosses the last boundary stops there (its state is cached).
    `num_computed` counts local hits and external tokens as computed."""
    if num_computed < max(req.num_prompt_tokens, req.num_tokens - 1):
        bs = block_size
        last_cache_position = req.num_tokens - req.num_tokens % bs
        if use_eagle:  # EAGLE prunes the last matched block
            last_cache_position = max(last_cache_position - bs, 0)
        after = num_computed + num_new_tokens
        if after < last_cache_position:
            num_new_tokens = num_new_tokens // bs * bs
        elif num_computed < last_cache_position < after:
            # Force caching the state at the last block boundary.
            num_new_tokens = last_cache_position - num_computed
    return num_new_tokens


class SchedulerSim:
    """The scheduling loop; subclasses implement the manager calls (hooks)."""

    def __init__(self, rng: random.Random, max_num_batched_tokens: int, max_running: int, max_model_len: int):
        self.rng = rng
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_running = max_running
        self.max_model_len = max_model_len
        self.waiting: list[Seq] = []
        self.running: list[Seq] = []
        self.preempted_this_step = False

    # ---- one step -------------------------------------------------------

    def step(self) -> dict[Seq, int]:
        """One scheduler step; returns the tokens scheduled per request."""
        self.arrive()
        self.new_step_starts()
        self.before_schedule()
        scheduled: dict[Seq, int] = {}
        self.preempted_this_step = False
        budget = self.schedule_running(scheduled, self.max_num_batched_tokens)
        if not self.preempted_this_step:  # as vLLM: no admissions after preempting
            self.schedule_waiting(scheduled, budget)
        self.after_schedule()
        self.apply_outputs(scheduled)
        return scheduled

    def schedule_running(self, scheduled: dict[Seq, int], budget: int) -> int:
        """Mirrors the RUNNING loop of vLLM's schedule(); returns the budget left."""
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            req = seq.req
            n = req.num_tokens + seq.drafts - req.num_computed_tokens
            n = min(n, budget, self.max_model_len - 1 - req.num_computed_tokens)
            if n > 0:
                n = self.split(req, n)
            if n <= 0:
                index += 1
                continue
            if self.allocate_or_preempt(seq, n) is None:
                break
            scheduled[seq] = n
            budget -= n
            index += 1
        return budget

    def allocate_or_preempt(self, seq: Seq, n: int) -> Any:
        """Preempt the newest running request until `seq` fits or is preempted."""
        while True:
            blocks = self.allocate_running(seq, n)
            if blocks is not None:
                return blocks
            victim = self.running.pop()
            self.preempt(victim)
            if victim is seq:
                return None

    def preempt(self, seq: Seq) -> None:
        """Recompute preemption: free, forget the computed tokens, requeue first."""
        self.free(seq)
        seq.req.num_computed_tokens = 0
        seq.req.num_preemptions += 1
        seq.drafts = 0
        self.waiting.insert(0, seq)
        self.preempted_this_step = True
        self.on_preempted(seq)

    def schedule_waiting(self, scheduled: dict[Seq, int], budget: int) -> None:
        """Mirrors the WAITING loop: admit in order until one does not fit."""
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            seq = self.waiting[0]
            admitted = self.admit(seq, budget)
            if admitted is None:
                break
            self.waiting.pop(0)
            if admitted == 0:  # an async load started; no compute this step
                self.start_loading(seq)
                continue
            self.running.append(seq)
            scheduled[seq] = admitted
            budget -= admitted

    def apply_outputs(self, scheduled: dict[Seq, int]) -> None:
        """Advance computed tokens, sample, accept drafts and finish requests."""
        for seq in list(self.running):
            n = scheduled.get(seq)
            if n is None:
                continue
            req = seq.req
            req.num_computed_tokens += n
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk: nothing sampled yet
            num_drafts = req.num_computed_tokens - req.num_tokens
            self.on_drafts(num_drafts)
            accepted = self.rng.randint(0, num_drafts)
            req.num_computed_tokens -= num_drafts - accepted
            if self.sample(seq, accepted + 1):
                self.running.remove(seq)
                self.free(seq)
                self.on_finished(seq)
            else:
                seq.drafts = self.next_drafts(seq)

    # ---- hooks ------------------------------------------------------------

    def arrive(self) -> None:
        """New requests join `waiting`."""

    def new_step_starts(self) -> None:
        """The manager's new_step_starts()."""

    def before_schedule(self) -> None:
        """Out-of-band work before scheduling (aborts, loads, ...)."""

    def after_schedule(self) -> None:
        """What the scheduler reads of the manager after scheduling."""

    def split(self, req: Request, n: int) -> int:
        """The chunk a running request may compute of `n` tokens."""
        return n

    def allocate_running(self, seq: Seq, n: int) -> Any:
        """allocate_slots for a running request; None if it does not fit."""
        raise NotImplementedError

    def admit(self, seq: Seq, budget: int) -> int | None:
        """Allocate for the head waiting request: tokens scheduled (0: an async
        load started), or None if it cannot be admitted now."""
        raise NotImplementedError

    def start_loading(self, seq: Seq) -> None:
        raise NotImplementedError

    def free(self, seq: Seq) -> None:
        raise NotImplementedError

    def sample(self, seq: Seq, num_sampled: int) -> bool:
        """Appends the sampled tokens; True if the request stops."""
        raise NotImplementedError

    def next_drafts(self, seq: Seq) -> int:
        return 0

    def on_drafts(self, num_drafts: int) -> None:
        pass

    def on_preempted(self, seq: Seq) -> None:
        pass

    def on_finished(self, seq: Seq) -> None:
        pass
