"""The replay's full-API scheduler simulation: `ReplaySimulation` drives
every public call of vLLM's v1 ``KVCacheManager`` API the way vLLM's
``Scheduler.schedule`` does (the loop is `scheduler.SchedulerSim`): prefix-cache
lookups, chunked prefill, speculative decoding with changing draft counts,
EAGLE lookahead, external (connector) tokens, delayed caching, preemption,
aborts, evictions and prefix-cache resets. Every call goes through a
`compare.Fanout`, so several managers see the same request objects and every
output is compared. For the partial-block-hits API (`release_api`) the
requests are that release's own and the calls that changed are spelled as
its scheduler issues them (3-tuple lookup, `record_prefix_cache_stats` at
admission, `has_scheduled_reqs`, the per-step drains, events and stats
compared in full)."""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass
from typing import Any

from hybridcache import releases
from hybridcache.request import Request
from hybridcache.tools.compare import Fanout
from hybridcache.tools.release_api import ReleaseApi, release
from hybridcache.tools.trace import Runner

from .replay_config import ReplayConfig
from .scheduler import SchedulerSim, mamba_block_aligned_split, spelling
from .workload import Seq, drifting_drafts, prompt_with_prefix, shared_prefix_len, vocab_tokens


@dataclass
class ReplaySummary:
    seed: int
    steps: int = 0
    ops: int = 0
    finished: int = 0
    aborted: int = 0
    preemptions: int = 0
    cache_hit_tokens: int = 0
    events: int = 0
    failed_allocations: int = 0
    evict_calls: int = 0
    successful_resets: int = 0
    stalls: int = 0
    # Requests admitted with a local prefix-cache hit.
    hit_requests: int = 0
    # Scheduled draft tokens (speculative decoding).
    draft_tokens: int = 0
    external_tokens: int = 0
    async_loads: int = 0
    # Mamba "align": chunks shortened to a block boundary / not scheduled.
    split_trims: int = 0
    split_blocked: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)



def _later_group_free_hit(blocks: Any) -> bool:
    """A hit block of group 1+ sits free in the pool (ref count 0)."""
    if blocks is None:
        return False
    return any(not b.is_null and b.ref_cnt == 0 for group in blocks.blocks[1:] for b in group)


class ReplaySimulation(SchedulerSim):
    """One seeded trace of `config`, every call through `fanout`, spelled as
    the scheduler of vLLM release `api` issues it (default: the oldest): its
    requests, its lookup and admission calls, its per-step drains, its
    events and stats."""

    def __init__(self, config: ReplayConfig, seed: int, fanout: Fanout, api: ReleaseApi | None = None,
                 runner: type[Runner] = Runner):
        super().__init__(random.Random(seed), config.max_num_batched_tokens, config.max_running, config.max_model_len)
        self.cfg = config
        self.fan = fanout
        self.api = api or release(releases.DEFAULT.version)
        self.ops = runner(fanout, self.api)
        self.calls = spelling(self.api)
        # Every request made: (seq, LoRA id, cache salt, skip_reading_prefix_cache).
        self.created: list[tuple[Seq, int | None, str | None, bool]] = []
        self._tokens = vocab_tokens(self.rng, config.vocab_size)
        self.summary = ReplaySummary(seed=seed)
        self.prefixes = [self._prefix() for _ in range(config.num_shared_prefixes)]
        self.prompts: list[list[int]] = []
        self.next_req = 0
        self.freed_ids: list[str] = []
        self.loading: list[Seq] = []  # async KV loads in flight
        self.idle_steps = 0

    # ---- workload -------------------------------------------------------

    def _prefix(self) -> list[int]:
        cfg = self.cfg
        hi = min(cfg.max_shared_prefix_len, cfg.max_prompt_len)
        n = shared_prefix_len(self.rng, 1, hi, cfg.scheduler_block_size)
        return self._tokens(min(n, cfg.max_prompt_len))

    def _prompt(self) -> list[int]:
        cfg, rng = self.cfg, self.rng
        if self.prompts and rng.random() < cfg.duplicate_prompt_prob:
            return list(rng.choice(self.prompts))
        n = rng.randint(cfg.min_prompt_len, cfg.max_prompt_len)
        prompt = prompt_with_prefix(rng, self._tokens, n, self.prefixes, cfg.shared_prefix_prob)
        self.prompts.append(prompt)
        return prompt

    def _new_seq(self) -> Seq:
        cfg, rng = self.cfg, self.rng
        lora_id = rng.randint(1, 2) if rng.random() < cfg.lora_prob else None
        salt = f"salt{rng.randint(0, 1)}" if rng.random() < cfg.cache_salt_prob else None
        rid, prompt = self._request_id(), self._prompt()
        skip = rng.random() < cfg.skip_prefix_cache_prob
        req = self.api.tool_request(rid, prompt, cfg.hash_block_size, cfg.max_model_len,
                                    lora_id=lora_id, cache_salt=salt, skip_reading_prefix_cache=skip)
        seq = Seq(req, max_tokens=rng.randint(1, cfg.max_output_len), index=len(self.created))
        self.created.append((seq, lora_id, salt, skip))
        self.next_req += 1
        if cfg.has_cross_attention:
            seq.encoder_tokens = rng.randint(1, cfg.max_encoder_len)
        return seq

    def _request_id(self) -> str:
        if self.freed_ids and self.rng.random() < self.cfg.reuse_request_id_prob:
            return self.freed_ids.pop(self.rng.randrange(len(self.freed_ids)))
        return f"req-{self.next_req}"

    def arrive(self) -> None:
        for _ in range(self.rng.randint(0, self.cfg.max_arrivals_per_step)):
            if self.next_req < self.cfg.num_requests:
                self.waiting.append(self._new_seq())

    def _done(self) -> bool:
        return self.next_req >= self.cfg.num_requests and not (
            self.waiting or self.running or self.loading
        )

    # ---- manager calls --------------------------------------------------

    def do(self, name: str, seq: Seq | None = None, *args: Any) -> list[Any]:
        """One manager call on every manager (`trace.Runner`), compared."""
        return self.ops.call(name, None if seq is None else seq.req, *args)

    def free(self, seq: Seq) -> None:
        self.do("free", seq)

    def _allocate(self, seq: Seq, num_new_tokens: int, computed: str | None = None, **kw: Any) -> Any:
        """allocate_slots on every manager; `computed`: "lookup" (each
        manager's last lookup's blocks), "empty" (its empty blocks) or None."""
        result = self.do("allocate_slots", seq, num_new_tokens, kw, computed)[0]
        if result is None:
            self.summary.failed_allocations += 1
        return result

    def _holders(self) -> list[Seq]:
        """Requests that may hold blocks."""
        return self.running + self.loading + [s for s in self.waiting if s.req.num_computed_tokens]

    # ---- one step -------------------------------------------------------

    def step(self) -> dict[Seq, int]:
        self.fan.step = self.summary.steps
        scheduled = super().step()
        self._observe_step()
        self._break_stalls(scheduled)
        self.summary.steps += 1
        return scheduled

    def new_step_starts(self) -> None:
        self.do("new_step_starts")

    def before_schedule(self) -> None:
        self._maintenance()
        self._finish_loads()

    def after_schedule(self) -> None:
        self._observe_schedule()

    def _maintenance(self) -> None:
        """Out-of-band calls: aborts, evictions, resets, window trimming."""
        cfg, rng = self.cfg, self.rng
        if self.waiting and rng.random() < cfg.abort_prob:
            self._abort(self.waiting, rng.randrange(len(self.waiting)))
        if self.running and rng.random() < cfg.abort_prob:
            self._abort(self.running, rng.randrange(len(self.running)))
        if self.loading and rng.random() < cfg.abort_prob:
            self._abort(self.loading, rng.randrange(len(self.loading)))
        if rng.random() < cfg.evict_prob:
            self._evict()
        idle = not self._holders()
        if rng.random() < (0.3 if idle else cfg.reset_prob):
            self._reset()
        if self.running and rng.random() < cfg.remove_skipped_prob:
            # What a finishing connector request does (and what allocate_slots
            # does first), out of band.
            seq = rng.choice(self.running)
            n = seq.req.num_computed_tokens
            self.do("remove_skipped_blocks", seq, n)

    def _abort(self, queue: list[Seq], index: int) -> None:
        seq = queue.pop(index)
        self.free(seq)
        self.freed_ids.append(seq.rid)
        self.summary.aborted += 1

    def _evict(self) -> None:
        rng, holders = self.rng, self._holders()
        if holders and rng.random() < 0.5:
            # Target blocks in use (any group), which are likely cached.
            seq = rng.choice(holders)
            groups = self.do("get_block_ids", seq)[0]
            ids = [b for g in groups for b in g]
            chosen = set(rng.sample(ids, min(len(ids), rng.randint(1, 4))))
        else:
            chosen = {rng.randrange(self.cfg.num_blocks) for _ in range(rng.randint(1, 6))}
        self.do("evict_blocks", None, sorted(chosen))
        self.summary.evict_calls += 1

    def _reset(self) -> None:
        ok = self.do("reset_prefix_cache")[0]
        self.summary.successful_resets += bool(ok)

    def _finish_loads(self) -> None:
        """Complete async KV loads: cache what arrived, requeue for compute."""
        for seq in list(self.loading):
            seq.load_steps -= 1
            if seq.load_steps > 0:
                continue
            self.loading.remove(seq)
            self._complete_load(seq)
            self.waiting.insert(0, seq)

    def _complete_load(self, seq: Seq) -> None:
        req, rng, bs = seq.req, self.rng, self.cfg.scheduler_block_size
        outcome = rng.random()
        # vLLM handles failed (invalid) loaded blocks for one group only.
        if outcome < 0.15 and len(self.cfg.groups) == 1:
            # Some blocks failed: keep the valid block-aligned prefix only.
            req.num_computed_tokens = rng.randint(0, req.num_computed_tokens // bs) * bs
            if req.num_computed_tokens == 0:
                self.free(seq)
                return
        n = req.num_computed_tokens
        self.do("cache_blocks", seq, n)
        # A full hit must recompute the last token to sample from it.
        if req.num_computed_tokens == req.num_tokens:
            req.num_computed_tokens = req.num_tokens - 1

    def _mamba_split(
        self, req: Request, num_new_tokens: int, num_local_hit: int = 0, num_external: int = 0
    ) -> int:
        """vLLM's Scheduler._mamba_block_aligned_split (Mamba "align" mode)."""
        if not self.cfg.mamba_align:
            return num_new_tokens
        num_computed = req.num_computed_tokens + num_local_hit + num_external
        return mamba_block_aligned_split(
            req, num_new_tokens, num_computed, self.cfg.split_block_size, self.cfg.use_eagle
        )

    def split(self, req: Request, n: int, hit: int = 0, external: int = 0) -> int:
        split = self._mamba_split(req, n, hit, external)
        if split != n:
            self.summary.split_trims += 1
        if split == 0:
            self.summary.split_blocked += 1
        return split

    def allocate_running(self, seq: Seq, n: int) -> Any:
        return self._allocate(seq, n, num_lookahead_tokens=self.cfg.num_lookahead_tokens)

    def on_preempted(self, seq: Seq) -> None:
        self.summary.preemptions += 1

    def start_loading(self, seq: Seq) -> None:
        self.loading.append(seq)

    def admit(self, seq: Seq, budget: int) -> int | None:
        """Allocate for a waiting request; tokens scheduled, or None if it failed."""
        cfg, rng, req = self.cfg, self.rng, seq.req
        computed: str | None = None
        hit, external, async_load = 0, 0, False
        if req.num_computed_tokens == 0:
            found = self.do("get_computed_blocks", seq)[0]
            computed, hit = "lookup", found[1]
            external, async_load = self._external_tokens(req, hit)
            if external and _later_group_free_hit(found[0]):
                # vLLM's whole-block-hits manager allocates external-token blocks group by group:
                # an earlier group's may pop a later group's free hit, which
                # then sits in two groups. hybridcache avoids that (README,
                # its release's test_vllm_divergences.py); keep traces where vLLM is sound.
                external, async_load = 0, False
        else:  # its async load finished; as vLLM, pass the shared empty blocks
            computed = "empty"
        num_computed = req.num_computed_tokens or hit + external
        num_new = 0 if async_load else min(req.num_tokens - num_computed, budget)
        if not async_load:  # as vLLM: no alignment when setting up an async load
            num_new = self.split(req, num_new, hit, external)
            if num_new == 0:
                return None
        # Encoder inputs (cross attention) are scheduled with the first chunk.
        encoder = seq.encoder_tokens if num_computed == 0 and num_new else 0
        reserved = rng.randint(1, 4) if rng.random() < cfg.reserved_blocks_prob else 0
        if external and cfg.mamba_align:
            # vLLM's whole-block-hits Mamba "align" block count omits the block that
            # allocate_new_computed_blocks takes for external tokens (one per
            # Mamba group), so a tight pool makes its BlockPool raise. Keep
            # that many blocks in reserve so every trace is legal for vLLM.
            reserved += sum(g.kind == "mamba" for g in cfg.groups)
        blocks = self._allocate(
            seq,
            num_new,
            computed,
            num_new_computed_tokens=hit,
            # As vLLM's scheduler: no lookahead while an EAGLE request loads KV.
            num_lookahead_tokens=0 if async_load and cfg.use_eagle else cfg.num_lookahead_tokens,
            num_external_computed_tokens=external,
            delay_cache_blocks=async_load,
            num_encoder_tokens=encoder,
            full_sequence_must_fit=rng.random() < cfg.full_sequence_must_fit_prob,
            reserved_blocks=reserved,
            **self.calls.admission_kwargs(bool(self.running)),
        )
        if blocks is None:
            return None
        if self.calls.records_lookup_stats and req.num_computed_tokens == 0:
            self.do("record_prefix_cache_stats", seq, hit)
        self.summary.cache_hit_tokens += hit
        self.summary.hit_requests += hit > 0
        self.summary.external_tokens += external
        self.summary.async_loads += async_load
        req.num_computed_tokens = num_computed
        if async_load:
            seq.load_steps = rng.randint(1, 3)
        return num_new

    def _external_tokens(self, req: Request, hit: int) -> tuple[int, bool]:
        """Tokens a simulated KV connector offers after the local hit."""
        cfg, rng = self.cfg, self.rng
        if cfg.has_cross_attention or rng.random() >= cfg.external_tokens_prob:
            return 0, False
        async_load = rng.random() < cfg.async_load_prob
        # Synchronous loads must leave at least one token to compute.
        room = req.num_tokens - hit - (0 if async_load else 1)
        if room <= 0:
            return 0, False
        align = cfg.scheduler_block_size
        if rng.random() < 0.5 and room >= align:
            external = rng.randint(1, room // align) * align
        else:
            external = rng.randint(1, room)
        return external, async_load

    def on_drafts(self, num_drafts: int) -> None:
        self.summary.draft_tokens += num_drafts

    def on_finished(self, seq: Seq) -> None:
        self.freed_ids.append(seq.rid)
        self.summary.finished += 1

    def next_drafts(self, seq: Seq) -> int:
        return drifting_drafts(self.rng, seq.drafts, self.cfg.max_drafts)

    def sample(self, seq: Seq, num_sampled: int) -> bool:
        cfg, req = self.cfg, seq.req
        room = min(seq.max_tokens - req.num_output_tokens, cfg.max_model_len - req.num_tokens)
        req.append_output_token_ids(self._tokens(min(num_sampled, room)))
        if self.calls.caches_after_output(cfg.max_drafts):
            n = req.num_computed_tokens
            self.do("cache_blocks", seq, n)
        return (
            num_sampled >= room
            or req.num_tokens >= cfg.max_model_len
            or self.rng.random() < cfg.eos_prob
        )

    # ---- observations ---------------------------------------------------

    def _observe_schedule(self) -> None:
        """What vLLM's schedule() reads at the end of a step."""
        row = releases.find(self.api.name)
        if self.running and (row is None or row.common_prefix_blocks):
            self.do("get_num_common_prefix_blocks", self.running[0])
        for drain in self.calls.step_drains:
            self.do(drain)
        for seq in self._holders():
            self.do("get_block_ids", seq)

    def _observe_step(self) -> None:
        """Pool state, events and stats after the step's frees."""
        self.do("get_num_free_blocks")
        self.do("usage")
        if self.cfg.compare_pool_state:
            self.do("pool_state")
        self.summary.events += len(self.do("take_events")[0])
        self.do("make_prefix_cache_stats")

    def _break_stalls(self, scheduled: dict[Seq, int]) -> None:
        """Abort the head waiting request when blocks held by waiting requests
        leave nothing runnable (vLLM would deadlock the same way)."""
        stalled = not scheduled and not self.running and not self.loading and self.waiting
        self.idle_steps = self.idle_steps + 1 if stalled else 0
        if self.idle_steps >= 3:
            self._abort(self.waiting, 0)
            self.summary.stalls += 1
            self.idle_steps = 0

    def run(self) -> ReplaySummary:
        start = time.perf_counter()
        while not self._done() and self.summary.steps < self.cfg.max_steps:
            self.step()
        self.fan.step = self.summary.steps
        self._drain()
        self.summary.seconds = time.perf_counter() - start
        self.summary.ops = self.fan.ops
        return self.summary

    def _drain(self) -> None:
        """Free everything, then a prefix-cache reset (which must succeed)."""
        for queue in (self.running, self.loading, self.waiting):
            while queue:
                self._abort(queue, len(queue) - 1)
        self._reset()
        self._observe_step()

