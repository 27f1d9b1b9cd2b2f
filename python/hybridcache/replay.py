"""Seeded scheduler-like traces replayed against KVCacheManager implementations.

A small, deterministic scheduler simulation (not vLLM's scheduler, but driving
the manager the way vLLM 0.23.0's ``Scheduler.schedule`` does) issues every
public call of vLLM's v1 ``KVCacheManager`` API: prefix-cache lookups, chunked
prefill, speculative decoding with changing draft counts, EAGLE lookahead,
external (connector) tokens, delayed caching, preemption, aborts, evictions
and prefix-cache resets.

``replay`` applies each operation to several managers at once (same request
objects) and raises ``ReplayDivergence`` on the first differing output;
``run_single`` drives one manager and times it.

Nothing here imports torch or vLLM at module import time.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .request import LoRARequest, Request

ManagerFactory = Callable[["ReplayConfig"], Any]


@dataclass
class ReplayConfig:
    """Shape of the simulated workload and of the managers under test."""

    num_blocks: int = 64
    block_size: int = 16
    # None means block_size; vLLM's single-group coordinator requires equality.
    hash_block_size: int | None = None
    max_model_len: int = 512
    max_num_batched_tokens: int = 256
    enable_caching: bool = True
    enable_kv_cache_events: bool = True
    use_eagle: bool = False
    log_stats: bool = True
    num_requests: int = 60
    max_running: int = 8
    max_arrivals_per_step: int = 3
    min_prompt_len: int = 1
    max_prompt_len: int = 300
    max_output_len: int = 64
    vocab_size: int = 1000
    # Shared prefixes make prefix-cache hits (and shared blocks) common.
    num_shared_prefixes: int = 4
    max_shared_prefix_len: int = 240
    shared_prefix_prob: float = 0.7
    duplicate_prompt_prob: float = 0.1
    max_drafts: int = 8
    # None: max_drafts when use_eagle (as vLLM's scheduler does), else 0.
    num_lookahead_tokens: int | None = None
    eos_prob: float = 0.02
    lora_prob: float = 0.05
    cache_salt_prob: float = 0.05
    skip_prefix_cache_prob: float = 0.03
    # Reusing the id of a request already freed is legal and catches state
    # keyed by request id that outlives free().
    reuse_request_id_prob: float = 0.1
    external_tokens_prob: float = 0.15
    async_load_prob: float = 0.3
    full_sequence_must_fit_prob: float = 0.2
    reserved_blocks_prob: float = 0.1
    abort_prob: float = 0.03
    evict_prob: float = 0.08
    reset_prob: float = 0.03
    remove_skipped_prob: float = 0.05
    # Also compare every block's ref_cnt and hash and the free-queue order
    # (vLLM's BlockPool attributes that connectors read) after every step.
    compare_pool_state: bool = True
    max_steps: int = 20_000

    def __post_init__(self) -> None:
        if self.hash_block_size is None:
            self.hash_block_size = self.block_size
        if self.num_lookahead_tokens is None:
            self.num_lookahead_tokens = self.max_drafts if self.use_eagle else 0
        # vLLM refuses to start unless one max-length request fits the pool.
        if self.max_model_len > (self.num_blocks - 1) * self.block_size:
            raise ValueError("max_model_len must fit in num_blocks - 1 blocks")
        if not 1 <= self.min_prompt_len <= self.max_prompt_len < self.max_model_len:
            raise ValueError("need 1 <= min_prompt_len <= max_prompt_len < max_model_len")

    def manager_kwargs(self) -> dict[str, Any]:
        """Constructor keyword arguments shared by every manager implementation."""
        return dict(
            max_model_len=self.max_model_len,
            scheduler_block_size=self.block_size,
            hash_block_size=self.hash_block_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_caching=self.enable_caching,
            use_eagle=self.use_eagle,
            log_stats=self.log_stats,
            enable_kv_cache_events=self.enable_kv_cache_events,
        )


DEFAULT_CONFIG = ReplayConfig(num_requests=400, max_drafts=4)


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
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ReplayDivergence(AssertionError):
    """Two managers answered the same operation differently."""

    def __init__(self, seed: int, step: int, op: str, values: Sequence[tuple[str, Any]]):
        self.seed, self.step, self.op, self.values = seed, step, op, list(values)
        shown = "\n".join(f"  {name}: {value!r}" for name, value in self.values)
        ref = self.values[0][1]
        odd = next((v for _, v in self.values[1:] if v != ref), ref)
        where = _first_difference(ref, odd)
        super().__init__(f"divergence at seed={seed} step={step} op={op}{where}\n{shown}")


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    """Locates the first differing element of two nested tuples, for big values."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
        if len(a) != len(b):
            return f" (lengths differ at {path or 'top'}: {len(a)} != {len(b)})"
    if not path:
        return ""
    return f" (first difference at {path}: {a!r} != {b!r})"


# --------------------------------------------------------------------------
# Output normalization: implementation-neutral, comparable values.
# --------------------------------------------------------------------------

_STATS_FIELDS = (
    "reset",
    "requests",
    "queries",
    "hits",
    "preempted_requests",
    "preempted_queries",
    "preempted_hits",
)

# Field order of vLLM's msgspec events, for event objects that are not Structs.
_EVENT_FIELDS = {
    "BlockStored": (
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
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}


def _freeze(value: Any) -> Any:
    """Lists and tuples compare alike (msgspec encodes both as arrays)."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def norm_blocks(blocks: Any) -> tuple[tuple[int, ...], ...] | None:
    if blocks is None:
        return None
    return tuple(tuple(group) for group in blocks.get_block_ids())


def norm_allocated(blocks: Any) -> Any:
    """Block ids, plus which of them are still unhashed (not yet cached)."""
    if blocks is None:
        return None
    return norm_blocks(blocks), _freeze(blocks.get_unhashed_block_ids_all_groups())


def norm_computed(result: tuple[Any, int]) -> tuple[Any, int]:
    blocks, num_hit_tokens = result
    return norm_blocks(blocks), num_hit_tokens


def _event_field_names(event: Any) -> Sequence[str]:
    names = getattr(type(event), "__struct_fields__", None)  # msgspec.Struct
    if names is not None:
        return names
    if dataclasses.is_dataclass(event):
        return [f.name for f in dataclasses.fields(event)]
    return _EVENT_FIELDS.get(type(event).__name__, sorted(vars(event)))


def norm_event(event: Any) -> tuple[str, tuple[tuple[str, Any], ...]]:
    names = _event_field_names(event)
    return type(event).__name__, tuple((n, _freeze(getattr(event, n))) for n in names)


def norm_events(events: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(norm_event(e) for e in events)


def norm_stats(stats: Any) -> tuple[tuple[str, Any], ...] | None:
    if stats is None:
        return None
    return tuple((name, getattr(stats, name)) for name in _STATS_FIELDS)


def pool_state(manager: Any) -> tuple[Any, ...]:
    """(ref_cnt, block_hash) of every block and the free queue's order."""
    pool = manager.block_pool
    blocks = tuple((b.ref_cnt, b.block_hash) for b in pool.blocks)
    free_order = tuple(b.block_id for b in pool.free_block_queue.get_all_free_blocks())
    return blocks, free_order


def norm_usage(usage: float) -> float:
    # Tolerate float formulas that are equal in exact arithmetic.
    return round(float(usage), 9)


def norm_ids(ids: Sequence[int]) -> tuple[int, ...]:
    return tuple(ids)


def _same(value: Any) -> Any:
    return value


# --------------------------------------------------------------------------
# Fan-out: one operation, every manager, compared.
# --------------------------------------------------------------------------


class _Fanout:
    """Applies an operation to every manager and checks they agree.

    Manager 0 is the reference: if it raises, the trace itself is illegal and
    the exception propagates unchanged (a generator bug, not a divergence).
    """

    def __init__(self, managers: Sequence[Any], names: Sequence[str], seed: int):
        self.managers = list(managers)
        self.names = list(names)
        self.seed = seed
        self.step = 0
        self.ops = 0

    def call(
        self, op: str, fn: Callable[[Any, int], Any], norm: Callable[[Any], Any] = _same
    ) -> list[Any]:
        self.ops += 1
        results, normalized = [], []
        for i, mgr in enumerate(self.managers):
            try:
                result = fn(mgr, i)
                value = norm(result)
            except Exception as exc:
                if i == 0:
                    raise
                result, value = exc, ("raised", type(exc).__name__, str(exc))
            results.append(result)
            normalized.append(value)
        if any(v != normalized[0] for v in normalized[1:]):
            raise ReplayDivergence(
                self.seed, self.step, op, list(zip(self.names, normalized))
            )
        return results


# --------------------------------------------------------------------------
# The scheduler simulation.
# --------------------------------------------------------------------------


@dataclass(eq=False)
class _Seq:
    """Simulator-side state of one request."""

    req: Request
    max_tokens: int
    drafts: int = 0  # draft tokens proposed for the next step
    load_steps: int = 0  # remaining steps of an async KV load

    @property
    def rid(self) -> str:
        return self.req.request_id


class _Simulation:
    def __init__(self, config: ReplayConfig, seed: int, fanout: _Fanout):
        self.cfg = config
        self.rng = random.Random(seed)
        self.fan = fanout
        self.summary = ReplaySummary(seed=seed)
        self.prefixes = [self._prefix() for _ in range(config.num_shared_prefixes)]
        self.prompts: list[list[int]] = []
        self.next_req = 0
        self.freed_ids: list[str] = []
        self.waiting: list[_Seq] = []
        self.running: list[_Seq] = []
        self.loading: list[_Seq] = []  # async KV loads in flight
        self.idle_steps = 0
        self.preempted_this_step = False

    # ---- workload -------------------------------------------------------

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(self.cfg.vocab_size) for _ in range(n)]

    def _prefix(self) -> list[int]:
        cfg = self.cfg
        n = self.rng.randint(1, min(cfg.max_shared_prefix_len, cfg.max_prompt_len))
        if self.rng.random() < 0.5:  # block-aligned prefixes give whole-block hits
            n = max(cfg.block_size, n - n % cfg.block_size)
        return self._tokens(min(n, cfg.max_prompt_len))

    def _prompt(self) -> list[int]:
        cfg, rng = self.cfg, self.rng
        if self.prompts and rng.random() < cfg.duplicate_prompt_prob:
            return list(rng.choice(self.prompts))
        n = rng.randint(cfg.min_prompt_len, cfg.max_prompt_len)
        prompt: list[int] = []
        if self.prefixes and rng.random() < cfg.shared_prefix_prob:
            prompt = list(rng.choice(self.prefixes)[:n])
        prompt += self._tokens(n - len(prompt))
        self.prompts.append(prompt)
        return prompt

    def _new_seq(self) -> _Seq:
        cfg, rng = self.cfg, self.rng
        lora = None
        if rng.random() < cfg.lora_prob:
            lora_id = rng.randint(1, 2)
            lora = LoRARequest(f"lora{lora_id}", lora_id)
        salt = f"salt{rng.randint(0, 1)}" if rng.random() < cfg.cache_salt_prob else None
        req = Request(
            self._request_id(),
            self._prompt(),
            cfg.hash_block_size,
            lora_request=lora,
            cache_salt=salt,
            skip_reading_prefix_cache=rng.random() < cfg.skip_prefix_cache_prob,
        )
        self.next_req += 1
        return _Seq(req, max_tokens=rng.randint(1, cfg.max_output_len))

    def _request_id(self) -> str:
        if self.freed_ids and self.rng.random() < self.cfg.reuse_request_id_prob:
            return self.freed_ids.pop(self.rng.randrange(len(self.freed_ids)))
        return f"req-{self.next_req}"

    def _arrive(self) -> None:
        for _ in range(self.rng.randint(0, self.cfg.max_arrivals_per_step)):
            if self.next_req < self.cfg.num_requests:
                self.waiting.append(self._new_seq())

    def _done(self) -> bool:
        return self.next_req >= self.cfg.num_requests and not (
            self.waiting or self.running or self.loading
        )

    # ---- manager calls --------------------------------------------------

    def _free(self, seq: _Seq) -> None:
        self.fan.call(f"free({seq.rid})", lambda m, i: m.free(seq.req))

    def _allocate(self, seq: _Seq, num_new_tokens: int, computed=None, **kw) -> Any:
        """allocate_slots on every manager; `computed` holds per-manager blocks."""
        op = f"allocate_slots({seq.rid}, {num_new_tokens}, {kw})"

        def call(m: Any, i: int) -> Any:
            blocks = computed[i] if computed is not None else None
            return m.allocate_slots(seq.req, num_new_tokens, new_computed_blocks=blocks, **kw)

        result = self.fan.call(op, call, norm_allocated)[0]
        if result is None:
            self.summary.failed_allocations += 1
        return result

    def _holders(self) -> list[_Seq]:
        """Requests that may hold blocks."""
        return self.running + self.loading + [s for s in self.waiting if s.req.num_computed_tokens]

    # ---- one step -------------------------------------------------------

    def step(self) -> None:
        self.fan.step = self.summary.steps
        self._arrive()
        self.fan.call("new_step_starts", lambda m, i: m.new_step_starts())
        self._maintenance()
        self._finish_loads()
        scheduled: dict[str, int] = {}
        self.preempted_this_step = False
        budget = self._schedule_running(scheduled, self.cfg.max_num_batched_tokens)
        if not self.preempted_this_step:  # as vLLM: no admissions after preempting
            self._schedule_waiting(scheduled, budget)
        self._observe_schedule()
        self._apply_outputs(scheduled)
        self._observe_step()
        self._break_stalls(scheduled)
        self.summary.steps += 1

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
            seq = rng.choice(self.running)
            n = seq.req.num_computed_tokens
            self.fan.call(
                f"remove_skipped_blocks({seq.rid}, {n})",
                lambda m, i: m.remove_skipped_blocks(seq.rid, n),
            )

    def _abort(self, queue: list[_Seq], index: int) -> None:
        seq = queue.pop(index)
        self._free(seq)
        self.freed_ids.append(seq.rid)
        self.summary.aborted += 1

    def _evict(self) -> None:
        rng, holders = self.rng, self._holders()
        if holders and rng.random() < 0.5:
            # Target blocks in use, which are likely cached.
            seq = rng.choice(holders)
            ids = self.fan.call(
                f"get_block_ids({seq.rid})",
                lambda m, i: m.get_block_ids(seq.rid),
                _freeze,
            )[0][0]
            chosen = set(rng.sample(ids, min(len(ids), rng.randint(1, 4))))
        else:
            chosen = {rng.randrange(self.cfg.num_blocks) for _ in range(rng.randint(1, 6))}
        self.fan.call(f"evict_blocks({sorted(chosen)})", lambda m, i: m.evict_blocks(set(chosen)))
        self.summary.evict_calls += 1

    def _reset(self) -> None:
        ok = self.fan.call("reset_prefix_cache", lambda m, i: m.reset_prefix_cache())[0]
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

    def _complete_load(self, seq: _Seq) -> None:
        req, rng, bs = seq.req, self.rng, self.cfg.block_size
        outcome = rng.random()
        if outcome < 0.15:
            # Some blocks failed: keep the valid block-aligned prefix only.
            req.num_computed_tokens = rng.randint(0, req.num_computed_tokens // bs) * bs
            if req.num_computed_tokens == 0:
                self._free(seq)
                return
        n = req.num_computed_tokens
        self.fan.call(f"cache_blocks({seq.rid}, {n})", lambda m, i: m.cache_blocks(req, n))
        # A full hit must recompute the last token to sample from it.
        if req.num_computed_tokens == req.num_tokens:
            req.num_computed_tokens = req.num_tokens - 1

    def _schedule_running(self, scheduled: dict[str, int], budget: int) -> int:
        """Mirrors the RUNNING loop of vLLM's schedule(); returns the budget left."""
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            req = seq.req
            n = req.num_tokens + seq.drafts - req.num_computed_tokens
            n = min(n, budget, self.cfg.max_model_len - 1 - req.num_computed_tokens)
            if n <= 0:
                index += 1
                continue
            if self._allocate_or_preempt(seq, n) is None:
                break
            scheduled[seq.rid] = n
            budget -= n
            index += 1
        return budget

    def _allocate_or_preempt(self, seq: _Seq, n: int) -> Any:
        """Preempt the newest running request until `seq` fits or is preempted."""
        lookahead = self.cfg.num_lookahead_tokens
        while True:
            blocks = self._allocate(seq, n, num_lookahead_tokens=lookahead)
            if blocks is not None:
                return blocks
            victim = self.running.pop()
            self._preempt(victim)
            if victim is seq:
                return None

    def _preempt(self, seq: _Seq) -> None:
        self._free(seq)
        seq.req.num_computed_tokens = 0
        seq.req.num_preemptions += 1
        seq.drafts = 0
        self.waiting.insert(0, seq)
        self.summary.preemptions += 1
        self.preempted_this_step = True

    def _schedule_waiting(self, scheduled: dict[str, int], budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_running:
            seq = self.waiting[0]
            admitted = self._admit(seq, budget)
            if admitted is None:
                break
            self.waiting.pop(0)
            if admitted == 0:  # async load started; no compute this step
                self.loading.append(seq)
                continue
            self.running.append(seq)
            scheduled[seq.rid] = admitted
            budget -= admitted

    def _admit(self, seq: _Seq, budget: int) -> int | None:
        """Allocate for a waiting request; tokens scheduled, or None if it failed."""
        cfg, rng, req = self.cfg, self.rng, seq.req
        computed, hit, external, async_load = None, 0, 0, False
        if req.num_computed_tokens == 0:
            results = self.fan.call(
                f"get_computed_blocks({seq.rid})",
                lambda m, i: m.get_computed_blocks(req),
                norm_computed,
            )
            computed = [blocks for blocks, _ in results]
            hit = results[0][1]
            external, async_load = self._external_tokens(req, hit)
        else:  # its async load finished; as vLLM, pass the shared empty blocks
            computed = [m.empty_kv_cache_blocks for m in self.fan.managers]
        num_computed = req.num_computed_tokens or hit + external
        num_new = 0 if async_load else min(req.num_tokens - num_computed, budget)
        blocks = self._allocate(
            seq,
            num_new,
            computed,
            num_new_computed_tokens=hit,
            # As vLLM's scheduler: no lookahead while an EAGLE request loads KV.
            num_lookahead_tokens=0 if async_load and cfg.use_eagle else cfg.num_lookahead_tokens,
            num_external_computed_tokens=external,
            delay_cache_blocks=async_load,
            full_sequence_must_fit=rng.random() < cfg.full_sequence_must_fit_prob,
            reserved_blocks=rng.randint(1, 4) if rng.random() < cfg.reserved_blocks_prob else 0,
        )
        if blocks is None:
            return None
        self.summary.cache_hit_tokens += hit
        req.num_computed_tokens = num_computed
        if async_load:
            seq.load_steps = rng.randint(1, 3)
        return num_new

    def _external_tokens(self, req: Request, hit: int) -> tuple[int, bool]:
        """Tokens a simulated KV connector offers after the local hit."""
        cfg, rng = self.cfg, self.rng
        if rng.random() >= cfg.external_tokens_prob:
            return 0, False
        async_load = rng.random() < cfg.async_load_prob
        # Synchronous loads must leave at least one token to compute.
        room = req.num_tokens - hit - (0 if async_load else 1)
        if room <= 0:
            return 0, False
        if rng.random() < 0.5 and room >= cfg.block_size:
            external = rng.randint(1, room // cfg.block_size) * cfg.block_size
        else:
            external = rng.randint(1, room)
        return external, async_load

    def _apply_outputs(self, scheduled: dict[str, int]) -> None:
        """Advance computed tokens, sample, accept drafts and finish requests."""
        for seq in list(self.running):
            n = scheduled.get(seq.rid)
            if n is None:
                continue
            req = seq.req
            req.num_computed_tokens += n
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk: nothing sampled yet
            num_drafts = req.num_computed_tokens - req.num_tokens
            accepted = self.rng.randint(0, num_drafts)
            req.num_computed_tokens -= num_drafts - accepted
            if self._append_and_check_stop(seq, accepted + 1):
                self.running.remove(seq)
                self._free(seq)
                self.freed_ids.append(seq.rid)
                self.summary.finished += 1
            else:
                seq.drafts = self._next_drafts()

    def _append_and_check_stop(self, seq: _Seq, num_sampled: int) -> bool:
        cfg, req = self.cfg, seq.req
        room = min(seq.max_tokens - req.num_output_tokens, cfg.max_model_len - req.num_tokens)
        req.append_output_token_ids(self._tokens(min(num_sampled, room)))
        return (
            num_sampled >= room
            or req.num_tokens >= cfg.max_model_len
            or self.rng.random() < cfg.eos_prob
        )

    def _next_drafts(self) -> int:
        if self.cfg.max_drafts == 0 or self.rng.random() < 0.3:
            return 0
        return self.rng.randint(1, self.cfg.max_drafts)

    # ---- observations ---------------------------------------------------

    def _observe_schedule(self) -> None:
        """What vLLM's schedule() reads at the end of a step."""
        if self.running:
            rid = self.running[0].rid
            self.fan.call(
                f"get_num_common_prefix_blocks({rid})",
                lambda m, i: m.get_num_common_prefix_blocks(rid),
                norm_ids,
            )
        self.fan.call("take_new_block_ids", lambda m, i: m.take_new_block_ids(), norm_ids)
        for seq in self._holders():
            self.fan.call(
                f"get_block_ids({seq.rid})", lambda m, i: m.get_block_ids(seq.rid), _freeze
            )

    def _observe_step(self) -> None:
        """Pool state, events and stats after the step's frees."""
        self.fan.call(
            "block_pool.get_num_free_blocks",
            lambda m, i: m.block_pool.get_num_free_blocks(),
        )
        self.fan.call("usage", lambda m, i: m.usage, norm_usage)
        if self.cfg.compare_pool_state:
            self.fan.call("block_pool state", lambda m, i: pool_state(m))
        events = self.fan.call("take_events", lambda m, i: m.take_events(), norm_events)[0]
        self.summary.events += len(events)
        self.fan.call(
            "make_prefix_cache_stats", lambda m, i: m.make_prefix_cache_stats(), norm_stats
        )

    def _break_stalls(self, scheduled: dict[str, int]) -> None:
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


# --------------------------------------------------------------------------
# Entry points.
# --------------------------------------------------------------------------


def _run(
    config: ReplayConfig, seed: int, managers: Sequence[Any], names: Sequence[str]
) -> ReplaySummary:
    return _Simulation(config, seed, _Fanout(managers, names, seed)).run()


def replay(
    config: ReplayConfig,
    seed: int,
    factories: Sequence[ManagerFactory],
    names: Sequence[str] | None = None,
) -> ReplaySummary:
    """Replay one seeded trace against every manager, comparing all outputs.

    The first factory builds the reference manager. Raises ReplayDivergence on
    the first operation whose normalized outputs differ.
    """
    if names is None:
        names = [f"manager{i}" for i in range(len(factories))]
    managers = [factory(config) for factory in factories]
    return _run(config, seed, managers, names)


def run_single(config: ReplayConfig, seed: int, factory: ManagerFactory) -> ReplaySummary:
    """Replay one seeded trace against a single manager (no comparison), timed."""
    return _run(config, seed, [factory(config)], ["manager"])


def make_kv_cache_config(num_blocks: int, block_size: int) -> Any:
    """A one-group full-attention vLLM KVCacheConfig (imports vLLM and torch)."""
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )

    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)],
    )


def vllm_factory(config: ReplayConfig) -> Any:
    """vLLM 0.23.0's own KVCacheManager for `config`."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    kv_cache_config = make_kv_cache_config(config.num_blocks, config.block_size)
    return KVCacheManager(kv_cache_config, **config.manager_kwargs())


def hybridcache_factory(config: ReplayConfig) -> Any:
    """hybridcache's KVCacheManager for `config`, on its own config classes
    (so the CLI needs neither vLLM nor torch)."""
    from . import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheManager

    kv_cache_config = KVCacheConfig(
        num_blocks=config.num_blocks,
        kv_cache_groups=[KVCacheGroupSpec(["layer0"], FullAttentionSpec(config.block_size))],
    )
    return KVCacheManager(kv_cache_config, **config.manager_kwargs())


_FACTORIES = {"hybridcache": hybridcache_factory, "vllm": vllm_factory}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Replay seeded KV-cache manager traces.")
    parser.add_argument("--impl", choices=sorted(_FACTORIES), default="hybridcache")
    parser.add_argument("--compare", choices=sorted(_FACTORIES), default=None,
                        help="also replay against this manager and compare every output")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--requests", type=int, default=DEFAULT_CONFIG.num_requests)
    args = parser.parse_args(argv)
    config = dataclasses.replace(DEFAULT_CONFIG, num_requests=args.requests)
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        if args.compare:
            factories = [_FACTORIES[args.compare], _FACTORIES[args.impl]]
            summary = replay(config, seed, factories, [args.compare, args.impl])
        else:
            summary = run_single(config, seed, _FACTORIES[args.impl])
        print(summary.as_dict())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
