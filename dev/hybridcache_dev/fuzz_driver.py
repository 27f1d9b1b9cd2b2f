"""The long fuzz's base driver: one setup, vLLM's manager (the reference)
and hybridcache's, the same random API-level operations to both (not only what
a scheduler does), every output compared and `check_invariants()` after every
operation. Every operation is legal for the whole-block-hits releases; inputs
that trigger known vLLM bugs (which hybridcache reproduces) are steered around and counted.
Bad inputs (hybridcache only) come from `bad_inputs.BadInputs`."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hybridcache.request import LoRARequest, Request
from hybridcache_dev.bad_inputs import BadInputs
from hybridcache_dev.block_metrics import observe
from hybridcache.tools.compare import norm_allocated, norm_blocks, norm_event, norm_stats, norm_usage, pool_state
from hybridcache_dev.fuzz_setup import Divergence, Figures, InvariantViolation, ReferenceError_, Setup, build_hybridcache, build_vllm


@dataclass(eq=False)
class Seq:
    req: Request
    state: str = "waiting"  # waiting | running | loading
    load_target: int = 0



# ---------------------------------------------------------------------------
# The driver


PREFIXES = (
    (),
    tuple(range(11, 31)),
    tuple(range(11, 19)) + tuple(range(40, 56)),
    tuple(range(60, 84)),
    tuple(range(11, 31)) + tuple(range(90, 110)),
)


class Driver(BadInputs):
    """One setup: vLLM's manager (reference) and hybridcache's, same requests.

    `build_hc` / `build_ref` build the managers from the setup (default:
    hybridcache's and vLLM's)."""

    # What the driver keeps of each request (a release's driver adds its state).
    seq_class: type[Seq] = Seq

    def __init__(
        self,
        setup: Setup,
        allow_known_bugs: bool = False,
        figures: Figures | None = None,
        build_hc: Callable[[Setup], Any] = build_hybridcache,
        build_ref: Callable[[Setup], Any] = build_vllm,
    ):
        self.s = setup
        self.ref = build_ref(setup)
        self.hc = build_hc(setup)
        self.other = build_hc(setup)  # source of foreign KVCacheBlocks
        self.allow_known_bugs = allow_known_bugs
        self.f = figures if figures is not None else Figures()
        self.seqs: list[Seq] = []
        self.finished_ids: list[str] = []
        self.ghosts: set[str] = set()  # ids given to get_num_common_prefix_blocks only
        self.next_id = 0
        self.log: list[str] = []
        self.f.setups += 1
        self.f.context_parallel_setups += setup.dcp * setup.pcp > 1
        self.f.metrics_setups += setup.metrics_sample_rate is not None

    # -- helpers --------------------------------------------------------------

    def note(self, text: str) -> None:
        self.log.append(text)
        if len(self.log) > 40:
            del self.log[:10]

    def both(self, op: str, fn: Callable[[Any], Any], norm: Callable[[Any], Any] = lambda x: x) -> tuple[Any, Any]:
        """Applies `fn` to vLLM then hybridcache and compares the normalized results."""
        state = random.getstate()  # both collectors sample from the same draws
        try:
            a = fn(self.ref)
        except Exception as e:  # the reference failed: the input was not legal after all
            raise ReferenceError_(f"vLLM raised on {op}: {type(e).__name__}: {e}") from e
        random.setstate(state)
        try:
            b = fn(self.hc)
        except Exception as e:
            raise Divergence(f"{op}: vLLM returned {norm(a)!r}, hybridcache raised {type(e).__name__}: {e}") from e
        na, nb = norm(a), norm(b)
        if na != nb:
            raise Divergence(f"{op}: vLLM {na!r} != hybridcache {nb!r}")
        return a, b

    def rids(self) -> list[str]:
        return [q.req.request_id for q in self.seqs]

    def pick(self, c: Any, state: str | None = None) -> Seq | None:
        cands = [q for q in self.seqs if state is None or q.state == state]
        return c.choice(cands) if cands else None

    def draw_tokens_and_id(self, c: Any) -> tuple[list[int], str]:
        """A new request's tokens (a shared prefix and a tail) and its id
        (now and then a finished request's, reused)."""
        prefix = list(c.choice(PREFIXES))
        tail = [200 + c.randint(0, 4) for _ in range(c.randint(0, 40))]
        tokens = (prefix + tail)[: self.s.max_model_len - 24] or [1]
        if self.finished_ids and c.chance(0.2):
            rid = self.finished_ids.pop(c.randint(0, len(self.finished_ids) - 1))
        else:
            rid = f"r{self.next_id}"
            self.next_id += 1
        return tokens, rid

    def new_request(self, c: Any) -> Request:
        tokens, rid = self.draw_tokens_and_id(c)
        lora = LoRARequest("lora-a", 1) if c.chance(0.05) else None
        salt = "salt" if c.chance(0.05) else None
        return Request(rid, tokens, self.s.hash_block_size, lora_request=lora, cache_salt=salt,
                       skip_reading_prefix_cache=c.chance(0.03))

    def check(self, op: str) -> None:
        """After every op: invariants, events, pool state, every table."""
        try:
            self.hc.check_invariants()
        except Exception as e:
            raise InvariantViolation(f"after {op}: {type(e).__name__}: {e}") from e
        ev, _ = self.both("take_events", lambda m: m.take_events(), lambda evs: tuple(norm_event(e) for e in evs))
        self.f.events += len(ev)
        self.both("num_free_blocks", lambda m: m.block_pool.get_num_free_blocks())
        self.both("usage", lambda m: norm_usage(m.usage))
        self.both("pool_state", pool_state)
        if self.s.metrics_sample_rate is not None:
            self.both("metrics_collector calls, sampled blocks, evictions", lambda m: observe(m.metrics_collector))
        ids = self.rids() + sorted(self.ghosts)
        self.both("block_tables", lambda m: tuple(tuple(map(tuple, m.get_block_ids(r))) for r in ids))

    # -- operations (each legal for vLLM) ---------------------------------------

    def op_arrive(self, c: Any) -> None:
        if len(self.seqs) >= 10:
            return
        r = self.new_request(c)
        self.seqs.append(self.seq_class(r))
        self.note(f"arrive {r.request_id} tokens={r.num_tokens}")

    def op_lookup(self, c: Any) -> None:
        q = self.pick(c)
        if q is None:
            return
        (a, _), _ = self.both(f"get_computed_blocks({q.req.request_id})", lambda m: m.get_computed_blocks(q.req),
                              lambda r: (norm_blocks(r[0]), r[1]))
        self.note(f"lookup {q.req.request_id}")

    def _chunk(self, c: Any, start: int, left: int) -> int:
        n = c.randint(1, left)
        if self.s.align and n < left and c.chance(0.8):
            # vLLM's scheduler ends non-final Mamba-align chunks on block boundaries.
            bs = min(g.block_size for g in self.s.groups)
            end = (start + n) // bs * bs
            n = end - start if end > start else min(left, bs - start % bs)
        return max(1, n)

    def _later_group_free_hit(self, hit_ids: Sequence[Sequence[int]]) -> bool:
        """vLLM bug (whole-block-hits): external-token blocks of an earlier group may pop a
        later group's free prefix-cache hit (one block then serves two groups)."""
        return any(b != 0 and self.hc.block_pool.blocks[b].ref_cnt == 0 for g in hit_ids[1:] for b in g)

    def _roomy(self, tokens: int) -> bool:
        """Free blocks suffice for `tokens` tokens whatever the groups count."""
        bound = sum(-(-min(tokens, self.s.max_model_len) // g.block_size) + g.num_spec + 1 for g in self.s.groups)
        return self.hc.block_pool.get_num_free_blocks() >= bound

    def op_admit(self, c: Any) -> None:
        q = self.pick(c, "waiting")
        if q is None:
            return
        r = q.req
        rid = r.request_id
        if c.chance(0.85):
            (hit_ref, n), (hit_hc, _) = self.both(f"get_computed_blocks({rid})", lambda m: m.get_computed_blocks(r),
                                                  lambda x: (norm_blocks(x[0]), x[1]))
        else:
            hit_ref, hit_hc, n = None, None, 0
        rest = r.num_tokens - n
        ext = c.randint(1, min(12, rest - 1)) if rest > 1 and c.chance(0.2) else 0
        if ext and hit_ref is not None and not self.allow_known_bugs and self._later_group_free_hit(hit_ref.get_block_ids()):
            self.f.known_bug_avoided += 1
            ext = 0
        if ext and self.s.align and not self.allow_known_bugs and not self._roomy(r.num_tokens + 4):
            # vLLM bug (whole-block-hits): Mamba align does not count the blocks taken for
            # external tokens; vLLM raises ValueError half-way through (the
            # reference breaks), hybridcache answers None.
            self.f.known_bug_avoided += 1
            ext = 0
        async_load = ext > 0 and c.chance(0.5)
        new = 0 if async_load else self._chunk(c, n + ext, rest - ext)
        kw = dict(
            num_lookahead_tokens=c.randint(1, 4) if c.chance(0.2) else 0,
            num_external_computed_tokens=ext,
            delay_cache_blocks=async_load or c.chance(0.05),
            full_sequence_must_fit=c.chance(0.2),
            reserved_blocks=c.randint(1, 3) if c.chance(0.1) else 0,
        )
        self.note(f"admit {rid} hit={n} new={new} {kw}")
        out, _ = self.both(
            f"allocate_slots({rid}, {new}, {n}, <hit>, {kw})",
            lambda m: m.allocate_slots(r, new, n, hit_ref if m is self.ref else hit_hc, **kw),
            norm_allocated,
        )
        self.f.allocations += 1
        if out is None:
            self.f.none_allocations += 1
            return
        self.f.hit_tokens += n
        if async_load:
            q.state, q.load_target = "loading", n + ext
        else:
            q.state = "running"
            r.num_computed_tokens = n + ext + new
            if r.num_computed_tokens == r.num_tokens:
                r.append_output_token_ids(100 + c.randint(0, 2))

    def op_step(self, c: Any, raw: bool = False) -> None:
        """A prefill chunk or a decode round of a running request; `raw`: an
        allocation with random counts that the request then does not run."""
        q = self.pick(c, "running")
        if q is None:
            return
        r = q.req
        left = r.num_tokens - r.num_computed_tokens
        decode = left == 1
        k = 0
        if raw:
            new = c.randint(1, left + 8)
        elif decode:
            k = c.choice((0, 0, 1, 2, 3, 5, 8, 16)) if c.chance(0.6) else 0
            new = 1 + k
        else:
            new = self._chunk(c, r.num_computed_tokens, left)
        if r.num_computed_tokens + new >= self.s.max_model_len - 1 or r.num_tokens + k + 2 >= self.s.max_model_len:
            self._finish(q)
            return
        kw = dict(
            num_lookahead_tokens=c.randint(1, 4) if c.chance(0.2) else 0,
            delay_cache_blocks=c.chance(0.03),
            full_sequence_must_fit=c.chance(0.05),
            reserved_blocks=c.randint(1, 2) if c.chance(0.05) else 0,
        )
        if c.chance(0.7):
            # Mostly the scheduler's own spelling for a running request:
            # (request, n, num_lookahead_tokens=k), defaults left out.
            kw = {k: v for k, v in kw.items() if k == "num_lookahead_tokens" or v}
        rid = r.request_id
        self.note(f"step {rid} computed={r.num_computed_tokens} tokens={r.num_tokens} new={new} raw={raw} {kw}")
        out, _ = self.both(f"allocate_slots({rid}, {new}, {kw})", lambda m: m.allocate_slots(r, new, **kw), norm_allocated)
        self.f.allocations += 1
        if out is None:
            self.f.none_allocations += 1
            # As a scheduler would: preempt another holder now and then.
            others = [o for o in self.seqs if o.state != "waiting" and o is not q]
            if others and c.chance(0.5):
                self._preempt(c.choice(others))
            return
        if raw:
            return
        if decode:
            acc = c.randint(0, k)
            r.num_computed_tokens += 1 + acc
            r.append_output_token_ids([100 + c.randint(0, 2) for _ in range(acc + 1)])
        else:
            r.num_computed_tokens += new
            if r.num_computed_tokens == r.num_tokens:
                r.append_output_token_ids(100 + c.randint(0, 2))

    def op_finish_load(self, c: Any) -> None:
        q = self.pick(c, "loading")
        if q is None:
            return
        r = q.req
        self.note(f"finish_load {r.request_id} -> {q.load_target}")
        self.both(f"cache_blocks({r.request_id}, {q.load_target})", lambda m: m.cache_blocks(r, q.load_target))
        r.num_computed_tokens = q.load_target
        q.state = "running"

    def _preempt(self, q: Seq) -> None:
        self.both(f"free({q.req.request_id})", lambda m: m.free(q.req))
        q.state = "waiting"
        q.req.num_computed_tokens = 0
        q.req.num_preemptions += 1
        self.f.preemptions += 1

    def _finish(self, q: Seq) -> None:
        self.both(f"free({q.req.request_id})", lambda m: m.free(q.req))
        self.seqs.remove(q)
        self.finished_ids.append(q.req.request_id)
        self.note(f"finish {q.req.request_id}")

    def op_preempt(self, c: Any) -> None:
        holders = [q for q in self.seqs if q.state != "waiting"]
        if not holders:
            return
        storm = c.chance(0.3)
        for q in holders:
            if storm or q is holders[-1]:
                self.note(f"preempt {q.req.request_id}")
                self._preempt(q)
            if not storm:
                break

    def op_finish(self, c: Any) -> None:
        q = self.pick(c)
        if q is not None:
            self._finish(q)

    def op_free_unknown(self, c: Any) -> None:
        ghost = Request(f"ghost{c.randint(0, 3)}", [1, 2, 3], self.s.hash_block_size)
        self.both("free(<unknown>)", lambda m: m.free(ghost))
        self.ghosts.discard(ghost.request_id)

    def op_evict(self, c: Any) -> None:
        n = self.s.num_blocks
        if c.chance(0.3):
            ids = {b.block_id for b in self.hc.block_pool.blocks if b.block_hash is not None}
        else:
            ids = {c.randint(0, n - 1) for _ in range(c.randint(0, 5))}
        self.note(f"evict {sorted(ids)}")
        self.both(f"evict_blocks({sorted(ids)})", lambda m: m.evict_blocks(ids))
        self.f.evictions += 1

    def op_reset(self, c: Any) -> None:
        ok, _ = self.both("reset_prefix_cache", lambda m: m.reset_prefix_cache())
        self.f.resets += bool(ok)

    def op_remove_skipped(self, c: Any) -> None:
        q = self.pick(c, "running")
        if q is None:
            return
        total = c.randint(0, q.req.num_computed_tokens)
        rid = q.req.request_id
        self.note(f"remove_skipped {rid} {total}")
        self.both(f"remove_skipped_blocks({rid}, {total})", lambda m: m.remove_skipped_blocks(rid, total))

    def op_new_step(self, c: Any) -> None:
        self.both("new_step_starts", lambda m: m.new_step_starts())

    def op_cache_blocks(self, c: Any) -> None:
        q = self.pick(c, "running")
        if q is None:
            return
        n = c.randint(0, q.req.num_computed_tokens)
        self.note(f"cache_blocks {q.req.request_id} {n}")
        self.both(f"cache_blocks({q.req.request_id}, {n})", lambda m: m.cache_blocks(q.req, n))

    def op_common_prefix(self, c: Any) -> None:
        if c.chance(0.1):
            rid = f"ghost{c.randint(0, 3)}"
            self.ghosts.add(rid)
        else:
            q = self.pick(c, "running")
            if q is None:
                return
            rid = q.req.request_id
        self.both(f"get_num_common_prefix_blocks({rid})", lambda m: list(m.get_num_common_prefix_blocks(rid)))

    def op_queries(self, c: Any) -> None:
        self.both("take_new_block_ids", lambda m: list(m.take_new_block_ids()))
        self.both("make_prefix_cache_stats", lambda m: m.make_prefix_cache_stats(), norm_stats)
        rid = c.choice(self.rids() + ["nobody"])
        self.both(f"get_blocks({rid})", lambda m: m.get_blocks(rid), norm_blocks)

    OPS: tuple[tuple[str, int], ...] = (
        ("arrive", 8),
        ("lookup", 3),
        ("admit", 14),
        ("step", 30),
        ("raw_step", 3),
        ("finish_load", 4),
        ("preempt", 3),
        ("finish", 6),
        ("free_unknown", 1),
        ("evict", 3),
        ("reset", 1),
        ("remove_skipped", 3),
        ("new_step", 6),
        ("cache_blocks", 3),
        ("common_prefix", 2),
        ("queries", 3),
        ("bad_input", 4),
    )

    def step_random(self, c: Any) -> str:
        total = sum(w for _, w in self.OPS)
        x = c.randint(0, total - 1)
        for name, w in self.OPS:
            if x < w:
                break
            x -= w
        self.run_op(name, c)
        return name

    def run_op(self, name: str, c: Any) -> None:
        if name == "raw_step":
            self.op_step(c, raw=True)
        elif name == "bad_input":
            self.op_bad_input(c)
        else:
            getattr(self, f"op_{name}")(c)
        self.f.ops += 1
        self.check(name)

    def drain(self) -> None:
        for q in list(self.seqs):
            self._finish(q)
        for g in list(self.ghosts):
            ghost = Request(g, [1], self.s.hash_block_size)
            self.both(f"free({g})", lambda m: m.free(ghost))
        self.ghosts.clear()
        self.check("drain")
        ok, _ = self.both("reset_prefix_cache", lambda m: m.reset_prefix_cache())
        if not ok:
            raise Divergence("reset_prefix_cache refused after every request was freed")
        self.check("final reset")

    # -- bad inputs (hybridcache only) ----------------------------------------------
