"""Long differential fuzz of `hybridcache.KVCacheManager` against vLLM 0.23.0's.

    python -m hybridcache.fuzz --ops 200000 --seed 1 [--mix full,full_sw] [--caching both]

Random API-level operations (not only what a scheduler does: lookups of any
request, allocations with random token counts, drafts jumping up and down,
lookahead, external computed tokens with async loads, delayed caching,
full_sequence_must_fit, reserved blocks, preemption storms, evictions of any
block ids, prefix-cache resets, remove_skipped_blocks, cache_blocks,
common-prefix queries of any id, ...) go to both managers with the same
request objects; every output is compared (block ids and which are unhashed,
hit lengths, None, free count, usage, events, stats, common prefix blocks,
new block ids), and after every operation also every block's ref_cnt and
hash, the free queue's order and every request's block table.
`check_invariants()` runs after every operation.

Interleaved with them, bad inputs (bad counts, unknown ids, foreign
KVCacheBlocks, wrong hash types, out-of-range eviction ids, ...) go to
hybridcache only: each must raise a clear ValueError / TypeError / KeyError /
NotImplementedError (never a PanicException or RuntimeError) and leave the
state exactly as it was (free queue, ref counts, block hashes, every
request's block ids, known hashes).

Every sequence is legal for vLLM 0.23.0; inputs that trigger known vLLM bugs
(which hybridcache reproduces) are steered around and counted, unless
`--allow-known-bugs`. Exit status 0 iff no divergence and no invariant
violation was found. The driver is also used by tests/test_fuzz_stateful.py
(hypothesis) and tests/test_fuzz_slice.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .replay import norm_allocated, norm_blocks, norm_event, norm_stats
from .request import LoRARequest, Request

MIXES = ("full", "full_sw", "full_mamba_align", "sw_mamba", "full_mamba3", "full_chunked")
MAX_MODEL_LEN = 128
ACCEPTED_ERRORS = (ValueError, TypeError, KeyError, NotImplementedError)


class Divergence(AssertionError):
    """hybridcache answered an operation differently from vLLM."""


class InvariantViolation(AssertionError):
    """hybridcache's check_invariants() failed (or state checks around it)."""


class BadInputFailure(AssertionError):
    """A bad input was not rejected cleanly (wrong exception or state changed)."""


class ReferenceError_(Exception):
    """vLLM itself failed on an input the driver considers legal."""


# ---------------------------------------------------------------------------
# Configurations


@dataclass(frozen=True)
class Group:
    kind: str  # full | sw | chunked | mamba
    block_size: int
    param: int = 0  # window / chunk size
    mode: str = "none"  # mamba cache mode
    num_spec: int = 0


@dataclass
class Setup:
    mix: str
    caching: bool
    groups: tuple[Group, ...]
    scheduler_block_size: int
    hash_block_size: int
    num_blocks: int
    use_eagle: bool
    events: bool
    log_stats: bool
    max_model_len: int = MAX_MODEL_LEN

    @property
    def align(self) -> bool:
        return any(g.kind == "mamba" and g.mode == "align" for g in self.groups)

    def describe(self) -> str:
        gs = ",".join(
            f"{g.kind}@{g.block_size}" + (f":{g.param}" if g.param else "") + (f":{g.mode}/{g.num_spec}" if g.kind == "mamba" else "")
            for g in self.groups
        )
        return (
            f"{self.mix} [{gs}] caching={self.caching} num_blocks={self.num_blocks} sbs={self.scheduler_block_size} "
            f"hbs={self.hash_block_size} eagle={self.use_eagle} events={self.events} stats={self.log_stats}"
        )


def random_setup(rng: Any, mix: str, caching: bool) -> Setup:
    """A random configuration of `mix` that vLLM 0.23.0 accepts."""
    mode = "none"
    groups: tuple[Group, ...]
    if mix == "full":
        bs = rng.choice((4, 8))
        groups, sbs, hbs = (Group("full", bs),), bs, bs
    elif mix == "full_sw":
        sw_bs = rng.choice((4, 8))
        groups = (Group("full", 4), Group("sw", sw_bs, rng.randint(3, 14)))
        sbs, hbs = 8, 4
    elif mix == "full_mamba_align":
        bs = rng.choice((4, 8))
        mode = "align" if caching else "none"
        groups = (Group("full", bs), Group("mamba", bs, mode=mode, num_spec=rng.randint(1, 3)))
        sbs = hbs = bs
    elif mix == "sw_mamba":
        mode = rng.choice(("align", "all")) if caching else "none"
        groups = (Group("sw", 4, rng.randint(2, 10)), Group("mamba", 4, mode=mode, num_spec=rng.randint(0, 1)))
        sbs = hbs = 4
    elif mix == "full_mamba3":
        mode = "align" if caching else "none"
        m = Group("mamba", 4, mode=mode, num_spec=rng.randint(0, 2))
        groups = (Group("full", 4), m, m, m)
        sbs = hbs = 4
    elif mix == "full_chunked":
        # vLLM: chunked local attention's block size is the scheduler's.
        sbs = rng.choice((4, 8))
        groups = (Group("full", 4), Group("chunked", sbs, rng.choice((8, 16))))
        hbs = 4
    else:
        raise ValueError(f"unknown mix {mix!r}; choose from {', '.join(MIXES)}")
    eagle = rng.random() < 0.25 and mix != "full_chunked"  # vLLM: no EAGLE with chunked local
    return Setup(
        mix=mix,
        caching=caching,
        groups=groups,
        scheduler_block_size=sbs,
        hash_block_size=hbs if caching else sbs,
        num_blocks=rng.randint(10, 44),
        use_eagle=eagle,
        events=caching and rng.random() < 0.7,
        log_stats=rng.random() < 0.5,
    )


def _manager_kwargs(s: Setup) -> dict[str, Any]:
    return dict(
        max_model_len=s.max_model_len,
        scheduler_block_size=s.scheduler_block_size,
        hash_block_size=s.hash_block_size,
        enable_caching=s.caching,
        use_eagle=s.use_eagle,
        log_stats=s.log_stats,
        enable_kv_cache_events=s.events,
    )


def build_hybridcache(s: Setup) -> Any:
    import hybridcache as hc

    def spec(g: Group) -> Any:
        if g.kind == "full":
            return hc.FullAttentionSpec(block_size=g.block_size)
        if g.kind == "sw":
            return hc.SlidingWindowSpec(block_size=g.block_size, sliding_window=g.param)
        if g.kind == "chunked":
            return hc.ChunkedLocalAttentionSpec(block_size=g.block_size, attention_chunk_size=g.param)
        return hc.MambaSpec(block_size=g.block_size, shapes=((1, 1),), dtypes=("f32",),
                            mamba_cache_mode=g.mode, num_speculative_blocks=g.num_spec)

    groups = [hc.KVCacheGroupSpec([f"layer{i}"], spec(g)) for i, g in enumerate(s.groups)]
    return hc.KVCacheManager(hc.KVCacheConfig(s.num_blocks, [], groups), **_manager_kwargs(s))


def build_vllm(s: Setup) -> Any:
    import torch
    from vllm.v1 import kv_cache_interface as iface
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    common = dict(num_kv_heads=1, head_size=1, dtype=torch.float32)

    def spec(g: Group) -> Any:
        if g.kind == "full":
            return iface.FullAttentionSpec(block_size=g.block_size, **common)
        if g.kind == "sw":
            return iface.SlidingWindowSpec(block_size=g.block_size, sliding_window=g.param, **common)
        if g.kind == "chunked":
            return iface.ChunkedLocalAttentionSpec(block_size=g.block_size, attention_chunk_size=g.param, **common)
        return iface.MambaSpec(block_size=g.block_size, shapes=((1, 1),), dtypes=(torch.float32,),
                               mamba_cache_mode=g.mode, num_speculative_blocks=g.num_spec)

    groups = [iface.KVCacheGroupSpec([f"layer{i}"], spec(g)) for i, g in enumerate(s.groups)]
    cfg = iface.KVCacheConfig(num_blocks=s.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    return KVCacheManager(cfg, **_manager_kwargs(s))


# ---------------------------------------------------------------------------
# Normalization of outputs


def pool_state(m: Any) -> Any:
    """(ref_cnt, hash) of every block and the free queue order, via the vLLM API."""
    bp = m.block_pool
    blocks = tuple((b.ref_cnt, b.block_hash) for b in bp.blocks)
    return blocks, tuple(b.block_id for b in bp.free_block_queue.get_all_free_blocks())


# ---------------------------------------------------------------------------
# Random choices: a random.Random, or hypothesis' `data` (see the tests).


class RngChooser:
    def __init__(self, rng: random.Random):
        self.rng = rng

    def randint(self, a: int, b: int) -> int:
        return self.rng.randint(a, b)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def choice(self, seq: Sequence[Any]) -> Any:
        return seq[self.rng.randrange(len(seq))]

    def random(self) -> float:
        return self.rng.random()


@dataclass(eq=False)
class Seq:
    req: Request
    state: str = "waiting"  # waiting | running | loading
    load_target: int = 0


@dataclass
class Figures:
    ops: int = 0
    setups: int = 0
    divergences: int = 0
    invariant_violations: int = 0
    bad_inputs: int = 0
    bad_input_failures: int = 0
    bad_inputs_unread: int = 0
    reference_errors: int = 0
    known_bug_avoided: int = 0
    allocations: int = 0
    none_allocations: int = 0
    hit_tokens: int = 0
    events: int = 0
    preemptions: int = 0
    evictions: int = 0
    resets: int = 0
    reports: list[str] = field(default_factory=list)

    def merge(self, o: Figures) -> None:
        for f in dataclasses.fields(self):
            if f.name == "reports":
                self.reports.extend(o.reports)
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(o, f.name))

    def summary(self) -> str:
        return (
            f"ops={self.ops} setups={self.setups} divergences={self.divergences} "
            f"invariant_violations={self.invariant_violations} bad_inputs={self.bad_inputs} "
            f"bad_input_failures={self.bad_input_failures} bad_inputs_unread={self.bad_inputs_unread} reference_errors={self.reference_errors} "
            f"known_bug_avoided={self.known_bug_avoided} allocations={self.allocations} "
            f"none={self.none_allocations} hit_tokens={self.hit_tokens} events={self.events} "
            f"preemptions={self.preemptions} evictions={self.evictions} resets={self.resets}"
        )


# ---------------------------------------------------------------------------
# The driver


PREFIXES = (
    (),
    tuple(range(11, 31)),
    tuple(range(11, 19)) + tuple(range(40, 56)),
    tuple(range(60, 84)),
    tuple(range(11, 31)) + tuple(range(90, 110)),
)


class Driver:
    """One setup: vLLM's manager (reference) and hybridcache's, same requests."""

    def __init__(self, setup: Setup, allow_known_bugs: bool = False, figures: Figures | None = None):
        self.s = setup
        self.ref = build_vllm(setup)
        self.hc = build_hybridcache(setup)
        self.other = build_hybridcache(setup)  # source of foreign KVCacheBlocks
        self.allow_known_bugs = allow_known_bugs
        self.f = figures if figures is not None else Figures()
        self.seqs: list[Seq] = []
        self.finished_ids: list[str] = []
        self.ghosts: set[str] = set()  # ids given to get_num_common_prefix_blocks only
        self.next_id = 0
        self.log: list[str] = []
        self.f.setups += 1

    # -- helpers --------------------------------------------------------------

    def note(self, text: str) -> None:
        self.log.append(text)
        if len(self.log) > 40:
            del self.log[:10]

    def both(self, op: str, fn: Callable[[Any], Any], norm: Callable[[Any], Any] = lambda x: x) -> tuple[Any, Any]:
        """Applies `fn` to vLLM then hybridcache and compares the normalized results."""
        try:
            a = fn(self.ref)
        except Exception as e:  # the reference failed: the input was not legal after all
            raise ReferenceError_(f"vLLM raised on {op}: {type(e).__name__}: {e}") from e
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

    def new_request(self, c: Any) -> Request:
        prefix = list(c.choice(PREFIXES))
        tail = [200 + c.randint(0, 4) for _ in range(c.randint(0, 40))]
        tokens = (prefix + tail)[: self.s.max_model_len - 24] or [1]
        if self.finished_ids and c.chance(0.2):
            rid = self.finished_ids.pop(c.randint(0, len(self.finished_ids) - 1))
        else:
            rid = f"r{self.next_id}"
            self.next_id += 1
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
        self.both("usage", lambda m: round(float(m.usage), 9))
        self.both("pool_state", pool_state)
        ids = self.rids() + sorted(self.ghosts)
        self.both("block_tables", lambda m: tuple(tuple(map(tuple, m.get_block_ids(r))) for r in ids))

    # -- operations (each legal for vLLM) ---------------------------------------

    def op_arrive(self, c: Any) -> None:
        if len(self.seqs) >= 10:
            return
        r = self.new_request(c)
        self.seqs.append(Seq(r))
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
        """vLLM 0.23.0 bug: external-token blocks of an earlier group may pop a
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
            # vLLM 0.23.0 bug: Mamba align does not count the blocks taken for
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

    def snapshot(self) -> Any:
        n = self.hc._native
        nb = self.s.num_blocks
        rids = self.rids() + sorted(self.ghosts) + ["nobody"]
        return (
            tuple(n.free_queue()),
            tuple(n.ref_cnt(b) for b in range(nb)),
            tuple(n.block_hash(b) for b in range(nb)),
            tuple(tuple(map(tuple, n.get_block_ids(r))) for r in rids),
            tuple(n.num_known_hashes(r) for r in rids),
            tuple(n.align_state(r, g) for r in rids for g in range(len(self.s.groups))),
            n.num_requests,
            n.num_free_blocks,
        )

    def _bad_cases(self, c: Any) -> list[tuple[str, Callable[[], Any]]]:
        hc, s = self.hc, self.s
        q = self.pick(c)
        running = self.pick(c, "running")
        r = q.req if q is not None else Request("solo", list(range(9)), s.hash_block_size)
        fresh = Request(f"fresh{c.randint(0, 9)}", list(range(c.randint(1, 30))), s.hash_block_size)
        ngroups = len(s.groups)
        from hybridcache import KVCacheBlocks

        def clone(req: Request, **changes: Any) -> Request:
            x = Request(req.request_id, req.all_token_ids[: req.num_prompt_tokens], s.hash_block_size)
            x._all_token_ids = list(req.all_token_ids)
            x.block_hashes = list(req.block_hashes)
            x.num_computed_tokens = req.num_computed_tokens
            for k, v in changes.items():
                setattr(x, k, v)
            return x

        big = c.choice((2**63, 2**64, 10**30))
        neg = -c.randint(1, 2**40)
        cases: list[tuple[str, Callable[[], Any]]] = [
            ("negative num_new_tokens", lambda: hc.allocate_slots(r, neg)),
            ("zero new tokens, no external", lambda: hc.allocate_slots(r, 0)),
            ("negative lookahead", lambda: hc.allocate_slots(r, 1, num_lookahead_tokens=-1)),
            ("negative external", lambda: hc.allocate_slots(fresh, 1, num_external_computed_tokens=neg)),
            ("negative reserved", lambda: hc.allocate_slots(r, 1, reserved_blocks=-2)),
            ("negative encoder tokens", lambda: hc.allocate_slots(r, 1, num_encoder_tokens=-3)),
            ("huge num_new_tokens", lambda: hc.allocate_slots(r, big)),
            ("huge lookahead", lambda: hc.allocate_slots(r, 1, num_lookahead_tokens=big)),
            ("float count", lambda: hc.allocate_slots(r, 2.0)),
            ("str count", lambda: hc.allocate_slots(r, "3")),
            ("None count", lambda: hc.allocate_slots(r, None)),
            ("negative num_computed_tokens", lambda: hc.allocate_slots(clone(r, num_computed_tokens=-1), 1)),
            ("out-of-range evict id", lambda: hc.evict_blocks([1, s.num_blocks + c.randint(0, 5)])),
            ("negative evict id", lambda: hc.evict_blocks([neg])),
            ("huge evict id", lambda: hc.evict_blocks([big])),
            ("str evict id", lambda: hc.evict_blocks(["1"])),
            ("negative remove_skipped total", lambda: hc.remove_skipped_blocks(r.request_id, neg)),
            ("negative cache_blocks count", lambda: hc.cache_blocks(r, neg)),
            ("non-str request id", lambda: hc.allocate_slots(clone(r, request_id=7), 1)),
            ("new_computed_blocks of wrong type", lambda: hc.allocate_slots(fresh, 1, 0, ([1],) * ngroups)),
            ("new_computed_blocks with wrong group count", lambda: hc.allocate_slots(fresh, 1, 0, KVCacheBlocks(([1],) * (ngroups + 1), hc))),
            ("new_computed_blocks id out of range", lambda: hc.allocate_slots(fresh, 1, 0, KVCacheBlocks(([s.num_blocks + 3],) + ([],) * (ngroups - 1), hc))),
            ("new_computed_blocks negative id", lambda: hc.allocate_slots(fresh, 1, 0, KVCacheBlocks(([-5],) + ([],) * (ngroups - 1), hc))),
            ("foreign KVCacheBlocks", lambda: hc.allocate_slots(fresh, 1, 0, KVCacheBlocks(([1],) + ([],) * (ngroups - 1), self.other))),
        ]
        if s.caching:  # without prefix caching hashes and lookups are not read
            # Hashes are read only where a full block is cached or looked up.
            fresh = Request(fresh.request_id, list(range(2 * s.hash_block_size + c.randint(0, 20))), s.hash_block_size)
            cases += [
                ("str block hashes", lambda: hc.allocate_slots(clone(fresh, block_hashes=["x"] * (fresh.num_tokens // s.hash_block_size + 1)), fresh.num_tokens)),
                ("int block hashes", lambda: hc.get_computed_blocks(clone(fresh, block_hashes=[1, 2, 3]))),
                ("list block hashes", lambda: hc.allocate_slots(clone(fresh, block_hashes=[[0, 1]] * 4), fresh.num_tokens)),
                ("get_computed_blocks with no tokens", lambda: hc.get_computed_blocks(clone(fresh, _all_token_ids=[], block_hashes=[]))),
                ("cache_blocks of unknown request", lambda: hc.cache_blocks(Request("unknown-req", list(range(16)), s.hash_block_size), 8)),
            ]
        if running is not None and s.caching:
            run_req, own = running.req, hc.get_blocks(running.req.request_id)
            if any(own.get_block_ids()):
                cases.append(("new_computed_blocks for a running request", lambda: hc.allocate_slots(run_req, 1, 0, own)))
        if s.caching and fresh.num_tokens >= 2 * s.hash_block_size:
            short = clone(fresh, block_hashes=fresh.block_hashes[:1])
            cases.append(("caching beyond known hashes", lambda: hc.allocate_slots(short, fresh.num_tokens)))
        if running is not None and s.caching:
            too_far = len(hc.get_block_ids(running.req.request_id)[0]) * s.groups[0].block_size + s.groups[0].block_size
            cases.append(("cache_blocks beyond allocated blocks", lambda: hc.cache_blocks(running.req, too_far)))
        return cases

    def op_bad_input(self, c: Any) -> None:
        cases = self._bad_cases(c)
        name, call = c.choice(cases)
        before = self.snapshot()
        self.f.bad_inputs += 1
        try:
            result = call()
        except ACCEPTED_ERRORS as e:
            if type(e).__name__ == "PanicException":
                raise BadInputFailure(f"bad input {name!r}: PanicException {e}") from e
            err: Exception | None = e
        except BaseException as e:  # PanicException derives from BaseException
            raise BadInputFailure(f"bad input {name!r} raised {type(e).__name__}: {e}") from e
        else:
            err = None
        after = self.snapshot()
        if err is None and result is None and after == before and "hashes" in name:
            # Hashes are read only where caching may need them: a call that
            # fails for lack of blocks first never reads them (nor does vLLM).
            self.f.bad_inputs_unread += 1
            return
        if err is None:
            raise BadInputFailure(f"bad input {name!r} was accepted (returned {result!r})")
        if after != before:
            raise BadInputFailure(f"bad input {name!r} ({type(err).__name__}: {err}) changed the state")
        self.note(f"bad input {name}: {type(err).__name__}")


# ---------------------------------------------------------------------------
# Runner


def run_fuzz(
    ops: int,
    seed: int,
    mixes: Sequence[str] = MIXES,
    caching: Sequence[bool] = (True, False),
    ops_per_setup: int = 3000,
    allow_known_bugs: bool = False,
    progress: Callable[[Figures, float], None] | None = None,
    progress_every: int = 20000,
    max_reports: int = 20,
) -> Figures:
    """Runs `ops` operations over a rotation of random setups; never raises
    for findings: they are counted (and the first `max_reports` described)."""
    rng = random.Random(seed)
    c = RngChooser(rng)
    f = Figures()
    start = time.time()
    next_progress = progress_every
    combos = [(m, cb) for m in mixes for cb in caching]
    k = 0
    while f.ops < ops:
        mix, cb = combos[k % len(combos)]
        k += 1
        setup = random_setup(rng, mix, cb)
        d = Driver(setup, allow_known_bugs, f)
        budget = min(ops_per_setup, ops - f.ops)
        end = f.ops + budget
        try:
            while f.ops < end:
                d.step_random(c)
                if progress is not None and f.ops >= next_progress:
                    progress(f, time.time() - start)
                    next_progress += progress_every
            d.drain()
        except (Divergence, InvariantViolation, BadInputFailure, ReferenceError_) as e:
            kind = {
                Divergence: "divergences",
                InvariantViolation: "invariant_violations",
                BadInputFailure: "bad_input_failures",
                ReferenceError_: "reference_errors",
            }[type(e)]
            setattr(f, kind, getattr(f, kind) + 1)
            if len(f.reports) < max_reports:
                f.reports.append(
                    f"[{kind}] seed={seed} setup #{f.setups}: {setup.describe()}\n  {e}\n  last ops:\n    "
                    + "\n    ".join(d.log[-15:])
                )
        except Exception as e:  # a driver bug: report, go on with a new setup
            f.reports.append(f"[driver error] {setup.describe()}: {traceback.format_exc()}")
            f.reference_errors += 1
            if len(f.reports) > max_reports * 2:
                raise
    return f


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hybridcache.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mix", default=",".join(MIXES), help=f"comma-separated subset of {','.join(MIXES)}")
    p.add_argument("--caching", choices=("on", "off", "both"), default="both")
    p.add_argument("--ops-per-setup", type=int, default=3000)
    p.add_argument("--progress-every", type=int, default=20000)
    p.add_argument("--allow-known-bugs", action="store_true",
                   help="do not steer around known vLLM 0.23.0 bugs that hybridcache reproduces")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    mixes = [m.strip() for m in a.mix.split(",") if m.strip()]
    for m in mixes:
        if m not in MIXES:
            p.error(f"unknown mix {m!r}; choose from {', '.join(MIXES)}")
    caching = {"on": (True,), "off": (False,), "both": (True, False)}[a.caching]

    def progress(f: Figures, secs: float) -> None:
        print(f"[{secs:7.1f}s] {f.ops} ops ({f.ops / max(secs, 1e-9):.0f}/s) divergences={f.divergences} "
              f"invariant_violations={f.invariant_violations} bad_inputs={f.bad_inputs} "
              f"bad_input_failures={f.bad_input_failures} reference_errors={f.reference_errors}", flush=True)

    t0 = time.time()
    f = run_fuzz(a.ops, a.seed, mixes, caching, a.ops_per_setup, a.allow_known_bugs, progress, a.progress_every)
    secs = time.time() - t0
    for r in f.reports:
        print(r, flush=True)
    print(f"FINAL seed={a.seed} mixes={','.join(mixes)} caching={a.caching} seconds={secs:.1f} {f.summary()}", flush=True)
    return 0 if f.divergences == 0 and f.invariant_violations == 0 and f.bad_input_failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
