"""The long fuzz's driver for vLLM 0.33.0: `fuzz_driver.Driver`'s operations
in the order 0.33.0's scheduler issues them (vllm/v1/core/sched/scheduler.py),
to vLLM's manager (the reference) and a candidate (hybridcache's 0.33.0
facade, or vLLM's manager again for the harness self-check), with the same
vLLM `Request` objects. Every output is compared and, after every
operation, the events (all fields and the msgpack bytes), free count,
usage, every block's ref count and hash, the free-queue order and every
request's block table.

What the scheduler does and the driver therefore does:
- admission (a waiting request, `num_computed_tokens == 0`):
  `get_computed_blocks(request, max_cache_hit_length)` (3-tuple, the third
  stored in `request.shared_prefix_boundary`), external tokens with sync or
  async loads, `allocate_slots` with the waiting-request keywords
  (`has_scheduled_reqs`, `skip_zeroing_group_ids`, `reserved_blocks` for async
  loads, `full_sequence_must_fit` when the setup reserves the full input),
  then `record_prefix_cache_stats(request, num_local_hits)`;
- after an async load: `cache_blocks(request, n)` (or `free` when it failed
  outright), then admission again with `num_new_tokens` (0 allowed) and no hit;
- running requests: `allocate_slots(request, n, num_lookahead_tokens=k)` with
  a fixed `k` (the scheduler's `num_lookahead_tokens`) and 0..k drafts,
  `cache_blocks(request, num_computed_tokens)` after a step with drafts;
  prefill chunks never end within `num_prefill_lookahead` of the end;
- a step: `new_step_starts()`; its end: `take_boundary_state_offloads()`,
  `take_kv_cache_block_copies()` (whose retained blocks go back through
  `block_pool.free_blocks`), `take_new_block_ids()`;
- frees: `free(request)`, or `pop_blocks_for_free(request)` and later
  `block_pool.free_blocks(reversed(blocks))` with the `KVCacheBlock`s each
  manager returned (deferred frees, FIFO); preemption resets the request;
- connector finish: `remove_skipped_blocks(request_id, processed,
  num_prompt_tokens)` before the free; `evict_blocks`, `reset_prefix_cache`;
  queries: `estimate_cached_tokens`, `get_block_ids_for_computed_tokens`,
  `truncate_computed_blocks`, `get_num_common_prefix_blocks` (zeros),
  `make_prefix_cache_stats`, `get_blocks`.
Bad inputs are not sent (the 0.33.0 facade's rejections are its own suite).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hybridcache.tools.compare import _first_difference, freeze, norm_allocated, norm_blocks, norm_usage, pool_state
from hybridcache_dev.fuzz_driver import Driver, Seq
from hybridcache_dev.v0_33.fuzz_frees import Deferred, SchedulerFrees
from hybridcache_dev.v0_33.fuzz_queries import SchedulerQueries
from hybridcache_dev.fuzz_setup import Divergence, Figures, InvariantViolation, ReferenceError_, Setup
from hybridcache_dev.release_api import PartialBlockHits, norm_block_list, release


# With the shared-prefix checkpoint: siblings of one stem diverging inside
# Mamba blocks (40, 56, 72 tokens in), so full attention hits deeper than
# Mamba and the lookup reports junctions the scheduler then stops at.
_STEM = tuple(range(300, 400))
JUNCTION_PREFIXES = ((), _STEM[:88], _STEM[:40] + tuple(range(500, 540)), _STEM[:56] + tuple(range(600, 620)),
                     _STEM[:72] + tuple(range(700, 716)))


@dataclass(eq=False)
class PendingSeq(Seq):
    """A request and its steps scheduled but not yet processed (async
    scheduling): (tokens, drafts, produces output, stale)."""

    pending: list[list[Any]] = field(default_factory=list)


class SchedulerDriver(SchedulerQueries, SchedulerFrees, Driver):
    """One setup: vLLM 0.33.0's manager (reference) and a candidate, same requests."""

    seq_class = PendingSeq

    api: PartialBlockHits

    def __init__(
        self,
        setup: Setup,
        allow_known_bugs: bool = False,
        figures: Figures | None = None,
        build_hc: Callable[[Setup], Any] | None = None,
        build_ref: Callable[[Setup], Any] | None = None,
    ):
        from hybridcache_dev.drive import build_reference

        api = release(setup.release)
        assert isinstance(api, PartialBlockHits), f"SchedulerDriver drives the partial-block-hits profile, not {setup.release}"
        self.api = api
        self.s = setup
        try:
            self.ref = (build_ref or (lambda s: build_reference(api, s)))(setup)
        except Exception as e:  # a setup vLLM refuses: a driver bug
            raise ReferenceError_(f"vLLM refused the setup: {type(e).__name__}: {e}") from e
        self.hc = (build_hc or (lambda s: api.build_candidate(s, "hybridcache")))(setup)
        self.allow_known_bugs = allow_known_bugs
        self.f = figures if figures is not None else Figures()
        self.seqs: list[PendingSeq] = []  # type: ignore[assignment]
        self.finished_ids: list[str] = []
        self.ghosts: set[str] = set()
        self.deferred: list[Deferred] = []
        self._shim: Any = None
        # A KV connector (external tokens, async loads, its lookup form); vLLM
        # 0.33.0 keeps the legacy hashes with one (config/vllm.py L688).
        self.connector = setup.hash_lookahead == 0
        self.next_id = 0
        self.log: list[str] = []
        self.f.setups += 1
        self.f.context_parallel_setups += setup.dcp * setup.pcp > 1
        if setup.retention is not None:
            self.f.count("sparse_retention_setups")
        if setup.prefill_lookahead > 1:
            self.f.count("mtp_setups")  # multi-module MTP: re-prefillable tokens
        # What the scheduler reads to end chunks at junctions (scheduler.py L461).
        if self.hc.mamba_shared_prefix_checkpoint != self.ref.mamba_shared_prefix_checkpoint:
            raise Divergence(f"mamba_shared_prefix_checkpoint: vLLM {self.ref.mamba_shared_prefix_checkpoint}, "
                             f"hybridcache {self.hc.mamba_shared_prefix_checkpoint}")
        if self.ref.mamba_shared_prefix_checkpoint:
            self.f.count("shared_prefix_checkpoint_setups")
        for g in setup.groups:
            if g.kind == "mamba":
                self.f.count(f"mamba_{g.mode}_groups")

    # -- helpers --------------------------------------------------------------

    def own(self, m: Any, pair: tuple[Any, Any]) -> Any:
        """This manager's half of a pair of results (its own block objects)."""
        return pair[0] if m is self.ref else pair[1]

    def status(self, name: str) -> Any:
        from vllm.v1.request import RequestStatus

        return getattr(RequestStatus, name)

    def draw_tokens_and_id(self, c: Any) -> tuple[list[int], str]:
        tokens, rid = super().draw_tokens_and_id(c)
        if self.s.shared_prefix_checkpoint and c.chance(0.7):
            tail = [200 + c.randint(0, 4) for _ in range(c.randint(0, 16))]
            tokens = (list(c.choice(JUNCTION_PREFIXES)) + tail)[: self.s.max_model_len - 24] or [1]
        return tokens, rid

    def new_request(self, c: Any) -> Any:
        tokens, rid = self.draw_tokens_and_id(c)
        lora, salt, skip = c.chance(0.05), "salt" if c.chance(0.05) else None, c.chance(0.03)
        report_full = self.s.events and c.chance(0.2)
        if report_full and self.s.dcp > 1 and not self.allow_known_bugs:
            # vLLM 0.33.0 bug: with dcp > 1 the events for reused hits view
            # the hashes at the spec's unscaled block size, finer than the
            # hash blocks (block_pool.emit_cached_block_events ->
            # resolve_block_hashes: AssertionError). hybridcache reports them
            # at the scaled size (tests/v0_33/test_context_parallel.py).
            self.f.known_bug_avoided += 1
            report_full = False
        return self.api.make_request(
            self.s, rid, tokens, lora=lora, cache_salt=salt, skip_reading_prefix_cache=skip,
            report_full=report_full, session_id=f"s{c.randint(0, 2)}" if c.chance(0.1) else None,
        )

    def both(self, op: str, fn: Callable[[Any], Any], norm: Callable[[Any], Any] = lambda x: x) -> tuple[Any, Any]:
        """`Driver.both`, and where two big values (events, tables) first differ."""
        try:
            a = fn(self.ref)
        except Exception as e:
            raise ReferenceError_(f"vLLM raised on {op}: {type(e).__name__}: {e}") from e
        try:
            b = fn(self.hc)
        except Exception as e:
            raise Divergence(f"{op}: vLLM returned {norm(a)!r}, hybridcache raised {type(e).__name__}: {e}") from e
        na, nb = norm(a), norm(b)
        if na != nb:
            where = _first_difference(freeze(na), freeze(nb))
            raise Divergence(f"{op}{where}: vLLM {na!r} != hybridcache {nb!r}")
        return a, b

    def pick(self, c: Any, state: str | None = None) -> PendingSeq | None:
        cands = [q for q in self.seqs if state is None or q.state == state]
        return c.choice(cands) if cands else None

    def check(self, op: str) -> None:
        inv = getattr(self.hc, "check_invariants", None)
        if inv is not None:
            try:
                inv()
            except Exception as e:
                raise InvariantViolation(f"after {op}: {type(e).__name__}: {e}") from e
        ev, _ = self.both("take_events", lambda m: m.take_events(), lambda evs: tuple(self.api.norm_event(e) for e in evs))
        self.f.events += len(ev)
        self.both("num_free_blocks", lambda m: m.block_pool.get_num_free_blocks())
        self.both("usage", lambda m: norm_usage(m.usage))
        self.both("pool_state", pool_state)
        ids = self.rids() + sorted(self.ghosts)
        self.both("block_tables", lambda m: tuple(tuple(map(tuple, m.get_block_ids(r))) for r in ids))

    def running_any(self) -> bool:
        return any(q.state == "running" for q in self.seqs)

    # -- admission ---------------------------------------------------------------

    def lookup(self, c: Any, r: Any, connector: bool = False) -> tuple[Any, Any, int, bool]:
        """The scheduler's local hit (`_get_local_prefix_cache_hit`): plain, or
        the connector form with divergent hybrid hits; (ref's, candidate's
        blocks, hit, diverged)."""
        max_len = c.randint(0, r.num_tokens - 1) if c.chance(0.1) else None
        diverged = False
        if getattr(r, "kv_cache_report_mode", None) == "full" and not self.allow_known_bugs:
            self._steer_reused_hit_events(r, max_len, connector)
        if connector:
            (a, n, boundary, diverged), (b, *_) = self.both(
                f"get_computed_blocks_for_connector({r.request_id}, {max_len})",
                lambda m: m.get_computed_blocks_for_connector(r, max_len),
                lambda x: (norm_blocks(x[0]), x[1], x[2], x[3]),
            )
            self.f.count("connector_lookups")
        else:
            (a, n, boundary), (b, _, _) = self.both(
                f"get_computed_blocks({r.request_id}, {max_len})",
                lambda m: m.get_computed_blocks(r, max_len),
                lambda x: (norm_blocks(x[0]), x[1], x[2]),
            )
        r.shared_prefix_boundary = boundary
        if boundary:
            self.f.count("shared_prefix_boundaries")
        if n % self.s.scheduler_block_size:
            self.f.count("partial_hits")
        return a, b, n, diverged

    def _steer_reused_hit_events(self, r: Any, max_len: int | None, connector: bool) -> None:
        """vLLM 0.33.0 bug: with sub-block hits, the events for a reused hit
        ("full" report mode) index past a group's block hashes when the hit
        ends inside a block the prompt does not fill
        (block_pool.emit_cached_block_events: IndexError). The reference's
        hit is read first (a pure lookup); such a request is switched to
        incremental reports, every other one compared with its events."""
        if not self.ref.coordinator.enable_partial_hash_hits:
            return
        from vllm.v1.core.kv_cache_utils import resolve_block_hashes

        r.kv_cache_report_mode = "incremental"
        lookup = self.ref.get_computed_blocks_for_connector if connector else self.ref.get_computed_blocks
        blocks = lookup(r, max_len)[0].blocks
        hbs = self.ref.block_pool.hash_block_size
        groups = self.ref.coordinator.kv_cache_config.kv_cache_groups
        for g, group_blocks in enumerate(blocks):
            bs = groups[g].kv_cache_spec.block_size  # as emit_cached_block_events reads it
            if group_blocks and len(resolve_block_hashes(r.block_hashes, hbs, bs)) < len(group_blocks):
                self.f.known_bug_avoided += 1
                return
        r.kv_cache_report_mode = "full"
        self.f.count("reused_hit_reports_under_partial_hits")

    def op_lookup(self, c: Any) -> None:
        """A lookup the scheduler makes and then does not admit on (no room)."""
        q = self.pick(c, "waiting")
        if q is None or q.req.num_computed_tokens:
            return
        a, b, n, _ = self.lookup(c, q.req, connector=self.connector and c.chance(0.15))
        if n and c.chance(0.5):
            # A connector's remote hit superseding the local one (scheduler L1173).
            sbs = self.s.scheduler_block_size
            cut = c.randint(0, n // sbs) * sbs
            self.both(f"truncate_computed_blocks(<hit>, {cut})",
                      lambda m: m.truncate_computed_blocks(self.own(m, (a, b)), cut), norm_blocks)
        self.note(f"lookup {q.req.request_id} hit={n}")

    def _split_shim(self) -> Any:
        """The attributes 0.33.0's `Scheduler._mamba_block_aligned_split` reads,
        for this setup (a scheduler whose cache block is the scheduler block)."""
        if self._shim is None:
            from types import SimpleNamespace

            from vllm.v1.kv_cache_interface import MambaSpec

            sbs = self.s.scheduler_block_size
            specs = [g.kv_cache_spec for g in self.ref.kv_cache_config.kv_cache_groups]
            mamba = [sp for sp in specs if isinstance(sp, MambaSpec)]
            self._shim = SimpleNamespace(
                cache_config=SimpleNamespace(block_size=sbs),
                block_size=sbs,
                hash_block_size=self.s.hash_block_size,
                mamba_partial_cache_hit=self.s.hash_block_size < sbs and self.ref.coordinator.enable_partial_hash_hits,
                use_eagle_block_drop=self.s.use_eagle,
                num_hash_lookahead_tokens=self.s.hash_lookahead,
                mamba_has_prefill_checkpoint_blocks=all(sp.num_prefill_checkpoint_blocks > 0 for sp in mamba),
                mamba_prefill_checkpoint_alignment=mamba[0].prefill_checkpoint_alignment,
                max_num_scheduled_tokens=64,
                scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
            )
            # The scheduler's own gate (scheduler.py L461): it ends chunks at
            # junctions only where the manager keys them.
            self._shim.mamba_shared_prefix_checkpoint = (
                self._shim.mamba_partial_cache_hit and self.ref.mamba_shared_prefix_checkpoint)
        return self._shim

    def _scheduler_chunk(self, c: Any, r: Any, local: int = 0, ext: int = 0) -> int:
        """A prefill chunk as 0.33.0's scheduler cuts it: a token budget, the
        Mamba align split (vLLM's own rule), then the prefill-lookahead margin."""
        start = r.num_computed_tokens + local + ext
        new = c.randint(1, r.num_tokens - start)
        if self.s.align:
            from vllm.v1.core.sched.scheduler import Scheduler

            new = Scheduler._mamba_block_aligned_split(self._split_shim(), r, new, local, ext)
            if self._shim.mamba_shared_prefix_checkpoint and new and start + new == r.shared_prefix_boundary:
                self.f.count("chunks_ending_at_junctions")  # the manager keys the state there
        return self._reserve_prefill_lookahead(r, start, new)

    def _reserve_prefill_lookahead(self, r: Any, computed: int, new: int) -> int:
        """vLLM 0.33.0 never ends a prefill chunk within num_prefill_lookahead of its end."""
        rest = r.num_tokens - computed - new
        if 0 < rest < self.s.prefill_lookahead:
            new -= self.s.prefill_lookahead - rest
        return max(new, 0)

    def op_admit(self, c: Any) -> None:
        q = self.pick(c, "waiting")
        if q is None:
            return
        r: Any = q.req
        rid = r.request_id
        did_lookup = r.num_computed_tokens == 0
        ext = 0
        async_load = False
        if did_lookup:
            hit_ref, hit_hc, n, diverged = self.lookup(c, r, self.connector and c.chance(0.15))
            rest = r.num_tokens - n
            if self.connector and rest > 1 and c.chance(0.2) and not _skips_external(r):
                ext = c.randint(1, min(12, rest - 1))
                if self.s.align and not self.allow_known_bugs and not self._roomy(r.num_tokens + 4):
                    # vLLM 0.33.0 still under-counts Mamba align blocks for
                    # external tokens and raises half-way through.
                    self.f.known_bug_avoided += 1
                    ext = 0
                async_load = ext > 0 and c.chance(0.5)
            if diverged and not ext:
                # No external tokens back the deeper local hit: reconcile (scheduler L1200).
                self.f.count("diverged_hits")
                hit_ref, hit_hc, n, _ = self.lookup(c, r)
            computed = n + ext
        else:
            # Back from an async load: no lookup, the scheduler's empty blocks.
            hit_ref, hit_hc, n = self.ref.empty_kv_cache_blocks, self.hc.empty_kv_cache_blocks, 0
            computed = r.num_computed_tokens
        if async_load:
            new = 0
        else:
            new = self._scheduler_chunk(c, r, n, ext) if r.num_tokens > computed else 0
            if new == 0:
                return  # the scheduler skips the request this step
        groups = len(self.s.groups)
        kw = dict(
            num_new_computed_tokens=n,
            num_lookahead_tokens=0 if async_load else self.s.spec_tokens,
            num_external_computed_tokens=ext,
            delay_cache_blocks=async_load,
            skip_zeroing_group_ids=tuple(range(groups)) if async_load and c.chance(0.5) else (),
            num_encoder_tokens=0,
            full_sequence_must_fit=self.s.full_must_fit,
            reserved_blocks=c.randint(0, 3) if async_load else 0,
            has_scheduled_reqs=self.running_any(),
        )
        self.note(f"admit {rid} computed={r.num_computed_tokens} hit={n} new={new} {kw}")
        out, _ = self.both(
            f"allocate_slots({rid}, {new}, <hit>, {kw})",
            lambda m: m.allocate_slots(r, new, new_computed_blocks=self.own(m, (hit_ref, hit_hc)), **kw),
            norm_allocated,
        )
        self.f.allocations += 1
        if out is None:
            self.f.none_allocations += 1
            return
        if did_lookup:
            self.both(f"record_prefix_cache_stats({rid}, {n})", lambda m: m.record_prefix_cache_stats(r, n))
        self.f.hit_tokens += n
        if ext:
            self.f.count("async_loads" if async_load else "sync_external_loads")
        if async_load:
            q.state, q.load_target = "loading", computed
            r.status = self.status("WAITING_FOR_REMOTE_KVS")
            r.num_computed_tokens = computed
            return
        q.state = "running"
        r.status = self.status("RUNNING")
        r.num_computed_tokens = computed
        self._scheduled(c, q, new, drafts=0)

    def _scheduled(self, c: Any, q: PendingSeq, new: int, drafts: int) -> None:
        """`_update_after_schedule`: the step's tokens count as computed and in
        flight; a step past the prompt also holds output placeholders (async)."""
        r: Any = q.req
        r.num_computed_tokens += new
        r.num_in_flight_tokens += new
        output = r.num_computed_tokens >= r.num_tokens
        if output and self.s.async_sched:
            r.num_output_placeholders += 1 + drafts
        q.pending.append([new, drafts if output else 0, output, False])
        if not self.s.async_sched:
            self._processed(c, q)

    def _processed(self, c: Any, q: PendingSeq) -> None:
        """`update_from_output` of the request's oldest step: sample, reject
        drafts, cache the verified tokens (scheduler L2412)."""
        r: Any = q.req
        new, drafts, output, stale = q.pending.pop(0)
        r.num_in_flight_tokens -= new
        if stale or not output:
            return  # stale output of a preempted request is dropped
        had_placeholders = r.num_output_placeholders > 0
        if self.s.async_sched:
            r.num_output_placeholders -= 1 + drafts
        accepted = c.randint(0, drafts)
        r.num_computed_tokens -= drafts - accepted
        r.append_output_token_ids([100 + c.randint(0, 2) for _ in range(accepted + 1)])
        if had_placeholders or self.s.spec_tokens > 0:
            n = r.num_computed_tokens - r.num_in_flight_tokens
            self.both(f"cache_blocks({r.request_id}, {n})", lambda m: m.cache_blocks(r, n))

    def op_outputs(self, c: Any) -> None:
        """A step's outputs arrive: each request's oldest unprocessed step."""
        for q in list(self.seqs):
            if q.pending:
                self._processed(c, q)

    # -- running requests ----------------------------------------------------------

    def op_step(self, c: Any, raw: bool = False) -> None:
        """A prefill chunk or a decode of a running request; `raw`: it is
        allocated, then preempted in the same step (priority preemption)."""
        q = self.pick(c, "running")
        if q is None:
            return
        r: Any = q.req
        if q.pending and (len(q.pending) >= 2 or c.chance(0.3)):
            self._processed(c, q)  # at most two steps in flight
            return
        left = r.num_tokens - r.num_computed_tokens
        drafts = 0
        if left <= 1 or r.num_output_placeholders:
            k = self.s.spec_tokens
            drafts = c.randint(0, k) if self.s.dynamic_drafts else k
            new = 1 + drafts
        else:
            new = self._scheduler_chunk(c, r)
            if new == 0:
                return
        if r.num_computed_tokens + new >= self.s.max_model_len - 1 or r.num_tokens + self.s.spec_tokens + 2 >= self.s.max_model_len:
            self._finish(q, c)
            return
        rid = r.request_id
        k = self.s.spec_tokens
        if r.num_in_flight_tokens:
            self.f.count("in_flight_allocations")
        self.note(f"step {rid} computed={r.num_computed_tokens} tokens={r.num_tokens} new={new} raw={raw}")
        out, _ = self.both(f"allocate_slots({rid}, {new}, num_lookahead_tokens={k})",
                           lambda m: m.allocate_slots(r, new, num_lookahead_tokens=k), norm_allocated)
        self.f.allocations += 1
        if out is None:
            self.f.none_allocations += 1
            others = [o for o in self.seqs if o.state == "running" and o is not q]
            if others and c.chance(0.5):
                self._preempt(others[-1], c)  # the scheduler preempts running[-1]
            return
        if raw:
            self._preempt(q, c)
            return
        self._scheduled(c, q, new, drafts)

    def op_finish_load(self, c: Any) -> None:
        """`_update_waiting_for_remote_kv`: cache what arrived; a load that
        failed (all of it, or past a point) keeps only the valid prefix."""
        q = self.pick(c, "loading")
        if q is None:
            return
        r: Any = q.req
        failed = c.chance(0.3)
        zeroing = failed and any(g.kind == "mamba" for g in self.s.groups)
        if failed:
            r.num_computed_tokens = c.randint(0, q.load_target) if c.chance(0.5) else 0
            if zeroing:
                # The valid prefix ends on a block boundary (the first invalid block).
                r.num_computed_tokens -= r.num_computed_tokens % self.s.scheduler_block_size
            self.f.count("load_failures")
        n = r.num_computed_tokens
        self.note(f"finish_load {r.request_id} -> {n} of {q.load_target}")
        if n:
            self.both(f"cache_blocks({r.request_id}, {n})", lambda m: m.cache_blocks(r, n))
            if zeroing:
                # Models with Mamba layers zero what the load left unwritten (scheduler L3483-3489).
                self.both(f"record_blocks_for_zeroing({r.request_id}, {n})",
                          lambda m: m.record_blocks_for_zeroing(r.request_id, n))
                self.f.count("zeroing_rerecords")
        else:
            # No valid computed tokens: the scheduler frees the blocks.
            self.both(f"free({r.request_id})", lambda m: m.free(r))
        q.state = "waiting"
        r.status = self.status("WAITING")

    # -- steps, queries ----------------------------------------------------------------

    def op_new_step(self, c: Any) -> None:
        self.both("new_step_starts", lambda m: m.new_step_starts())
        self.both("take_boundary_state_offloads", lambda m: m.take_boundary_state_offloads(),
                  lambda x: tuple(sorted((k, tuple(v)) for k, v in x.items())))
        self._take_copies(c)
        self.both("take_new_block_ids", lambda m: list(m.take_new_block_ids()))

    def _take_copies(self, c: Any = None) -> None:
        """The step's copy-on-write copies; their retained endpoints go back
        to the pool after the step (`_free_cow_retained_blocks`)."""
        (copies, kept), (_, kept_hc) = self.both(
            "take_kv_cache_block_copies", lambda m: m.take_kv_cache_block_copies(),
            lambda x: (tuple((cp.src_block_id, cp.dst_block_id) for cp in x[0]), norm_block_list(x[1])))
        if not copies:
            return
        self.f.count("cow_copies", len(copies))
        if c is not None and self.s.deferred_frees and c.chance(0.5):
            # Queued reversed so the drain's reversed() frees them in order.
            self.deferred.append(Deferred("cow retained", (kept[::-1], kept_hc[::-1])))
        else:
            self.both("block_pool.free_blocks(<cow retained>)",
                      lambda m: m.block_pool.free_blocks(self.own(m, (kept, kept_hc))))

    def op_cache_blocks(self, c: Any) -> None:
        """As the scheduler does after outputs and loads: never past the
        processed tokens (in-flight ones are not computed yet). With Mamba
        "align" and prefix caching exactly as it does: the processed count,
        after an output that carries tokens (none mid-prefill); a Mamba
        partial tail cached behind the request, or keyed again after its
        copy-on-write, makes vLLM assert
        (tests/v0_34/test_partial_tail_behind.py)."""
        q = self.pick(c, "running")
        if q is None:
            return
        r: Any = q.req
        hi = max(0, r.num_computed_tokens - r.num_in_flight_tokens)
        n = c.randint(0, hi)
        as_scheduler = self.s.caching and any(g.kind == "mamba" and g.mode == "align" for g in self.s.groups)
        if as_scheduler:
            n = hi
        if self.s.shared_prefix_checkpoint and 0 < r.shared_prefix_boundary <= hi and c.chance(0.3):
            # At a junction already computed: the manager must not key the
            # running state there (it keys junctions ahead of the computed
            # tokens only).
            n = r.shared_prefix_boundary
            self.f.count("cache_blocks_at_computed_junctions")
        elif as_scheduler and hi < max(r.num_prompt_tokens, r.num_tokens - 1):
            return  # mid-prefill: no output, no call
        self.note(f"cache_blocks {r.request_id} {n}")
        self.both(f"cache_blocks({r.request_id}, {n})", lambda m: m.cache_blocks(r, n))

    def op_remove_skipped(self, c: Any) -> None:
        q = self.pick(c, "running")
        if q is None:
            return
        r: Any = q.req
        n = c.randint(0, max(0, r.num_computed_tokens - r.num_in_flight_tokens))
        prompt = r.num_prompt_tokens if c.chance(0.7) else None
        self.note(f"remove_skipped {r.request_id} {n} {prompt}")
        self.both(f"remove_skipped_blocks({r.request_id}, {n}, {prompt})",
                  lambda m: m.remove_skipped_blocks(r.request_id, n, prompt))

    OPS: tuple[tuple[str, int], ...] = (
        ("arrive", 8),
        ("lookup", 3),
        ("admit", 14),
        ("step", 30),
        ("raw_step", 2),
        ("finish_load", 4),
        ("preempt", 3),
        ("finish", 6),
        ("free_unknown", 1),
        ("drain_deferred", 4),
        ("outputs", 5),
        ("evict", 3),
        ("reset", 1),
        ("remove_skipped", 3),
        ("new_step", 6),
        ("cache_blocks", 3),
        ("common_prefix", 1),
        ("queries", 3),
        ("per_group_hits", 1),
    )

    def drain(self) -> None:
        for q in list(self.seqs):
            self._finish(q)
        self._take_copies()
        while self.deferred:
            d = self.deferred.pop(0)
            self.both(f"block_pool.free_blocks(<{d.what}>)",
                      lambda m: m.block_pool.free_blocks(reversed(self.own(m, d.blocks))))
        self.check("drain")
        ok, _ = self.both("reset_prefix_cache", lambda m: m.reset_prefix_cache())
        if not ok:
            raise Divergence("reset_prefix_cache refused after every request was freed")
        self.check("final reset")


__all__ = ["Deferred", "SchedulerDriver", "ReferenceError_"]


def _skips_external(r: Any) -> bool:
    """Whether the scheduler reads no external (connector) hit for `r`:
    0.34.0's `skip_reading_external_kv` (any bounded request), else
    `skip_reading_prefix_cache`."""
    external = getattr(r, "skip_reading_external_kv", None)
    return bool(r.skip_reading_prefix_cache if external is None else external)
