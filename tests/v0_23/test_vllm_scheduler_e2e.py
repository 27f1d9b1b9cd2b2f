"""vLLM 0.23.0's own `Scheduler`, built twice per configuration — once stock,
once with `hybridcache.vllm.install()` — and driven in lockstep by the same
seeded workload and simulated model outputs (sampled tokens, accepted drafts).
Every step compares everything the scheduler hands out: scheduled requests and
token counts, new block ids per group, num_common_prefix_blocks, preempted and
finished ids, block ids to zero, engine-core outputs, KV events, prefix-cache
stats, plus the manager views vLLM code reads (block_pool, coordinator) and,
with a scripted KV connector, what the connector sees.

The schedulers are built as vLLM's tests/v1/core/utils.py `create_scheduler`
does, except that the model is a local config.json naming a registered stub
architecture (no hub access, no model code import), the device is "cpu",
hybrid (full attention + Mamba "align") configs pass their own KVCacheConfig,
and EAGLE is expressed by setting the speculative method after validation
(the scheduler reads nothing else of it; no draft checkpoint is needed).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import pytest

# Compares against vLLM 0.23.0 (tests/conftest.py: left to that release's venv elsewhere).
pytestmark = pytest.mark.vllm("0.23.0")

from hybridcache_dev.oracle import module_needs_vllm  # noqa: E402

vllm = module_needs_vllm("0.23.0")

import torch  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVEventsConfig,
    KVTransferConfig,
    ModelConfig,
    ObservabilityConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorMetadata,
    SupportsHMA,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

import hybridcache.vllm as hc_vllm  # noqa: E402
from hybridcache.releases.v0_23.scheduler import VllmKVCacheManager as VllmKVCacheManager023  # noqa: E402
from hybridcache_dev.step_bench import stub_model_dir as shared_stub_model_dir  # noqa: E402
from hybridcache_dev.block_metrics import observe, record_calls  # noqa: E402

EOS_TOKEN_ID = 50256
STOP_TOKEN_ID = 999  # sampled now and then: requests stop early, mid-draft too


# --------------------------------------------------------------------------
# Scheduler construction


def stub_model_dir(root: Any) -> str:
    return shared_stub_model_dir(str(root))


@dataclass(frozen=True)
class Case:
    name: str
    steps: int = 500
    seed: int = 0
    block_size: int = 16
    num_blocks: int = 2000
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 256
    max_model_len: int = 1024
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    prefix_caching: bool = False
    events: bool = False
    num_spec: int | None = None  # speculative tokens (None: no spec decoding)
    eagle: bool = False  # EAGLE-style (lookahead slots, eagle pruning); else ngram/suffix-style
    mamba: str | None = None  # hybrid: full attention + Mamba with this mamba_cache_mode ("align", ...)
    sliding_window: int | None = None  # hybrid: full attention + sliding window of this many tokens
    arrival_p: float = 0.35
    abort_p: float = 0.03
    prompt_len: tuple[int, int] = (8, 200)
    max_tokens: tuple[int, int] = (4, 80)
    reset_every: int = 0  # reset_prefix_cache(reset_running_requests=True) every N steps
    async_scheduling: bool = False  # AsyncScheduler; model output comes back one step late
    connector: str | None = None  # ScriptedConnector with this kv_load_failure_policy ("recompute"/"fail")
    # vLLM 0.23.0 under-counts the blocks a Mamba "align" group needs when a
    # fresh request brings external (connector) tokens: its allocate_slots
    # passes the free-block check, then BlockPool.get_new_blocks raises
    # "Cannot get 1 free blocks from the pool" (an engine crash). hybridcache
    # answers None (the request waits). Expect that here: the lockstep stops
    # there and hybridcache must go on cleanly.
    vllm_pool_error: bool = False
    # hybridcache's side gets the request block hasher `install()` gives vLLM's
    # engine (hybridcache's native one); stock keeps vLLM's Python hasher.
    native_hashing: bool = True
    # vLLM's KV-cache residency metrics (observability_config.kv_cache_metrics)
    # sampled at this rate: the scheduler's own collector, on both sides.
    kv_metrics: float | None = None


def build_scheduler(case: Case, model_dir: str, hybrid: bool, kv_events_config: Any = None) -> Scheduler:
    """`create_scheduler` of vLLM's tests/v1/core/utils.py, generalised. The
    scheduler's event publisher is wrapped in an `EventRecorder`."""
    model_config = ModelConfig(model=model_dir, dtype="float16", seed=42, skip_tokenizer_init=True,
                               max_model_len=case.max_model_len)
    scheduler_config = SchedulerConfig(
        max_num_seqs=case.max_num_seqs,
        max_num_batched_tokens=case.max_num_batched_tokens,
        max_model_len=case.max_model_len,
        long_prefill_token_threshold=case.long_prefill_token_threshold,
        enable_chunked_prefill=case.enable_chunked_prefill,
        is_encoder_decoder=False,
        async_scheduling=case.async_scheduling,
    )
    cache_config = CacheConfig(
        block_size=case.block_size,
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=case.prefix_caching,
        mamba_cache_mode=case.mamba or "none",
    )
    speculative_config = None
    if case.num_spec is not None:
        # Async scheduling accepts only GPU-side drafters; "eagle" is set below.
        method = "ngram_gpu" if case.async_scheduling else "ngram"
        speculative_config = SpeculativeConfig(method=method, num_speculative_tokens=case.num_spec)
    if kv_events_config is None and case.events:
        kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
    kv_transfer_config = None
    if case.connector:
        kv_transfer_config = KVTransferConfig(kv_connector=CONNECTOR_NAME, kv_role="kv_both",
                                              kv_load_failure_policy=case.connector)
    vllm_config = VllmConfig(
        kv_transfer_config=kv_transfer_config,
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
        parallel_config=ParallelConfig(),
        speculative_config=speculative_config,
        kv_events_config=kv_events_config,
        device_config=DeviceConfig(device="cpu"),
        observability_config=ObservabilityConfig(kv_cache_metrics=case.kv_metrics is not None,
                                                 kv_cache_metrics_sample=case.kv_metrics or 0.01),
    )
    if case.eagle:
        # EAGLE without a draft checkpoint: the scheduler only reads the method.
        vllm_config.speculative_config.method = "eagle"
    groups = [KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=case.block_size, num_kv_heads=1,
                                                            head_size=1, dtype=torch.float32))]
    if case.mamba:
        groups.append(KVCacheGroupSpec(["mamba"], MambaSpec(block_size=case.block_size, shapes=((1, 1),),
                                                            dtypes=(torch.float32,), mamba_cache_mode=case.mamba)))
    if case.sliding_window:
        groups.append(KVCacheGroupSpec(["swa"], SlidingWindowSpec(block_size=case.block_size, num_kv_heads=1,
                                                                  head_size=1, dtype=torch.float32,
                                                                  sliding_window=case.sliding_window)))
    kv_cache_config = KVCacheConfig(num_blocks=case.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    cache_config.num_gpu_blocks = case.num_blocks
    register_all_kvcache_specs(vllm_config)
    if hybrid:
        hc_vllm.install()
    try:
        scheduler_cls = AsyncScheduler if case.async_scheduling else Scheduler
        scheduler = scheduler_cls(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            block_size=case.block_size,
            log_stats=True,
            structured_output_manager=StructuredOutputManager(vllm_config),
        )
    finally:
        if hybrid:
            hc_vllm.uninstall()
    expected = VllmKVCacheManager023 if hybrid else vllm.v1.core.kv_cache_manager.KVCacheManager
    assert type(scheduler.kv_cache_manager) is expected
    if hybrid:
        # Within CPython's shared keys: the scheduler's lookups on it
        # specialize (tests/test_bound_allocate.py).
        assert len(vars(scheduler.kv_cache_manager)) < 30, sorted(vars(scheduler.kv_cache_manager))
    scheduler.kv_event_publisher = EventRecorder(scheduler.kv_event_publisher)
    if scheduler.kv_metrics_collector is not None:
        record_calls(scheduler.kv_metrics_collector)
    return scheduler


class EventRecorder:
    """Wraps the scheduler's KV event publisher: records each batch, then
    hands it on."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches: list[Any] = []
        self.num_published = 0

    def publish(self, batch: Any) -> None:
        self.batches.append(batch)
        self.num_published += 1
        self.inner.publish(batch)

    def take(self) -> list[Any]:
        events = [e for b in self.batches for e in b.events]
        self.batches = []
        return events

    def shutdown(self) -> None:
        self.inner.shutdown()


# --------------------------------------------------------------------------
# A scripted KV connector (scheduler side): external hits, async loads, async
# saves, load failures -- all decided from the request alone, so both
# schedulers see the same. It also reads the bound GPU block pool.

CONNECTOR_NAME = "HybridcacheScriptedConnector"


class ScriptedConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.block_size = vllm_config.cache_config.block_size
        self.pool: Any = None
        self.log: list[Any] = []  # compared between the two schedulers
        self.pending_loads: dict[str, int] = {}  # request id -> steps left
        self.pending_saves: dict[str, int] = {}
        self.ready_recving: set[str] = set()
        self.ready_sending: set[str] = set()
        self.local_tokens: dict[str, int] = {}
        self.sync_loads: dict[str, tuple[int, int]] = {}  # this step: id -> (local tokens, external tokens)

    @staticmethod
    def _n(request: Any) -> int:
        return int(request.request_id[1:])

    # scheduler side
    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        self.pool = gpu_block_pool
        self.log.append(("bind", gpu_block_pool.num_gpu_blocks, gpu_block_pool.get_num_free_blocks()))

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        n = self._n(request)
        self.local_tokens[request.request_id] = num_computed_tokens
        if n % 3 == 0 or request.num_preemptions:
            return 0, False
        avail = request.num_tokens - 1 - num_computed_tokens
        ext = (avail // 2) // self.block_size * self.block_size
        return (ext, n % 3 == 2) if ext > 0 else (0, False)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        rid = request.request_id
        ids = blocks.get_block_ids()
        pool = self.pool
        views = [(b, pool.blocks[b].ref_cnt, pool.blocks[b].block_hash, pool.blocks[b].is_null)
                 for g in ids for b in g]
        self.log.append(("alloc", rid, ids, num_external_tokens, blocks.get_unhashed_block_ids_all_groups(),
                         views, pool.get_num_free_blocks(), pool.get_usage()))
        if num_external_tokens and self._n(request) % 3 == 2 and rid not in self.pending_loads:
            self.pending_loads[rid] = 1 + self._n(request) % 3
        elif num_external_tokens:
            self.sync_loads[rid] = (self.local_tokens.get(rid, 0), num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        for pending, ready in ((self.pending_loads, self.ready_recving), (self.pending_saves, self.ready_sending)):
            for rid in sorted(pending):
                pending[rid] -= 1
                if pending[rid] <= 0:
                    del pending[rid]
                    ready.add(rid)
        return KVConnectorMetadata()

    def take_transfer_results(self) -> tuple[set[str], set[str], dict[str, tuple[int, int]]]:
        out = (self.ready_recving, self.ready_sending, self.sync_loads)
        self.ready_recving, self.ready_sending, self.sync_loads = set(), set(), {}
        self.log.append(("transfers", sorted(out[0]), sorted(out[1]), sorted(out[2].items())))
        return out

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]) -> tuple[bool, Any]:
        rid = request.request_id
        self.log.append(("finished", rid, [list(g) for g in block_ids]))
        if rid in self.pending_loads or rid in self.ready_recving:
            return False, None  # the scheduler itself holds the blocks until the load ends
        if self._n(request) % 4 == 0 and request.status != RequestStatus.FINISHED_ABORTED:
            self.pending_saves[rid] = 2  # an async save holds the blocks
            return True, None
        return False, None

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, Any]:
        return self.request_finished_all_groups(request, (block_ids,))

    # worker side (never used here)
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        pass


try:
    KVConnectorFactory.register_connector(CONNECTOR_NAME, __name__, "ScriptedConnector")
except ValueError:  # already registered (module imported twice)
    pass


# --------------------------------------------------------------------------
# Workload


@dataclass(frozen=True)
class ReqSpec:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    cache_salt: str | None
    arrival: float


def make_workload(case: Case) -> dict[int, list[ReqSpec]]:
    """Arrivals per step. Prompts share a few prefixes so prefix caching hits."""
    rng = random.Random(case.seed * 7919 + 1)
    prefixes = [[rng.randrange(1, 900) for _ in range(n)] for n in (0, 16, 40, 64, 100)]
    lo, hi = case.prompt_len
    plan: dict[int, list[ReqSpec]] = {}
    n = 0
    for step in range(case.steps):
        k = 3 if step == 0 else (1 if rng.random() < case.arrival_p else 0) + (rng.random() < case.arrival_p / 4)
        for _ in range(k):
            prefix = rng.choice(prefixes)
            length = max(rng.randint(lo, hi), len(prefix) + 1)
            prompt = (prefix + [rng.randrange(1, 900) for _ in range(length - len(prefix))])[:length]
            if rng.random() < 0.15 and n:  # an exact repeat of an earlier prompt
                earlier = rng.choice([r for s in plan.values() for r in s])
                prompt = list(earlier.prompt)
            max_tokens = rng.randint(*case.max_tokens)
            max_tokens = min(max_tokens, case.max_model_len - len(prompt) - 1)
            salt = "salt-a" if rng.random() < 0.1 else None
            plan.setdefault(step, []).append(ReqSpec(f"r{n}", tuple(prompt), max_tokens, salt, float(step)))
            n += 1
    return plan


_hash_ready = False


def make_request(spec: ReqSpec, block_size: int, native_hashing: bool = False) -> Request:
    global _hash_ready
    if not _hash_ready:
        init_none_hash(sha256)
        _hash_ready = True
    factory = get_request_block_hasher
    if native_hashing:
        # As the engine's hasher under install(): it also puts the native
        # append_output_token_ids on vLLM's Request (a class attribute: the
        # stock side's requests, hashed in Python, take its path for other
        # hashers; tests/test_token_append.py pins both against vLLM's method).
        factory = hc_vllm.native_request_block_hasher(get_request_block_hasher, token_append=True)
    params = SamplingParams(max_tokens=spec.max_tokens, stop_token_ids=[STOP_TOKEN_ID])
    params.update_from_generation_config({}, EOS_TOKEN_ID)
    return Request(
        request_id=spec.request_id,
        prompt_token_ids=list(spec.prompt),
        sampling_params=params,
        pooling_params=None,
        arrival_time=spec.arrival,
        cache_salt=spec.cache_salt,
        block_hasher=factory(block_size, sha256),
    )


# --------------------------------------------------------------------------
# Normalised views of what the scheduler hands out


def norm_scheduler_output(so: Any) -> dict[str, Any]:
    c = so.scheduled_cached_reqs
    return {
        "new": [(r.req_id, list(r.prompt_token_ids), [list(g) for g in r.block_ids], r.num_computed_tokens)
                for r in so.scheduled_new_reqs],
        "cached_req_ids": list(c.req_ids),
        "resumed": sorted(c.resumed_req_ids),
        "cached_new_block_ids": [None if b is None else [list(g) for g in b] for b in c.new_block_ids],
        "cached_num_computed_tokens": list(c.num_computed_tokens),
        "cached_num_output_tokens": list(c.num_output_tokens),
        "num_scheduled_tokens": list(so.num_scheduled_tokens.items()),
        "total_num_scheduled_tokens": so.total_num_scheduled_tokens,
        "spec_tokens": sorted((k, list(v)) for k, v in so.scheduled_spec_decode_tokens.items()),
        "num_common_prefix_blocks": list(so.num_common_prefix_blocks),
        "preempted": sorted(so.preempted_req_ids),
        "finished": sorted(so.finished_req_ids),
        "new_block_ids_to_zero": so.new_block_ids_to_zero,
    }


def norm_engine_outputs(outs: dict[int, Any]) -> list[Any]:
    result = []
    for client in sorted(outs):
        eco = outs[client]
        stats = eco.scheduler_stats
        result.append((
            client,
            [(o.request_id, list(o.new_token_ids), o.finish_reason, o.stop_reason,
              None if o.prefill_stats is None else dataclasses.asdict(o.prefill_stats))
             for o in eco.outputs],
            sorted(eco.finished_requests or ()),
            None if stats is None else (
                stats.num_running_reqs, stats.num_waiting_reqs, stats.num_skipped_waiting_reqs,
                stats.kv_cache_usage, dataclasses.asdict(stats.prefix_cache_stats),
                len(stats.kv_cache_eviction_events or ()),
            ),
        ))
    return result


def manager_views(s: Scheduler) -> dict[str, Any]:
    """What vLLM code reads off `kv_cache_manager` beyond its methods."""
    m = s.kv_cache_manager
    pool = m.block_pool
    running = sorted(s.running, key=lambda r: r.request_id)
    tables = {r.request_id: m.get_block_ids(r.request_id) for r in running}
    blocks = sorted({b for t in tables.values() for g in t for b in g})
    return {
        "block_hashes": {r.request_id: list(r.block_hashes) for r in running},
        "free": pool.get_num_free_blocks(),
        "free_queue": pool.free_block_queue.num_free_blocks,
        "usage": pool.get_usage(),
        "manager_usage": m.usage,
        "num_gpu_blocks": pool.num_gpu_blocks,
        "null": (pool.null_block.block_id, pool.null_block.is_null),
        "empty": m.empty_kv_cache_blocks.get_block_ids(),
        "tables": tables,
        "get_blocks": {rid: m.get_blocks(rid).get_block_ids() for rid in tables},
        # Scheduler._request_remaining_blocks -> coordinator.get_num_blocks_to_allocate
        "remaining": {r.request_id: s._request_remaining_blocks(r)
                      for r in sorted({*running, *s._inflight_prefills}, key=lambda r: r.request_id)},
        "block_views": [(b, pool.blocks[b].block_id, pool.blocks[b].ref_cnt, pool.blocks[b].block_hash,
                         pool.blocks[b].is_null) for b in blocks],
    }


# --------------------------------------------------------------------------
# The lockstep driver


def simulate_model(case: Case, so: Any, sched: Scheduler, rng: random.Random) -> ModelRunnerOutput:
    """Sampled tokens per scheduled request: nothing for a prefill chunk; else
    one token per accepted draft (0..all of the scheduled drafts) plus the
    bonus token; now and then the stop token, so requests end mid-draft."""
    req_ids, sampled = [], []
    for rid in so.num_scheduled_tokens:
        req = sched.requests[rid]
        req_ids.append(rid)
        if req.is_prefill_chunk:
            sampled.append([])
            continue
        drafts = so.scheduled_spec_decode_tokens.get(rid, [])
        accepted = rng.choice([0, len(drafts), rng.randint(0, len(drafts))]) if drafts else 0
        toks = [STOP_TOKEN_ID if rng.random() < 0.02 else rng.randrange(1, 900) for _ in range(accepted + 1)]
        sampled.append(toks)
    return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                             sampled_token_ids=sampled)


def propose_drafts(case: Case, sched: Scheduler, so: Any, rng: random.Random) -> DraftTokenIds | None:
    if case.num_spec is None:
        return None
    req_ids, drafts = [], []
    for rid in so.num_scheduled_tokens:
        req = sched.requests.get(rid)
        if req is None or req.is_finished():
            continue
        if case.eagle:  # EAGLE proposes a fixed count
            n = case.num_spec
        else:  # suffix-decoding style: the count changes every round, often 0
            n = rng.choice([0, 0, 1, 2, case.num_spec, rng.randint(0, case.num_spec)])
        req_ids.append(rid)
        drafts.append([rng.randrange(1, 900) for _ in range(n)])
    return DraftTokenIds(req_ids, drafts)


class Mismatch(AssertionError):
    pass


class VllmPoolError(Exception):
    """vLLM 0.23.0's scheduler crashed inside its block pool (see
    `Case.vllm_pool_error`); the stock scheduler is unusable afterwards."""


def _check(case: Case, step: int, what: str, a: Any, b: Any) -> None:
    if a != b:
        raise Mismatch(f"[{case.name}] step {step}: {what} differs\n  vllm:        {a!r}\n  hybridcache: {b!r}")


def connector_output(case: Case, stock: Scheduler, hc: Scheduler, step: int, rng: random.Random) -> Any:
    """Transfers the scripted connectors finished this step, and now and then
    a failed load of a block that was just loaded synchronously."""
    res = stock.connector.take_transfer_results()
    _check(case, step, "connector transfers", res, hc.connector.take_transfer_results())
    recving, sending, sync_loads = res
    invalid: set[int] = set()
    if len(stock.kv_cache_config.kv_cache_groups) == 1:  # vLLM handles load failures for one group only
        for rid, (local, ext) in sorted(sync_loads.items()):
            if rid in stock.requests and rng.random() < 0.3:
                (ids,) = stock.kv_cache_manager.get_block_ids(rid)
                idx = (local + rng.randrange(ext)) // case.block_size
                if idx < len(ids):
                    invalid.add(ids[idx])
    return KVConnectorOutput(finished_sending=sending or None, finished_recving=recving or None,
                             invalid_block_ids=invalid)


def finish_alone(case: Case, hc: Scheduler, step: int, rng: random.Random) -> None:
    """After vLLM's crash: hybridcache's scheduler goes on alone (the step
    vLLM crashed in, then a few more), then drains to an empty pool."""
    for i in range(20):
        if i == 5:
            hc.finish_requests(sorted(hc.requests), RequestStatus.FINISHED_ABORTED)
        so = hc.schedule()
        mro = simulate_model(case, so, hc, rng)
        if hc.connector is not None:
            recving, sending, _ = hc.connector.take_transfer_results()
            mro.kv_connector_output = KVConnectorOutput(finished_sending=sending or None,
                                                        finished_recving=recving or None)
        hc.update_from_output(so, mro)
        hc.kv_cache_manager.check_invariants()
        if i >= 5 and not hc.requests:
            break
    assert not hc.requests, sorted(hc.requests)
    assert hc.kv_cache_manager.block_pool.get_num_free_blocks() == case.num_blocks - 1


def run_lockstep(case: Case, model_dir: str, schedulers: tuple[Scheduler, Scheduler] | None = None) -> dict[str, int]:
    """Drives vLLM's scheduler stock and with hybridcache in lockstep; raises
    Mismatch at the first difference. Returns counts of what happened."""
    if schedulers is None:
        schedulers = build_scheduler(case, model_dir, hybrid=False), build_scheduler(case, model_dir, hybrid=True)
    stock, hc = schedulers
    plan = make_workload(case)
    rng = random.Random(case.seed * 104729 + 17)
    totals = {"scheduled_tokens": 0, "preempted": 0, "finished": 0, "aborted": 0, "events": 0, "hits": 0,
              "spec_tokens": 0, "resets": 0, "zeroed": 0, "steps": 0, "async_loads": 0, "load_failures": 0,
              "metric_calls": 0, "evicted_sampled": 0}
    # Scheduled steps whose model output has not come back yet (async scheduling).
    in_flight: list[tuple[Any, Any, ModelRunnerOutput]] = []

    def finish_oldest(step: int) -> None:
        so_stock, so_hc, mro = in_flight.pop(0)
        out_stock = stock.update_from_output(so_stock, copy.deepcopy(mro))
        out_hc = hc.update_from_output(so_hc, copy.deepcopy(mro))
        _check(case, step, "engine core outputs", norm_engine_outputs(out_stock), norm_engine_outputs(out_hc))
        ev_stock = stock.kv_event_publisher.take()
        _check(case, step, "kv events", ev_stock, hc.kv_event_publisher.take())
        totals["events"] += len(ev_stock)
        for eco in out_stock.values():
            if eco.scheduler_stats is not None:
                totals["hits"] += eco.scheduler_stats.prefix_cache_stats.hits
        if not case.async_scheduling:
            drafts = propose_drafts(case, stock, so_stock, rng)
            if drafts is not None:
                stock.update_draft_token_ids(drafts)
                hc.update_draft_token_ids(copy.deepcopy(drafts))
        _check(case, step, "manager views after update", manager_views(stock), manager_views(hc))

    def one_step(step: int, workload: bool) -> None:
        if workload:
            for spec in plan.get(step, []):
                stock.add_request(make_request(spec, case.block_size))
                hc.add_request(make_request(spec, case.block_size, case.native_hashing))
            if rng.random() < case.abort_p and stock.requests:
                victim = rng.choice(sorted(stock.requests))
                stock.finish_requests(victim, RequestStatus.FINISHED_ABORTED)
                hc.finish_requests(victim, RequestStatus.FINISHED_ABORTED)
                totals["aborted"] += 1
            if case.reset_every and step and step % case.reset_every == 0:
                ok = stock.reset_prefix_cache(reset_running_requests=True)
                _check(case, step, "reset_prefix_cache", ok, hc.reset_prefix_cache(reset_running_requests=True))
                totals["resets"] += ok

        state = random.getstate()  # the metrics collectors sample from the same draws
        try:
            so_stock = stock.schedule()
        except ValueError as e:
            if not case.vllm_pool_error or "free blocks from the pool" not in str(e):
                raise
            raise VllmPoolError(step) from e
        random.setstate(state)
        so_hc = hc.schedule()
        _check(case, step, "scheduler output", norm_scheduler_output(so_stock), norm_scheduler_output(so_hc))
        if case.kv_metrics is not None:
            seen = observe(stock.kv_metrics_collector, drain=False)
            _check(case, step, "metrics collector", seen, observe(hc.kv_metrics_collector, drain=False))
            totals["metric_calls"] += len(seen[0])
            totals["evicted_sampled"] += len(stock.kv_metrics_collector._eviction_events)
        _check(case, step, "manager views after schedule", manager_views(stock), manager_views(hc))
        mro = simulate_model(case, so_stock, stock, rng)
        if case.connector:
            mro.kv_connector_output = connector_output(case, stock, hc, step, rng)
            totals["async_loads"] += len(mro.kv_connector_output.finished_recving or ())
            totals["load_failures"] += len(mro.kv_connector_output.invalid_block_ids)
            _check(case, step, "connector log (views of the bound block pool)", stock.connector.log, hc.connector.log)
            stock.connector.log.clear()
            hc.connector.log.clear()
        in_flight.append((so_stock, so_hc, mro))
        if len(in_flight) > (1 if case.async_scheduling else 0):
            finish_oldest(step)

        totals["steps"] += 1
        totals["scheduled_tokens"] += so_stock.total_num_scheduled_tokens
        totals["preempted"] += len(so_stock.preempted_req_ids)
        totals["finished"] += len(so_stock.finished_req_ids)
        totals["zeroed"] += len(so_stock.new_block_ids_to_zero or ())
        totals["spec_tokens"] += sum(len(v) for v in so_stock.scheduled_spec_decode_tokens.values())

    try:
        for step in range(case.steps):
            one_step(step, workload=True)
    except VllmPoolError as e:
        totals["vllm_pool_error_step"] = e.args[0]
        finish_alone(case, hc, e.args[0], rng)
        return totals
    while in_flight:
        finish_oldest(case.steps)
    # Drain: abort everything, let transfers in flight end; both pools must end
    # equal, all blocks free but the null block.
    live = sorted(stock.requests)
    stock.finish_requests(live, RequestStatus.FINISHED_ABORTED)
    hc.finish_requests(live, RequestStatus.FINISHED_ABORTED)
    for extra in range(1, 10):
        c = stock.connector
        if c is None or not (c.pending_loads or c.pending_saves or c.ready_recving or c.ready_sending):
            break
        one_step(case.steps + extra, workload=False)
    while in_flight:
        finish_oldest(case.steps + 10)
    _check(case, case.steps, "manager views after drain", manager_views(stock), manager_views(hc))
    assert not stock.requests and not hc.requests
    assert hc.kv_cache_manager.block_pool.get_num_free_blocks() == case.num_blocks - 1
    hc.kv_cache_manager.check_invariants()
    return totals


# --------------------------------------------------------------------------
# The configurations

CASES = [
    Case("full_attention", num_blocks=4000),
    Case("full_attention_no_chunked_prefill", enable_chunked_prefill=False, max_num_batched_tokens=1024,
         num_blocks=3000, seed=1),
    Case("prefix_caching_events", prefix_caching=True, events=True, num_blocks=600, seed=2, reset_every=97),
    Case("prefix_caching_events_vllm_hasher", prefix_caching=True, events=True, num_blocks=600, seed=2,
         reset_every=97, native_hashing=False),
    Case("chunked_prefill_threshold", prefix_caching=True, events=True, max_num_batched_tokens=96,
         long_prefill_token_threshold=40, prompt_len=(40, 400), num_blocks=1500, seed=3),
    Case("spec_dynamic_drafts", prefix_caching=True, events=True, num_spec=5, num_blocks=1500, seed=4),
    Case("spec_eagle_lookahead", prefix_caching=True, events=True, num_spec=3, eagle=True, num_blocks=1500,
         seed=5),
    Case("preemption_pressure", prefix_caching=True, events=True, num_spec=4, num_blocks=70, max_num_seqs=12,
         prompt_len=(20, 260), max_tokens=(20, 120), arrival_p=0.5, seed=6),
    Case("hybrid_mamba_align", prefix_caching=True, events=True, mamba="align", num_blocks=800, seed=7,
         reset_every=131),
    Case("hybrid_mamba_align_spec_dynamic", prefix_caching=True, events=True, mamba="align", num_spec=4,
         num_blocks=800, seed=8),
    Case("hybrid_mamba_align_eagle_pressure", prefix_caching=True, events=True, mamba="align", num_spec=2,
         eagle=True, num_blocks=90, max_num_seqs=10, prompt_len=(20, 240), arrival_p=0.5, seed=9),
    Case("hybrid_sliding_window_eagle", prefix_caching=True, events=True, sliding_window=48, num_spec=3, eagle=True,
         num_blocks=120, max_num_seqs=12, prompt_len=(16, 300), arrival_p=0.5, seed=15),
    Case("no_caching_pressure", num_spec=3, num_blocks=60, max_num_seqs=12, prompt_len=(20, 260),
         max_tokens=(20, 120), arrival_p=0.5, seed=10),
    Case("async_eagle_pipelined", async_scheduling=True, prefix_caching=True, events=True, num_spec=2,
         eagle=True, num_blocks=1500, seed=11),
    Case("kv_connector_recompute", connector="recompute", prefix_caching=True, events=True, num_blocks=160,
         max_num_seqs=12, prompt_len=(16, 300), arrival_p=0.5, seed=13),
    Case("kv_connector_fail_spec", connector="fail", prefix_caching=True, events=True, num_spec=3, num_blocks=160,
         max_num_seqs=12, prompt_len=(16, 300), arrival_p=0.5, seed=14),
    Case("kv_connector_mamba_align", connector="recompute", prefix_caching=True, events=True, mamba="align",
         num_blocks=120, max_num_seqs=12, prompt_len=(16, 300), arrival_p=0.5, steps=400, seed=2,
         vllm_pool_error=True),
    Case("kv_cache_metrics_pressure", prefix_caching=True, events=True, num_spec=3, eagle=True, num_blocks=70,
         max_num_seqs=12, prompt_len=(20, 260), max_tokens=(20, 120), arrival_p=0.5, reset_every=89,
         kv_metrics=0.5, seed=16),
    Case("kv_cache_metrics_hybrid_no_caching", mamba="none", num_blocks=80, max_num_seqs=10, kv_metrics=1.0, seed=17,
         steps=300),
    Case("async_mamba_align_pressure", async_scheduling=True, prefix_caching=True, events=True,
         mamba="align", num_blocks=80, max_num_seqs=10, prompt_len=(20, 240), arrival_p=0.5, seed=12),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: Any) -> str:
    return stub_model_dir(tmp_path_factory.mktemp("hybridcache-e2e"))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_scheduler_lockstep(case: Case, model_dir: str) -> None:
    from hybridcache import vllm_tokens

    t0 = time.perf_counter()
    try:
        totals = run_lockstep(case, model_dir)
    finally:
        vllm_tokens.uninstall_token_append()
    # The workload must actually exercise what the configuration is about.
    assert totals["scheduled_tokens"] > 0 and totals["finished"] > 0 and totals["aborted"] > 0
    if case.prefix_caching:
        assert totals["hits"] > 0
    if case.events:
        assert totals["events"] > 0
    if case.num_spec is not None:
        assert totals["spec_tokens"] > 0
    if case.name.endswith("pressure"):
        assert totals["preempted"] > 0
    if case.reset_every:
        assert totals["resets"] > 0
    if case.mamba:
        assert totals["zeroed"] > 0
    if case.kv_metrics is not None:
        assert totals["metric_calls"] > 0
        if case.prefix_caching:
            assert totals["evicted_sampled"] > 0
    if case.vllm_pool_error:
        assert "vllm_pool_error_step" in totals  # the known vLLM 0.23.0 crash, reached
    elif case.connector:
        assert totals["async_loads"] > 0 and totals["load_failures"] > 0
    print(f"{case.name}: {totals} in {time.perf_counter() - t0:.2f}s")


def test_install_uninstall_roundtrip(model_dir: str) -> None:
    import vllm.v1.core.sched.scheduler as sched_mod
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmKVCacheManager

    assert sched_mod.KVCacheManager is VllmKVCacheManager and not hc_vllm.is_installed()
    hc_vllm.install()
    hc_vllm.install()  # idempotent
    try:
        assert sched_mod.KVCacheManager is VllmKVCacheManager023 and hc_vllm.is_installed()
    finally:
        hc_vllm.uninstall()
    hc_vllm.uninstall()  # no-op
    assert sched_mod.KVCacheManager is VllmKVCacheManager and not hc_vllm.is_installed()


def test_plugin_entry_point(monkeypatch: Any) -> None:
    """pyproject declares the entry point; vLLM's own plugin loader, fed that
    entry point, installs hybridcache iff HYBRIDCACHE_ENABLE=1."""
    import importlib.metadata as md
    import tomllib
    from pathlib import Path

    import vllm.plugins as plugins

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    value = pyproject["project"]["entry-points"][plugins.DEFAULT_PLUGINS_GROUP]["hybridcache"]
    assert value == "hybridcache.vllm:register"
    installed = [ep for ep in md.entry_points(group=plugins.DEFAULT_PLUGINS_GROUP) if ep.name == "hybridcache"]
    assert all(ep.value == value for ep in installed)  # present once the package is reinstalled

    ep = md.EntryPoint(name="hybridcache", value=value, group=plugins.DEFAULT_PLUGINS_GROUP)
    monkeypatch.setattr(md, "entry_points", lambda group=None, **kw: md.EntryPoints([ep] if group == ep.group else []))
    monkeypatch.setattr(plugins.envs, "VLLM_PLUGINS", None, raising=False)
    try:
        for env, expect in ((None, False), ("0", False), ("1", True)):
            hc_vllm.uninstall()
            if env is None:
                monkeypatch.delenv(hc_vllm.ENABLE_ENV, raising=False)
            else:
                monkeypatch.setenv(hc_vllm.ENABLE_ENV, env)
            monkeypatch.setattr(plugins, "plugins_loaded", False)
            plugins.load_general_plugins()
            assert hc_vllm.is_installed() is expect, env
    finally:
        hc_vllm.uninstall()


def test_other_vllm_version_is_refused(monkeypatch: Any) -> None:
    monkeypatch.setattr(vllm, "__version__", "0.24.1")
    with pytest.raises(RuntimeError, match=r"0\.23\.0.*0\.24\.1"):
        hc_vllm.install()
    assert not hc_vllm.is_installed()


def test_unsupported_internals_fail_clearly(model_dir: str) -> None:
    s = build_scheduler(Case("views", num_blocks=64), model_dir, hybrid=True)
    m = s.kv_cache_manager
    # Internals that vLLM's tests only read are served as read-only views...
    pool = m.block_pool
    assert len(m.coordinator.single_type_managers) == m.num_kv_cache_groups
    assert dict(m.coordinator.single_type_managers[0].req_to_blocks) == {}
    assert len(pool.cached_block_hash_to_block) == 0 and not pool.cached_block_hash_to_block
    assert len(pool.kv_event_queue) == 0
    head, tail = pool.free_block_queue.fake_free_list_head, pool.free_block_queue.fake_free_list_tail
    walked = []
    node = head.next_free_block
    while node is not tail:
        walked.append(node.block_id)
        assert node.next_free_block.prev_free_block == node
        node = node.next_free_block
    assert walked == [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    assert tail.prev_free_block.block_id == walked[-1] and head.prev_free_block is None
    assert pool.blocks[0].next_free_block is None  # the null block is never free
    # ...but mutating them fails clearly.
    with pytest.raises(AttributeError, match="hybridcache"):
        pool.cached_block_hash_to_block.pop  # noqa: B018
    with pytest.raises(AttributeError, match="hybridcache"):
        pool.cached_block_hash_to_block._cache  # noqa: B018
    with pytest.raises(AttributeError, match="hybridcache"):
        pool.kv_event_queue.append  # noqa: B018
    with pytest.raises(AttributeError, match="hybridcache"):
        pool.get_new_blocks  # noqa: B018
    with pytest.raises(AttributeError, match="hybridcache"):
        m.coordinator.single_type_managers[0].allocate_new_blocks  # noqa: B018
    with pytest.raises(TypeError):
        m.coordinator.single_type_managers[0].req_to_blocks["x"] = []  # type: ignore[index]
    with pytest.raises(NotImplementedError, match="hybridcache"):
        m.block_pool.touch([m.block_pool.blocks[1]])
    assert m.coordinator.block_pool is m.block_pool
    assert not m.block_pool.enable_kv_cache_events and m.block_pool.metrics_collector is None


def test_lockstep_detects_a_divergence(model_dir: str, monkeypatch: Any) -> None:
    """The comparison is live: a manager off by one in one answer is caught."""
    real = VllmKVCacheManager023.get_num_common_prefix_blocks

    def off_by_one(self: Any, request_id: str) -> list[int]:
        return [n + 1 for n in real(self, request_id)]

    monkeypatch.setattr(VllmKVCacheManager023, "get_num_common_prefix_blocks", off_by_one)
    with pytest.raises(Mismatch, match="num_common_prefix_blocks"):
        run_lockstep(Case("mutant", steps=20, num_blocks=500), model_dir)
