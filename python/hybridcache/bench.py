"""`hybridcache bench`: scheduler-step latency of hybridcache's manager next to
vLLM 0.23.0's, on a built-in, seeded serving trace.

How it measures
---------------
1. *Record.* A scheduler simulation (vLLM 0.23.0's ``Scheduler.schedule``
   loop, without the model) drives hybridcache's manager over a seeded
   workload: arrivals with shared prefixes, chunked prefill (Mamba-align
   block-aligned chunks where the model has align-mode Mamba groups), decode
   with 0..16 draft tokens and random acceptance, preemption (recompute) when
   the pool runs dry, and aborts. Every manager call is written down: the
   operation, its arguments, the request's state at that moment (tokens,
   computed tokens, preemptions) and the result.
2. *Replay.* The recording is replayed against a fresh manager of each
   implementation, in the same process, alternating implementations every few
   steps (ABBA order) so machine noise hits both. Only the manager calls are
   timed (``perf_counter_ns`` around each call, or ``thread_time_ns`` with
   ``--clock thread_time``; the timer's own median cost is subtracted);
   setting request state and checking results happen outside the timer. As
   the scheduler does, a running request's allocation is read with
   ``get_block_ids(allow_none=True)`` and a newly admitted one's table with
   ``get_blocks(id).get_block_ids()``, inside the timer. The garbage
   collector is paused while timing and run between step chunks (that spares
   vLLM, which allocates far more objects).
3. *Verify.* Every result of every implementation (block tables, hit
   lengths, common-prefix counts, stats, usage) and the free-block count
   after every step must equal the recording; otherwise the configuration is
   reported as diverged.

This module imports vLLM (and torch) only to compare against it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .replay import norm_stats, norm_usage
from .request import Request

SUPPORTED_VLLM_VERSION = "0.23.0"
CONFIGS = ("full", "full+swa", "full+3xmamba-align")
CONFIG_TITLES = {
    "full": "full attention",
    "full+swa": "full attention + sliding window (128 tokens)",
    "full+3xmamba-align": "full attention + 3 x Mamba (mamba_cache_mode='align', 16 speculative blocks)",
}
RUNNING = (64, 256, 1024)
SCALE_BLOCKS = 1_000_000


# --------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------


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

    def __post_init__(self) -> None:
        if self.config not in CONFIGS:
            raise ValueError(f"config must be one of {', '.join(CONFIGS)}, got {self.config!r}")
        if self.running <= 0 or self.steps <= 0:
            raise ValueError("running and steps must be positive")

    @property
    def max_num_batched_tokens(self) -> int:
        return max(2048, min(16384, 16 * self.running))

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

    def manager_kwargs(self) -> dict[str, Any]:
        return dict(
            max_model_len=self.max_model_len,
            scheduler_block_size=self.block_size,
            hash_block_size=self.block_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_caching=True,
            use_eagle=False,
            log_stats=True,
            enable_kv_cache_events=False,
        )


def hybridcache_kv_cache_config(w: Workload, num_blocks: int | None = None) -> Any:
    """hybridcache's own config objects for `w` (no vLLM, no torch)."""
    from . import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec, SlidingWindowSpec

    bs = w.block_size
    groups = [KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=bs))]
    if w.config == "full+swa":
        groups.append(KVCacheGroupSpec(["swa"], SlidingWindowSpec(block_size=bs, sliding_window=w.sliding_window)))
    elif w.mamba_align:
        spec = MambaSpec(block_size=bs, shapes=((1, 1),), dtypes=("float32",), mamba_cache_mode="align",
                         num_speculative_blocks=w.num_speculative_blocks)
        groups += [KVCacheGroupSpec([f"mamba{i}"], spec) for i in range(w.num_mamba_groups)]
    return KVCacheConfig(num_blocks=num_blocks or w.num_blocks, kv_cache_groups=groups)


def vllm_kv_cache_config(w: Workload, num_blocks: int | None = None) -> Any:
    """The same layout as vLLM's own config objects (imports vLLM and torch)."""
    import torch
    from vllm.v1 import kv_cache_interface as iface

    bs = w.block_size
    attn: dict[str, Any] = dict(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32)
    groups = [iface.KVCacheGroupSpec(["attn"], iface.FullAttentionSpec(**attn))]
    if w.config == "full+swa":
        groups.append(iface.KVCacheGroupSpec(["swa"], iface.SlidingWindowSpec(**attn, sliding_window=w.sliding_window)))
    elif w.mamba_align:
        spec = iface.MambaSpec(block_size=bs, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align",
                               num_speculative_blocks=w.num_speculative_blocks)
        groups += [iface.KVCacheGroupSpec([f"mamba{i}"], spec) for i in range(w.num_mamba_groups)]
    return iface.KVCacheConfig(num_blocks=num_blocks or w.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def make_hybridcache_manager(w: Workload) -> Any:
    from .manager import KVCacheManager

    return KVCacheManager(hybridcache_kv_cache_config(w), **w.manager_kwargs())


def make_vllm_manager(w: Workload) -> Any:
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    return KVCacheManager(vllm_kv_cache_config(w), **w.manager_kwargs())


def load_vllm() -> tuple[str | None, str]:
    """(version, note): version is set when vLLM 0.23.0's manager imports.

    vLLM's logger binds to stdout at import; it is pointed at stderr so the
    output of ``--json`` stays machine-readable."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        with contextlib.redirect_stdout(sys.stderr):
            import vllm
            import vllm.v1.core.kv_cache_manager  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return None, f"vLLM not installed ({type(e).__name__}: {e})".splitlines()[0]
    version = getattr(vllm, "__version__", "?")
    if version != SUPPORTED_VLLM_VERSION:
        return None, f"vLLM {version} is installed, not {SUPPORTED_VLLM_VERSION}"
    return version, f"vLLM {version}"


# --------------------------------------------------------------------------
# The recording
# --------------------------------------------------------------------------

# Operation codes; an op is (code, request index, a, b, state, expected).
NEW_STEP, GET_COMPUTED, ALLOC_NEW, ALLOC_RUN, GET_BLOCKS, FREE, COMMON_PREFIX, TAKE_NEW_IDS, STATS = range(9)
# Timing buckets.
KINDS = (
    "decode_allocate_slots",
    "prefill_allocate_slots",
    "admit_allocate_slots",
    "get_computed_blocks",
    "get_blocks",
    "free",
    "other",
)


@dataclass
class Recording:
    workload: Workload
    steps: list[list[tuple]]
    free_after_step: list[int]
    running_after_step: list[int]
    # Per request: id, prompt length, full token list and full block hashes.
    request_ids: list[str]
    num_prompt_tokens: list[int]
    token_ids: list[list[int]]
    block_hashes: list[list[bytes]]
    counters: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def num_ops(self) -> int:
        return sum(len(s) for s in self.steps)


NO_BLOCKS = "no blocks"  # allocate_slots returned None


def _ids(blocks: Any) -> Any:
    return NO_BLOCKS if blocks is None else blocks.get_block_ids()


def _running_ids(blocks: Any) -> Any:
    """What the scheduler reads of a running request's allocation
    (`_make_cached_request_data`): None when no group got a new block."""
    return NO_BLOCKS if blocks is None else blocks.get_block_ids(allow_none=True)


class _Recorder:
    """vLLM 0.23.0's scheduling loop (FCFS, recompute preemption, no
    connector, no encoder) over one manager, writing every call down."""

    def __init__(self, w: Workload, manager: Any):
        self.w = w
        self.m = manager
        self.rng = random.Random(w.seed)
        self.prefixes = [self._tokens(self._prefix_len()) for _ in range(w.num_shared_prefixes)]
        self.reqs: list[Request] = []
        self.max_tokens: list[int] = []
        self.drafts: list[int] = []
        self.waiting: list[int] = []
        self.running: list[int] = []
        self.ops: list[tuple] = []
        self.counters = dict(finished=0, aborted=0, preemptions=0, admitted=0, hit_tokens=0,
                             failed_admissions=0, decode_allocs=0)

    # ---- workload ----------------------------------------------------------

    def _tokens(self, n: int) -> list[int]:
        r = self.rng.getrandbits
        return [r(15) for _ in range(n)]

    def _prefix_len(self) -> int:
        n = self.rng.randint(self.w.min_shared_prefix_len, self.w.max_shared_prefix_len)
        return n - n % self.w.block_size if self.rng.random() < 0.5 else n

    def _arrive(self) -> None:
        w, rng = self.w, self.rng
        while len(self.waiting) < max(4, w.running // 8):
            n = rng.randint(w.min_prompt_len, w.max_prompt_len)
            prompt: list[int] = []
            if rng.random() < w.shared_prefix_prob:
                prompt = list(rng.choice(self.prefixes)[:n])
            prompt += self._tokens(n - len(prompt))
            idx = len(self.reqs)
            self.reqs.append(Request(f"req-{idx}", prompt, w.block_size))
            self.max_tokens.append(rng.randint(w.min_output_len, w.max_output_len))
            self.drafts.append(0)
            self.waiting.append(idx)

    def _next_drafts(self) -> int:
        if self.rng.random() < self.w.no_draft_prob:
            return 0
        return self.rng.randint(1, self.w.max_drafts)

    # ---- recorded calls ------------------------------------------------------

    def _state(self, idx: int) -> tuple[int, int, int]:
        r = self.reqs[idx]
        return (r.num_tokens, r.num_computed_tokens, r.num_preemptions)

    def _rec(self, code: int, idx: int, a: Any, b: Any, state: Any, expected: Any) -> None:
        self.ops.append((code, idx, a, b, state, expected))

    def _free(self, idx: int) -> None:
        self.m.free(self.reqs[idx])
        self._rec(FREE, idx, None, None, self._state(idx), None)

    def _alloc_running(self, idx: int, n: int) -> Any:
        req = self.reqs[idx]
        state = self._state(idx)
        decode = req.num_computed_tokens == req.num_tokens - 1
        blocks = self.m.allocate_slots(req, n, num_lookahead_tokens=0)
        self._rec(ALLOC_RUN, idx, n, decode, state, _running_ids(blocks))
        self.counters["decode_allocs"] += decode
        return blocks

    def _mamba_split(self, idx: int, n: int, num_new_local_computed: int = 0) -> int:
        """vLLM 0.23.0's `Scheduler._mamba_block_aligned_split` (no EAGLE)."""
        req = self.reqs[idx]
        computed = req.num_computed_tokens + num_new_local_computed
        if computed < max(req.num_prompt_tokens, req.num_tokens - 1):
            bs = self.w.block_size
            last_cache_position = req.num_tokens - req.num_tokens % bs
            after = computed + n
            if after < last_cache_position:
                n = n // bs * bs
            elif computed < last_cache_position < after:
                n = last_cache_position - computed
        return n

    # ---- one scheduler step ----------------------------------------------------

    def step(self) -> None:
        w = self.w
        self._arrive()
        self.m.new_step_starts()
        self._rec(NEW_STEP, -1, None, None, None, None)
        self._aborts()
        budget = w.max_num_batched_tokens
        scheduled: dict[int, int] = {}
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            idx = self.running[i]
            req = self.reqs[idx]
            n = req.num_tokens + self.drafts[idx] - req.num_computed_tokens
            n = min(n, budget, w.max_model_len - 1 - req.num_computed_tokens)
            if w.mamba_align:
                n = self._mamba_split(idx, n)
            if n <= 0:
                i += 1
                continue
            while True:
                blocks = self._alloc_running(idx, n)
                if blocks is not None:
                    break
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim == idx:
                    break
            if blocks is None:
                break
            scheduled[idx] = n
            budget -= n
            i += 1
        if not preempted:
            budget = self._admit(scheduled, budget)
        if self.running:
            rid = self.reqs[self.running[0]].request_id
            self._rec(COMMON_PREFIX, self.running[0], None, None, None,
                      list(self.m.get_num_common_prefix_blocks(rid)))
        if w.mamba_align:  # vLLM's needs_kv_cache_zeroing
            self._rec(TAKE_NEW_IDS, -1, None, None, None, list(self.m.take_new_block_ids()))
        self._apply_outputs(scheduled)
        stats = (norm_stats(self.m.make_prefix_cache_stats()), norm_usage(self.m.usage))
        self._rec(STATS, -1, None, None, None, stats)

    def _aborts(self) -> None:
        rng, w = self.rng, self.w
        k = int(w.abort_rate * len(self.running) + rng.random())
        for _ in range(min(k, len(self.running))):
            idx = self.running.pop(rng.randrange(len(self.running)))
            self._free(idx)
            self.counters["aborted"] += 1
        if self.waiting and rng.random() < w.abort_rate * 10:
            idx = self.waiting.pop(rng.randrange(len(self.waiting)))
            self._free(idx)  # holds nothing; vLLM frees it all the same
            self.counters["aborted"] += 1

    def _preempt(self, idx: int) -> None:
        self._free(idx)
        req = self.reqs[idx]
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.drafts[idx] = 0
        self.waiting.insert(0, idx)
        self.counters["preemptions"] += 1

    def _admit(self, scheduled: dict[int, int], budget: int) -> int:
        w = self.w
        while self.waiting and budget > 0 and len(self.running) < w.running:
            idx = self.waiting[0]
            req = self.reqs[idx]
            state = self._state(idx)
            computed, hit = self.m.get_computed_blocks(req)
            self._rec(GET_COMPUTED, idx, None, None, state, (_ids(computed), hit))
            n = min(req.num_tokens - hit, budget)
            if w.mamba_align:
                n = self._mamba_split(idx, n, hit)
                if n == 0:
                    break
            blocks = self.m.allocate_slots(req, n, num_new_computed_tokens=hit, new_computed_blocks=computed,
                                           num_lookahead_tokens=0)
            self._rec(ALLOC_NEW, idx, n, hit, state, _ids(blocks))
            if blocks is None:
                self.counters["failed_admissions"] += 1
                break
            self._rec(GET_BLOCKS, idx, None, None, None, self.m.get_blocks(req.request_id).get_block_ids())
            self.waiting.pop(0)
            self.running.append(idx)
            req.num_computed_tokens = hit
            scheduled[idx] = n
            budget -= n
            self.counters["admitted"] += 1
            self.counters["hit_tokens"] += hit
        return budget

    def _apply_outputs(self, scheduled: dict[int, int]) -> None:
        w, rng = self.w, self.rng
        for idx in list(self.running):
            n = scheduled.get(idx)
            if n is None:
                continue
            req = self.reqs[idx]
            req.num_computed_tokens += n
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk: nothing sampled
            num_drafts = req.num_computed_tokens - req.num_tokens
            accepted = rng.randint(0, num_drafts)
            req.num_computed_tokens -= num_drafts - accepted
            room = min(
                self.max_tokens[idx] - req.num_output_tokens,
                w.max_model_len - 1 - w.max_drafts - req.num_tokens,
            )
            sampled = min(accepted + 1, room)
            req.append_output_token_ids(self._tokens(sampled))
            if sampled >= room:
                self.running.remove(idx)
                self._free(idx)
                self.counters["finished"] += 1
            else:
                self.drafts[idx] = self._next_drafts()


def record(w: Workload, on_step: Callable[[], None] | None = None) -> Recording:
    """Runs the scheduler simulation once against hybridcache and records it."""
    start = time.perf_counter()
    rec = _Recorder(w, make_hybridcache_manager(w))
    steps: list[list[tuple]] = []
    free_after: list[int] = []
    running_after: list[int] = []
    for _ in range(w.warmup_steps + w.steps):
        rec.ops = []
        rec.step()
        steps.append(rec.ops)
        free_after.append(rec.m.block_pool.get_num_free_blocks())
        running_after.append(len(rec.running))
        if on_step:
            on_step()
    return Recording(
        workload=w,
        steps=steps,
        free_after_step=free_after,
        running_after_step=running_after,
        request_ids=[r.request_id for r in rec.reqs],
        num_prompt_tokens=[r.num_prompt_tokens for r in rec.reqs],
        token_ids=[r.all_token_ids for r in rec.reqs],
        block_hashes=[r.block_hashes for r in rec.reqs],
        counters=dict(rec.counters),
        seconds=time.perf_counter() - start,
    )


# --------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------


class _ReplayRequest:
    """What a manager reads of a request; state is set from the recording
    before each call. Tokens and block hashes only ever grow."""

    __slots__ = ("request_id", "num_tokens", "num_computed_tokens", "num_preemptions", "num_prompt_tokens",
                 "block_hashes", "_all_hashes", "all_token_ids", "prompt_token_ids", "lora_request",
                 "cache_salt", "skip_reading_prefix_cache", "mm_features", "prompt_embeds", "spec_token_ids")

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


class BenchDivergence(AssertionError):
    pass


@dataclass
class _Impl:
    name: str
    manager: Any
    reqs: list[_ReplayRequest]
    block_size: int
    computed: dict[int, Any] = field(default_factory=dict)
    step_ns: list[int] = field(default_factory=list)
    kind_ns: dict[str, list[int]] = field(default_factory=lambda: {k: [] for k in KINDS})
    # Calls made before the first measured step, per kind.
    kind_warmup: dict[str, int] = field(default_factory=dict)
    timer_overhead_ns: int = 0


def _new_impl(name: str, factory: Callable[[Workload], Any], rec: Recording) -> _Impl:
    reqs = [
        _ReplayRequest(rid, p, t, h)
        for rid, p, t, h in zip(rec.request_ids, rec.num_prompt_tokens, rec.token_ids, rec.block_hashes)
    ]
    return _Impl(name, factory(rec.workload), reqs, rec.workload.block_size)


def _diverged(impl: _Impl, step: int, op: tuple, got: Any) -> BenchDivergence:
    names = ["new_step_starts", "get_computed_blocks", "allocate_slots (admission)", "allocate_slots (running)",
             "get_blocks", "free", "get_num_common_prefix_blocks", "take_new_block_ids", "stats/usage"]
    rid = impl.reqs[op[1]].request_id if op[1] >= 0 else "-"
    return BenchDivergence(
        f"{impl.name} differs from the recording at step {step}, {names[op[0]]}({rid}, {op[2]!r}, {op[3]!r}):\n"
        f"  expected {op[5]!r}\n  got      {got!r}"
    )


CLOCKS: dict[str, Callable[[], int]] = {"perf_counter": time.perf_counter_ns, "thread_time": time.thread_time_ns}


def timer_overhead_ns(clock: Callable[[], int], samples: int = 20_000) -> int:
    """Median of an empty timed interval: subtracted from every timed call."""
    deltas = []
    for _ in range(samples):
        t0 = clock()
        deltas.append(clock() - t0)
    deltas.sort()
    return deltas[len(deltas) // 2]


def _replay_steps(
    impl: _Impl, rec: Recording, first: int, last: int, clock: Callable[[], int], overhead: int
) -> None:
    """Replays steps [first, last) on `impl`, timing each manager call."""
    m = impl.manager
    reqs = impl.reqs
    bs = impl.block_size
    computed = impl.computed
    kind = impl.kind_ns
    decode_ns, prefill_ns = kind["decode_allocate_slots"], kind["prefill_allocate_slots"]
    admit_ns = kind["admit_allocate_slots"]
    gcb_ns, blocks_ns, free_ns, other_ns = kind["get_computed_blocks"], kind["get_blocks"], kind["free"], kind["other"]
    warmup = rec.workload.warmup_steps
    for s in range(first, last):
        if s == warmup:
            impl.kind_warmup = {k: len(v) for k, v in kind.items()}
        total = 0
        for op in rec.steps[s]:
            code, idx, a, b, state, expected = op
            if state is not None:
                req = reqs[idx]
                num_tokens, req.num_computed_tokens, req.num_preemptions = state
                req.num_tokens = num_tokens
                hashes = req.block_hashes
                need = num_tokens // bs
                if len(hashes) < need:
                    hashes.extend(req._all_hashes[len(hashes):need])
            if code == ALLOC_RUN:
                t0 = clock()
                blocks = m.allocate_slots(req, a, num_lookahead_tokens=0)
                got = NO_BLOCKS if blocks is None else blocks.get_block_ids(allow_none=True)
                dt = clock() - t0
                bucket = decode_ns if b else prefill_ns
            elif code == FREE:
                t0 = clock()
                m.free(req)
                dt = clock() - t0
                bucket = free_ns
                computed.pop(idx, None)
                got = None
            elif code == GET_COMPUTED:
                t0 = clock()
                blocks, hit = m.get_computed_blocks(req)
                dt = clock() - t0
                bucket = gcb_ns
                computed[idx] = blocks
                got = (blocks.get_block_ids(), hit)
            elif code == ALLOC_NEW:
                hit_blocks = computed.pop(idx)
                t0 = clock()
                blocks = m.allocate_slots(req, a, num_new_computed_tokens=b, new_computed_blocks=hit_blocks,
                                          num_lookahead_tokens=0)
                dt = clock() - t0
                got = NO_BLOCKS if blocks is None else blocks.get_block_ids()
                bucket = admit_ns
            elif code == GET_BLOCKS:
                rid = reqs[idx].request_id
                t0 = clock()
                got = m.get_blocks(rid).get_block_ids()
                dt = clock() - t0
                bucket = blocks_ns
            elif code == NEW_STEP:
                t0 = clock()
                m.new_step_starts()
                dt = clock() - t0
                bucket = other_ns
                got = None
            elif code == COMMON_PREFIX:
                rid = reqs[idx].request_id
                t0 = clock()
                got = m.get_num_common_prefix_blocks(rid)
                dt = clock() - t0
                bucket = other_ns
                got = list(got)
            elif code == TAKE_NEW_IDS:
                t0 = clock()
                got = m.take_new_block_ids()
                dt = clock() - t0
                bucket = other_ns
                got = list(got)
            else:  # STATS: what the scheduler's make_stats reads
                t0 = clock()
                stats = m.make_prefix_cache_stats()
                usage = m.usage
                dt = clock() - t0
                bucket = other_ns
                got = (norm_stats(stats), norm_usage(usage))
            dt -= overhead
            if dt < 0:
                dt = 0
            bucket.append(dt)
            total += dt
            if got != expected and not _same_ids(got, expected):
                raise _diverged(impl, s, op, got)
        impl.step_ns.append(total)
        free = m.block_pool.get_num_free_blocks()
        if free != rec.free_after_step[s]:
            raise BenchDivergence(
                f"{impl.name}: {free} free blocks after step {s}, the recording has {rec.free_after_step[s]}"
            )


def _same_ids(a: Any, b: Any) -> bool:
    """Block-id tables equal up to list/tuple spelling."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_ids(x, y) for x, y in zip(a, b))
    return a == b


def replay_timed(
    rec: Recording,
    factories: Sequence[tuple[str, Callable[[Workload], Any]]],
    chunk_steps: int = 8,
    clock: str = "perf_counter",
    on_chunk: Callable[[int], None] | None = None,
) -> list[_Impl]:
    """Replays `rec` against every implementation, alternating chunks of
    steps (ABBA order), each call timed; raises BenchDivergence."""
    impls = [_new_impl(name, factory, rec) for name, factory in factories]
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
            for impl in order:
                gc.disable()
                try:
                    _replay_steps(impl, rec, first, last, timer, overhead)
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


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _summary_us(values_ns: Sequence[int]) -> dict[str, float | int | None]:
    v = sorted(values_ns)
    if not v:
        return {"count": 0, "mean_us": None, "p50_us": None, "p90_us": None}
    return {
        "count": len(v),
        "mean_us": sum(v) / len(v) / 1e3,
        "p50_us": _quantile(v, 0.5) / 1e3,
        "p90_us": _quantile(v, 0.9) / 1e3,
    }


def _impl_result(impl: _Impl, warmup: int) -> dict[str, Any]:
    steps = impl.step_ns[warmup:]
    calls = {k: _summary_us(v[impl.kind_warmup.get(k, len(v)):]) for k, v in impl.kind_ns.items()}
    return {"step": _summary_us(steps), "calls": calls, "step_us_all": [x / 1e3 for x in impl.step_ns]}


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def run_workload(
    w: Workload, use_vllm: bool, progress: Any = None, chunk_steps: int = 8, clock: str = "perf_counter"
) -> dict[str, Any]:
    """Records `w`, replays it on hybridcache (and vLLM), returns the result."""
    label = f"{w.config} @ {w.running}"
    if progress:
        progress.phase(f"record {label}")
    rec = record(w, on_step=(lambda: progress.advance(1)) if progress else None)
    factories: list[tuple[str, Callable[[Workload], Any]]] = [("hybridcache", make_hybridcache_manager)]
    if use_vllm:
        factories.append(("vllm", make_vllm_manager))
    if progress:
        progress.phase(f"replay {label}")
    result: dict[str, Any] = {
        "config": w.config,
        "running": w.running,
        "num_blocks": w.num_blocks,
        "max_num_batched_tokens": w.max_num_batched_tokens,
        "warmup_steps": w.warmup_steps,
        "steps": w.steps,
        "ops": rec.num_ops,
        "mean_running": sum(rec.running_after_step[w.warmup_steps:]) / max(1, w.steps),
        "trace": rec.counters,
        "record_seconds": rec.seconds,
        "compared": [name for name, _ in factories],
        "verified": None,
    }
    start = time.perf_counter()
    try:
        on_chunk = (lambda n: progress.advance(n / len(factories))) if progress else None
        impls = replay_timed(rec, factories, chunk_steps, clock, on_chunk=on_chunk)
    except BenchDivergence as e:
        result["verified"] = False
        result["divergence"] = str(e)
        result["replay_seconds"] = time.perf_counter() - start
        return result
    result["replay_seconds"] = time.perf_counter() - start
    # Every implementation equals the recording, hence each other.
    result["verified"] = True
    result["timer_overhead_ns"] = impls[0].timer_overhead_ns
    result["impls"] = {impl.name: _impl_result(impl, w.warmup_steps) for impl in impls}
    if use_vllm:
        hc, vl = result["impls"]["hybridcache"], result["impls"]["vllm"]
        result["speedup"] = {
            "step_p50": _ratio(vl["step"]["p50_us"], hc["step"]["p50_us"]),
            "step_p90": _ratio(vl["step"]["p90_us"], hc["step"]["p90_us"]),
            "step_mean": _ratio(vl["step"]["mean_us"], hc["step"]["mean_us"]),
            **{
                k: _ratio(vl["calls"][k]["p50_us"], hc["calls"][k]["p50_us"])
                for k in ("decode_allocate_slots", "get_computed_blocks", "free")
            },
        }
    return result


# --------------------------------------------------------------------------
# Scale figures
# --------------------------------------------------------------------------


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None


def pool_scale(factory: Callable[[Any], Any], config: Any, num_blocks: int) -> dict[str, Any]:
    """Time to build a manager over `num_blocks` blocks and RSS growth per
    block; `config` is a dataclass (vLLM's KVCacheConfig and ours are)."""
    factory(dataclasses.replace(config, num_blocks=16))  # imports and first-use costs out of the way
    gc.collect()
    rss0 = _rss_bytes()
    t0 = time.perf_counter()
    manager = factory(config)
    seconds = time.perf_counter() - t0
    rss1 = _rss_bytes()
    free = manager.block_pool.get_num_free_blocks()
    del manager
    gc.collect()
    per_block = None if rss0 is None or rss1 is None else max(0, rss1 - rss0) / num_blocks
    return {"num_blocks": num_blocks, "build_ms": seconds * 1e3, "bytes_per_block": per_block,
            "free_blocks": free}


def scale_figures(use_vllm: bool, num_blocks: int = SCALE_BLOCKS) -> dict[str, Any]:
    w = Workload(config="full")
    kwargs = w.manager_kwargs()
    out = {
        "hybridcache": pool_scale(
            lambda c: _hc_manager(c, kwargs), hybridcache_kv_cache_config(w, num_blocks), num_blocks
        )
    }
    if use_vllm:
        out["vllm"] = pool_scale(
            lambda c: _vllm_manager(c, kwargs), vllm_kv_cache_config(w, num_blocks), num_blocks
        )
    return out


def _hc_manager(config: Any, kwargs: dict[str, Any]) -> Any:
    from .manager import KVCacheManager

    return KVCacheManager(config, **kwargs)


def _vllm_manager(config: Any, kwargs: dict[str, Any]) -> Any:
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    return KVCacheManager(config, **kwargs)


# --------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------


class Progress:
    """A progress bar on stderr: rich if installed, else tqdm, else plain lines."""

    def __init__(self, total: float, enabled: bool = True):
        self.total = total
        self.done = 0.0
        self.kind = "off"
        self._last_pct = -1
        self._desc = ""
        if not enabled:
            return
        try:
            from rich.console import Console
            from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

            self._rich = RichProgress(
                TextColumn("{task.description:<34}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                TimeElapsedColumn(), console=Console(stderr=True), transient=True,
            )
            self._rich.start()
            self._task = self._rich.add_task("bench", total=total)
            self.kind = "rich"
            return
        except ImportError:
            pass
        try:
            from tqdm import tqdm

            self._tqdm = tqdm(
                total=total, file=sys.stderr, leave=False, bar_format="{desc:<34} {bar} {percentage:3.0f}% {elapsed}"
            )
            self.kind = "tqdm"
            return
        except ImportError:
            pass
        self.kind = "plain"

    def phase(self, desc: str) -> None:
        self._desc = desc
        if self.kind == "rich":
            self._rich.update(self._task, description=desc)
        elif self.kind == "tqdm":
            self._tqdm.set_description_str(desc)
        elif self.kind == "plain":
            print(f"[{100 * self.done / max(self.total, 1):3.0f}%] {desc}", file=sys.stderr, flush=True)

    def advance(self, n: float) -> None:
        self.done += n
        if self.kind == "rich":
            self._rich.advance(self._task, n)
        elif self.kind == "tqdm":
            self._tqdm.update(n)

    def close(self) -> None:
        if self.kind == "rich":
            self._rich.stop()
        elif self.kind == "tqdm":
            self._tqdm.close()
        self.kind = "off"


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def _fmt(v: float | None, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.{digits}f}"


def _fmt_ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}x"


def format_report(report: dict[str, Any]) -> str:
    lines: list[str] = []
    vllm = report.get("vllm")
    header = f"hybridcache {report['hybridcache']} bench"
    header += f" vs vLLM {vllm}" if vllm else f" ({report.get('vllm_note', 'vLLM not installed')}: hybridcache only)"
    header += f", seed {report['seed']}{', --quick' if report['quick'] else ''}, clock {report.get('clock')}"
    load, cpus = report.get("load_average"), report.get("cpu_count")
    if load:
        header += f", load {load[0]:.1f} on {cpus} CPUs"
    lines.append(header)
    if load and cpus and max(load) > cpus:
        lines.append("warning: the machine is busy (load > CPUs); wall-clock figures inflate long steps more "
                     "than short ones. --clock thread_time counts this thread's CPU time only.")
    lines.append(
        "µs in manager calls per scheduler step (p50/p90 over the measured steps) and per call (p50 over them); "
        "x = vLLM / hybridcache. decode allocate_slots includes the scheduler's get_block_ids(allow_none=True) "
        "of its result; "
        "the timer's own cost (median empty interval) is subtracted from every call."
    )
    cols = ["running", "steps", "preempt", "hc p50", "hc p90"]
    if vllm:
        cols += ["vLLM p50", "vLLM p90", "x p50", "x p90"]
    cols += ["decode alloc", "get_computed", "free"]
    by_config: dict[str, list[dict[str, Any]]] = {}
    for r in report["results"]:
        by_config.setdefault(r["config"], []).append(r)
    for config, results in by_config.items():
        lines.append("")
        lines.append(f"{config}: {CONFIG_TITLES.get(config, config)}")
        rows = [cols]
        notes = []
        for r in results:
            row = [str(r["running"]), str(r["steps"]), str(r["trace"]["preemptions"])]
            if "impls" not in r:
                row += ["DIVERGED"] + ["-"] * (len(cols) - 4)
                notes.append(f"  running={r['running']}: {r.get('divergence', '?')}")
                rows.append(row)
                continue
            hc = r["impls"]["hybridcache"]
            row += [_fmt(hc["step"]["p50_us"]), _fmt(hc["step"]["p90_us"])]
            if vllm:
                vl = r["impls"]["vllm"]
                sp = r["speedup"]
                row += [_fmt(vl["step"]["p50_us"]), _fmt(vl["step"]["p90_us"]),
                        _fmt_ratio(sp["step_p50"]), _fmt_ratio(sp["step_p90"])]
            for k in ("decode_allocate_slots", "get_computed_blocks", "free"):
                h = hc["calls"][k]["p50_us"]
                if vllm:
                    v = r["impls"]["vllm"]["calls"][k]["p50_us"]
                    row.append(f"{_fmt(h, 2)} / {_fmt(v, 2)}")
                else:
                    row.append(_fmt(h, 2))
            rows.append(row)
        widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
        for row in rows:
            lines.append("  " + "  ".join(c.rjust(wd) for c, wd in zip(row, widths)))
        if vllm:
            lines.append("  (per-call columns: hybridcache / vLLM µs)")
        lines.extend(notes)
    scale = report.get("scale")
    if scale:
        lines.append("")
        for name, s in scale.items():
            bpb = s["bytes_per_block"]
            lines.append(
                f"pool of {s['num_blocks']:,} blocks ({name}): built in {_fmt(s['build_ms'])} ms, "
                f"{'?' if bpb is None else _fmt(bpb)} bytes of metadata per block (RSS delta)"
            )
    verified = [r for r in report["results"] if r.get("verified")]
    diverged = [r for r in report["results"] if r.get("verified") is False]
    lines.append("")
    if diverged:
        lines.append(f"DIVERGED in {len(diverged)} configuration(s)")
    elif vllm:
        lines.append(f"verified: identical block tables, hit lengths, stats and free-block counts to vLLM {vllm} "
                     f"in all {len(verified)} configurations ({sum(r['ops'] for r in verified):,} calls each)")
    lines.append(f"total time {report['seconds']:.1f} s")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: str) -> str | None:
    """Per-step latency distributions (ECDF, log scale); None on success,
    else why nothing was drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        return "matplotlib is not installed: no plot drawn (pip install matplotlib)"
    results = [r for r in report["results"] if "impls" in r]
    configs = list(dict.fromkeys(r["config"] for r in results))
    runnings = sorted({r["running"] for r in results})
    if not results:
        return "nothing to plot"
    fig, axes = plt.subplots(len(configs), len(runnings), figsize=(4.2 * len(runnings), 3.2 * len(configs)),
                             squeeze=False)
    for r in results:
        ax = axes[configs.index(r["config"])][runnings.index(r["running"])]
        for name, impl in r["impls"].items():
            v = sorted(impl["step_us_all"][r["warmup_steps"]:])
            if not v:
                continue
            ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=name)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ratio = (r.get("speedup") or {}).get("step_p50")
        ax.set_title(f"{r['config']}, {r['running']} running" + (f" (p50 {ratio:.1f}x)" if ratio else ""), fontsize=9)
        ax.set_xlabel("µs of manager calls per step")
        ax.set_ylabel("fraction of steps")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------


def run_bench(
    configs: Sequence[str] = CONFIGS,
    runnings: Sequence[int] = RUNNING,
    steps: int = 300,
    seed: int = 0,
    use_vllm: bool = True,
    show_progress: bool = True,
    scale_blocks: int = SCALE_BLOCKS,
    quick: bool = False,
    clock: str = "perf_counter",
) -> dict[str, Any]:
    from . import __version__

    start = time.perf_counter()
    workloads = [Workload(config=c, running=r, steps=steps, seed=seed) for c in configs for r in runnings]
    vllm_version, note = load_vllm() if use_vllm else (None, "vLLM not used (--no-vllm)")
    total = sum(2 * (w.warmup_steps + w.steps) for w in workloads)
    progress = Progress(total, show_progress)
    # Everything alive now (vLLM, torch) is left out of later collections.
    gc.collect()
    gc.freeze()
    try:
        progress.phase(f"pool of {scale_blocks:,} blocks")
        scale = scale_figures(bool(vllm_version), scale_blocks) if scale_blocks else None
        results = [run_workload(w, bool(vllm_version), progress, clock=clock) for w in workloads]
        batched = _batched_rows(configs, runnings, min(steps, 100), seed) if vllm_version else None
    finally:
        progress.close()
        gc.unfreeze()
    return {
        "hybridcache": __version__,
        "vllm": vllm_version,
        "vllm_note": note,
        "quick": quick,
        "clock": clock,
        "load_average": _loadavg(),
        "seed": seed,
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "scale": scale,
        "results": results,
        "batched": batched,
        "seconds": time.perf_counter() - start,
    }


def _batched_rows(configs: Sequence[str], runnings: Sequence[int], steps: int, seed: int) -> list[dict[str, Any]]:
    """The batched decode API against vLLM's per-request calls (see bench_batched)."""
    from .bench_batched import run_batched

    def make_configs(config: str, num_blocks: int) -> tuple[Any, Any]:
        w = Workload(config=config, running=1, steps=1, seed=seed)
        return hybridcache_kv_cache_config(w, num_blocks), vllm_kv_cache_config(w, num_blocks)

    rows = []
    for config in configs:
        kwargs = Workload(config=config, running=1, steps=1, seed=seed).manager_kwargs()
        kwargs.update(log_stats=False, enable_kv_cache_events=False)
        for running in runnings:
            rows.append(run_batched(config, running, steps, make_configs, kwargs, seed))
    return rows


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from e
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"expected positive integers, got {text!r}")
    return values


def add_arguments(parser: Any) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="a short run: 20 measured steps, 64 and 256 running, a 100k-block pool")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout (no table)")
    parser.add_argument("--plot", metavar="PNG", help="draw per-step latency distributions (needs matplotlib)")
    parser.add_argument("--config", action="append", choices=CONFIGS, dest="configs",
                        help="configuration to run (repeatable; default: all)")
    parser.add_argument("--running", type=str, default=None,
                        help="running-request counts, comma-separated (default 64,256,1024; --quick 64,256)")
    parser.add_argument("--steps", type=int, default=None,
                        help="measured steps per configuration (default 300; --quick 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-vllm", action="store_true", help="run hybridcache only, even if vLLM is importable")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="perf_counter",
                        help="timer around each call: perf_counter (wall, default) or thread_time "
                        "(this thread's CPU time: ignores time the OS ran other processes, on a busy machine)")
    parser.add_argument("--scale-blocks", type=int, default=None,
                        help="pool size for the build-time / bytes-per-block figures "
                        "(default 1,000,000; --quick 100,000; 0: skip)")


def main(args: Any) -> int:
    import json

    try:
        runnings = _int_list(args.running) if args.running else ([64, 256] if args.quick else list(RUNNING))
    except ValueError as e:
        print(f"hybridcache bench: --running: {e}", file=sys.stderr)
        return 2
    steps = args.steps if args.steps is not None else (20 if args.quick else 300)
    scale_blocks = args.scale_blocks if args.scale_blocks is not None else (100_000 if args.quick else SCALE_BLOCKS)
    if steps <= 0:
        print("hybridcache bench: --steps must be positive", file=sys.stderr)
        return 2
    # Whatever vLLM (or anything else) logs goes to stderr, not into the table / JSON.
    with contextlib.redirect_stdout(sys.stderr):
        report = run_bench(
            configs=args.configs or CONFIGS,
            runnings=runnings,
            steps=steps,
            seed=args.seed,
            use_vllm=not args.no_vllm,
            show_progress=not args.no_progress,
            scale_blocks=max(0, scale_blocks),
            quick=args.quick,
            clock=args.clock,
        )
        why = plot(report, args.plot) if args.plot else None
    if args.plot:
        print(why or f"plot written to {args.plot}", file=sys.stderr)
    if args.json:
        out = dict(report)
        # The per-step series are for --plot; keep the JSON small.
        out["results"] = [_without_series(r) for r in report["results"]]
        print(json.dumps(out, indent=2))
    else:
        print(format_report(report))
        if report.get("batched"):
            from .bench_batched import format_batched

            print()
            print(format_batched(report["batched"]))
    return 1 if any(r.get("verified") is False for r in report["results"]) else 0


def _without_series(r: dict[str, Any]) -> dict[str, Any]:
    r = dict(r)
    if "impls" in r:
        r["impls"] = {k: {kk: vv for kk, vv in v.items() if kk != "step_us_all"} for k, v in r["impls"].items()}
    return r


__all__ = [
    "CONFIGS",
    "RUNNING",
    "BenchDivergence",
    "Recording",
    "Workload",
    "format_report",
    "record",
    "replay_timed",
    "run_bench",
    "run_workload",
    "scale_figures",
]
