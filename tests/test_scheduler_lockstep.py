"""The installed vLLM's own `Scheduler` and `AsyncScheduler` (0.33.0 and
0.34.0: the releases running the partial-block-hits profile), built twice per
configuration — stock, and after `hybridcache.vllm.install()` — and driven in
lockstep by the same seeded workload and simulated model outputs (sampled
tokens, accepted and rejected drafts whose count changes every step, stop
tokens, aborts, prefix-cache resets, a pool small enough to preempt). Every
step compares what the scheduler hands out (scheduled requests, token counts,
block ids, preemptions, finished ids, blocks to zero, copy-on-write copies),
the engine-core outputs with their prefix-cache stats, and the manager's
pool: free count, usage and free-queue order. hybridcache's side hashes
request blocks with the native hasher `install()` gives vLLM's engine.

Some requests skip the prefix cache or (0.34.0) bound their hits
(`prefix_cache_hit_limit`), as the release's row names the request
attribute (`read_gate`); where the release's scheduler has cache-aware
admission (0.34.0), one case turns it on, so `get_num_cached_tokens`
reorders admissions.

The schedulers come from the installed release's own test helper
(`create_scheduler` in its tests/v1/core/utils.py, fetched by
`scripts/fetch_vllm_tests.sh VERSION`), with its offline model config.
"""

from __future__ import annotations

import inspect
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.vllm("0.33.0", "0.34.0")

ROOT = Path(__file__).resolve().parents[1]
HF_HOME = ROOT / ".cache" / "vllm-tests" / "hf-home"


def _installed() -> Any:
    """The installed release's row."""
    from importlib import metadata

    from hybridcache import releases

    return releases.require(metadata.version("vllm"), "the scheduler lock-step")
STOP = 999


@dataclass(frozen=True)
class Case:
    name: str
    caching: bool = True
    async_scheduling: bool = False
    num_spec: int | None = None
    num_blocks: int = 60
    steps: int = 160
    seed: int = 0
    # "full": one full-attention group (the helper's); "full_sw": plus a
    # sliding-window group; "sw": a sliding-window group alone;
    # "full_chunked": plus a chunked local group (chunk `window`);
    # "full_mamba": plus a Mamba group (`mamba_mode`, one speculative block
    # per draft token, as vLLM sizes it); "mamba": a Mamba group alone;
    # "full_chunked_mamba": full, chunked local and Mamba.
    layout: str = "full"
    mamba_mode: str = "none"
    # MambaSpec.prefill_checkpoint_alignment with one checkpoint block (0.29+).
    mamba_checkpoint: int | None = None
    window: int = 24
    # KVCacheConfig.prefix_cache_retention_interval (0: the serving default).
    retention: int | None = None
    # Cache-aware admission's window (where the release's scheduler has it).
    admission_window: int = 0


CASES = [
    Case("caching"),
    Case("no-caching", caching=False),
    Case("spec-dynamic-drafts", num_spec=3, seed=1),
    Case("async", async_scheduling=True, seed=2),
    Case("async-spec", async_scheduling=True, num_spec=2, seed=3),
    Case("preemption-storm", num_blocks=24, seed=4),
    Case("full-swa-dense", layout="full_sw", seed=6),
    Case("full-swa-retention0", layout="full_sw", retention=0, seed=7),
    Case("full-swa-retention32-async-spec", layout="full_sw", retention=32, async_scheduling=True, num_spec=2,
         window=40, seed=8),
    Case("swa-retention0-async", layout="sw", retention=0, async_scheduling=True, seed=9),
    Case("full-swa-storm", layout="full_sw", retention=0, num_blocks=34, window=17, seed=10),
    Case("full-chunked-async", layout="full_chunked", window=32, async_scheduling=True, seed=11),
    Case("full-mamba-none-spec", caching=False, layout="full_mamba", num_spec=2, seed=12),
    Case("full-mamba-align-async-spec", caching=False, layout="full_mamba", mamba_mode="align",
         async_scheduling=True, num_spec=2, seed=13),
    Case("full-mamba-align-storm", caching=False, layout="full_mamba", mamba_mode="align", num_blocks=36, seed=14),
    Case("full-mamba-align-checkpoints-spec", caching=False, layout="full_mamba", mamba_mode="align", num_spec=2,
         mamba_checkpoint=1, seed=15),
    # Mamba align with prefix caching (its block one hash block): states
    # cached at block boundaries, sparse retention, alone and beside
    # chunked local attention.
    Case("full-mamba-align-caching-spec", layout="full_mamba", mamba_mode="align", num_spec=2, seed=16),
    Case("full-mamba-align-caching-async-retention0", layout="full_mamba", mamba_mode="align",
         async_scheduling=True, retention=0, seed=17),
    Case("full-mamba-align-caching-storm", layout="full_mamba", mamba_mode="align", num_blocks=36, seed=18),
    Case("mamba-align-caching", layout="mamba", mamba_mode="align", seed=19),
    Case("full-chunked-mamba-caching-async", layout="full_chunked_mamba", mamba_mode="align", window=32,
         async_scheduling=True, seed=20),
    # Cache-aware admission (0.34.0): past half usage the first waiting
    # requests are reordered by the manager's get_num_cached_tokens.
    Case("cache-aware-admission", num_blocks=40, admission_window=4, seed=21),
    Case("cache-aware-admission-async", num_blocks=40, admission_window=3, async_scheduling=True, seed=22),
]


@pytest.fixture(scope="module")
def helpers() -> Any:
    version = _installed().version
    tests = ROOT / ".cache" / "vllm-tests" / version
    if not (tests / "tests" / "v1" / "core" / "utils.py").is_file():
        pytest.skip(f"vLLM {version}'s tests not fetched ({tests}): run `bash scripts/fetch_vllm_tests.sh {version}`")
    if not HF_HOME.is_dir():
        pytest.skip(f"the offline model configs are missing ({HF_HOME}): run scripts/run_vllm_peer_tests.py once")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    platforms = sys.modules.get("vllm.platforms")
    current = getattr(platforms, "_current_platform", None)
    if current is not None and not current.is_cpu() and os.environ["VLLM_TARGET_DEVICE"] == "cpu":
        # An earlier test resolved vLLM's platform without a device to find
        # (no GPU, no target set): resolved again, now as the CPU's.
        platforms._current_platform = None  # type: ignore[union-attr]
    os.environ["HF_HOME"] = str(HF_HOME)
    os.environ["HF_HUB_OFFLINE"] = "1"
    if "huggingface_hub" in sys.modules:
        # Imported by an earlier test: its cache paths were read from the
        # environment then; point them at the offline model configs too.
        from huggingface_hub import constants

        offline = {"HF_HOME": str(HF_HOME), "HF_HUB_CACHE": str(HF_HOME / "hub"), "HF_HUB_OFFLINE": True}
        for name, value in offline.items():
            setattr(constants, name, value)
    sys.path.insert(0, str(tests))
    try:
        from tests.v1.core import utils
    finally:
        sys.path.remove(str(tests))
    return utils


def _layout(case: Case, make_config: Any) -> Any:
    """The helper's KVCacheConfig class, wrapped to give `case`'s groups and
    retention interval (the helper builds one full-attention group)."""
    from vllm.v1 import kv_cache_interface as iface

    def make(num_blocks: int, kv_cache_tensors: Any, kv_cache_groups: Any) -> Any:
        full = kv_cache_groups[0]
        sw = iface.SlidingWindowSpec(block_size=full.kv_cache_spec.block_size, num_kv_heads=1, head_size=1,
                                     dtype=full.kv_cache_spec.dtype, sliding_window=case.window)
        chunked = iface.ChunkedLocalAttentionSpec(block_size=full.kv_cache_spec.block_size, num_kv_heads=1,
                                                  head_size=1, dtype=full.kv_cache_spec.dtype,
                                                  attention_chunk_size=case.window)
        mamba = iface.MambaSpec(block_size=full.kv_cache_spec.block_size, shapes=((1, 1),),
                                dtypes=(full.kv_cache_spec.dtype,), mamba_cache_mode=case.mamba_mode,
                                num_speculative_blocks=case.num_spec or 0,
                                num_prefill_checkpoint_blocks=int(case.mamba_checkpoint is not None),
                                prefill_checkpoint_alignment=case.mamba_checkpoint)
        groups = {"full": [full], "sw": [iface.KVCacheGroupSpec(["swa"], sw)],
                  "full_mamba": [full, iface.KVCacheGroupSpec(["mamba"], mamba)],
                  "full_sw": [full, iface.KVCacheGroupSpec(["swa"], sw)],
                  "full_chunked": [full, iface.KVCacheGroupSpec(["chunked"], chunked)],
                  "mamba": [iface.KVCacheGroupSpec(["mamba"], mamba)],
                  "full_chunked_mamba": [full, iface.KVCacheGroupSpec(["chunked"], chunked),
                                         iface.KVCacheGroupSpec(["mamba"], mamba)]}[case.layout]
        return make_config(num_blocks=num_blocks, kv_cache_tensors=kv_cache_tensors, kv_cache_groups=groups,
                           prefix_cache_retention_interval=case.retention)

    return make


def _scheduler(helpers: Any, case: Case, hybrid: bool) -> Any:
    import hybridcache.vllm as hc_vllm

    extra = {}
    if case.admission_window:
        if "cache_aware_admission_window" not in inspect.signature(helpers.create_scheduler).parameters:
            pytest.skip("this release's scheduler has no cache-aware admission")
        extra = dict(cache_aware_admission_window=case.admission_window, cache_aware_admission_threshold=0.3)
    if hybrid:
        hc_vllm.install()
    make_config = helpers.KVCacheConfig
    helpers.KVCacheConfig = _layout(case, make_config)
    try:
        sched = helpers.create_scheduler(
            enable_prefix_caching=case.caching,
            num_blocks=case.num_blocks,
            block_size=16,
            max_num_seqs=8,
            max_num_batched_tokens=128,
            max_model_len=512,
            num_speculative_tokens=case.num_spec,
            speculative_method=("ngram_gpu" if case.async_scheduling else "ngram") if case.num_spec else None,
            async_scheduling=case.async_scheduling,
            **extra,
        )
        # The scheduler reads the cache mode from its CacheConfig (the
        # helper's has vLLM's default); align prefills end on block boundaries.
        sched.cache_config.mamba_cache_mode = case.mamba_mode
        sched.need_mamba_block_aligned_split = sched.has_mamba_layers and case.mamba_mode == "align"
        return sched
    finally:
        helpers.KVCacheConfig = make_config
        if hybrid:
            hc_vllm.uninstall()


def _requests(case: Case, native: bool) -> dict[int, list[Any]]:
    """Arrivals per step; prompts share prefixes so the cache hits."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    import hybridcache.vllm as hc_vllm

    init_none_hash(sha256)

    # hybridcache's side: the engine's hasher under install(), which also puts
    # the native append_output_token_ids on vLLM's Request (a class
    # attribute, so stock's requests, hashed in Python, take its path for
    # other hashers; tests/test_token_append.py pins both against vLLM's method).
    factory = (hc_vllm.native_request_block_hasher(get_request_block_hasher, token_append=True) if native
               else get_request_block_hasher)
    rng = random.Random(case.seed)
    # Requests that skip the prefix cache or bound their hits, drawn apart
    # (the workload's draws stay the same): the request attribute the
    # release's row names (`read_gate`).
    gate, rng_gate = _installed().read_gate, random.Random(case.seed + 300)
    prefixes = [[rng.randrange(1, 900) for _ in range(n)] for n in (0, 16, 40, 64)]
    plan: dict[int, list[Any]] = {}
    n = 0
    for step in range(case.steps):
        for _ in range(3 if step == 0 else int(rng.random() < 0.4)):
            prefix = rng.choice(prefixes)
            prompt = prefix + [rng.randrange(1, 900) for _ in range(rng.randint(1, 90))]
            params = SamplingParams(max_tokens=rng.randint(2, 40), stop_token_ids=[STOP])
            params.update_from_generation_config({}, 50256)
            request = Request(
                request_id=f"r{n}", prompt_token_ids=prompt, sampling_params=params, pooling_params=None,
                arrival_time=float(step), block_hasher=factory(16, sha256))
            if rng_gate.random() < 0.15:
                skip = rng_gate.random() < 0.3
                setattr(request, gate, skip if gate == "skip_reading_prefix_cache"
                        else 0 if skip else rng_gate.randint(1, len(prompt)))
            plan.setdefault(step, []).append(request)
            n += 1
    return plan


def _norm(so: Any) -> dict[str, Any]:
    c = so.scheduled_cached_reqs
    return {
        "new": [(r.req_id, [list(g) for g in r.block_ids], r.num_computed_tokens) for r in so.scheduled_new_reqs],
        "cached": list(c.req_ids),
        # Gone in 0.34.0 (a resumed request is sent again in full).
        "resumed": sorted(getattr(c, "resumed_req_ids", ())),
        "new_block_ids": [None if b is None else [list(g) for g in b] for b in c.new_block_ids],
        "computed": list(c.num_computed_tokens),
        "tokens": sorted(so.num_scheduled_tokens.items()),
        "spec": sorted((k, list(v)) for k, v in so.scheduled_spec_decode_tokens.items()),
        "preempted": sorted(so.preempted_req_ids or ()),
        "finished": sorted(so.finished_req_ids),
        "zero": so.new_block_ids_to_zero,
        "copies": so.kv_cache_block_copies,
    }


def _norm_outputs(outs: dict[int, Any]) -> list[Any]:
    import dataclasses

    result = []
    for client in sorted(outs):
        eco = outs[client]
        stats = eco.scheduler_stats
        result.append((
            [(o.request_id, list(o.new_token_ids), o.finish_reason) for o in eco.outputs],
            None if stats is None else (stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage,
                                        dataclasses.asdict(stats.prefix_cache_stats)),
        ))
    return result


def _pool(s: Any) -> tuple[Any, ...]:
    m = s.kv_cache_manager
    queue = m.free_queue() if hasattr(m, "free_queue") else [
        b.block_id for b in m.block_pool.free_block_queue.get_all_free_blocks()]
    return m.block_pool.get_num_free_blocks(), m.usage, queue


def _model_output(so: Any, sched: Any, rng: random.Random) -> Any:
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids, sampled = [], []
    for rid in so.num_scheduled_tokens:
        req = sched.requests[rid]
        req_ids.append(rid)
        if req.num_computed_tokens + so.num_scheduled_tokens[rid] < req.num_prompt_tokens:
            sampled.append([])  # a prefill chunk samples nothing
            continue
        drafts = so.scheduled_spec_decode_tokens.get(rid, [])
        accepted = rng.randint(0, len(drafts)) if drafts else 0
        sampled.append([STOP if rng.random() < 0.03 else rng.randrange(1, 900) for _ in range(accepted + 1)])
    # `req_id_to_index` is gone in 0.34.0 (the scheduler indexes req_ids).
    index = ({"req_id_to_index": {r: i for i, r in enumerate(req_ids)}}
             if "req_id_to_index" in inspect.signature(ModelRunnerOutput).parameters else {})
    return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled, **index)


def _drafts(case: Case, so: Any, sched: Any, rng: random.Random) -> Any:
    from vllm.v1.outputs import DraftTokenIds

    ids, drafts = [], []
    for rid in so.num_scheduled_tokens:
        req = sched.requests.get(rid)
        if req is None or req.is_finished():
            continue
        ids.append(rid)
        # Suffix-decoding style: the count changes every round (vLLM #39271).
        drafts.append([rng.randrange(1, 900) for _ in range(rng.choice([0, 1, case.num_spec, rng.randint(0, case.num_spec)]))])
    return DraftTokenIds(ids, drafts)


def run_lockstep(helpers: Any, case: Case) -> dict[str, int]:
    from vllm.v1.request import RequestStatus

    stock, hc = _scheduler(helpers, case, False), _scheduler(helpers, case, True)
    assert type(hc.kv_cache_manager).__name__ == _installed().facade
    # Within CPython's shared keys: the scheduler's lookups on it specialize
    # (tests/test_bound_allocate.py).
    assert len(vars(hc.kv_cache_manager)) < 30, sorted(vars(hc.kv_cache_manager))
    groups = stock.kv_cache_config.kv_cache_groups
    assert [type(g.kv_cache_spec).__name__ for g in groups] == [
        {"full": "FullAttentionSpec", "sw": "SlidingWindowSpec", "chunked": "ChunkedLocalAttentionSpec",
         "mamba": "MambaSpec"}[k]
        for k in case.layout.split("_")]
    assert stock.kv_cache_manager.coordinator.retention_interval == case.retention
    assert type(stock.kv_cache_manager).__module__.startswith("vllm.")
    probes = [[], []]
    if case.admission_window:
        # Both managers' probe answers, in order (cache-aware admission).
        for side, s in zip(probes, (stock, hc)):
            probe = s.kv_cache_manager.get_num_cached_tokens
            s.kv_cache_manager.get_num_cached_tokens = (
                lambda request, probe=probe, side=side: side.append((request.request_id, probe(request))) or side[-1][1])
    plans = _requests(case, native=False), _requests(case, native=True)
    rng_model, rng_events = random.Random(case.seed + 100), random.Random(case.seed + 200)
    seen = {"steps": 0, "tokens": 0, "hit_tokens": 0, "preempted": 0, "finished": 0, "drafts": 0,
            "window_frees": 0}
    kinds = case.layout.split("_")
    sw_group = next((i for i, k in enumerate(kinds) if k in ("sw", "chunked", "mamba")), None)
    for step in range(case.steps):
        for s, plan in zip((stock, hc), plans):
            for r in plan.get(step, ()):
                s.add_request(r)
        outs = [s.schedule() for s in (stock, hc)]
        a, b = (_norm(o) for o in outs)
        assert a == b, f"[{case.name}] step {step}: scheduler outputs differ\n vllm: {a}\n hc:   {b}"
        seen["tokens"] += sum(n for _, n in a["tokens"])
        seen["hit_tokens"] += sum(n for _, _, n in a["new"])
        seen["preempted"] += len(a["preempted"])
        seen["finished"] += len(a["finished"])
        seen["drafts"] += sum(len(d) for _, d in a["spec"])
        seed = rng_model.random()
        results = []
        for s, so in zip((stock, hc), outs):
            out = _model_output(so, s, random.Random(seed))
            results.append(_norm_outputs(s.update_from_output(so, out)))
            if case.num_spec:
                s.update_draft_token_ids(_drafts(case, so, s, random.Random(seed + 1)))
        assert results[0] == results[1], f"[{case.name}] step {step}: engine outputs differ"
        assert _pool(stock) == _pool(hc), f"[{case.name}] step {step}: pools differ"
        assert probes[0] == probes[1], f"[{case.name}] step {step}: get_num_cached_tokens answers differ"
        if rng_events.random() < 0.05 and stock.running:
            victim = rng_events.choice(sorted(r.request_id for r in stock.running))
            for s in (stock, hc):
                s.finish_requests([victim], RequestStatus.FINISHED_ABORTED)
        if rng_events.random() < 0.02:
            assert stock.reset_prefix_cache() == hc.reset_prefix_cache()
        hc.kv_cache_manager.check_invariants()
        if sw_group is not None:
            # Running requests whose window (or chunk) left blocks behind.
            seen["window_frees"] += sum(
                0 in stock.kv_cache_manager.get_block_ids(r.request_id)[sw_group] for r in stock.running)
        seen["steps"] += 1
    seen["probes"] = len(probes[1])
    seen["probe_hits"] = sum(1 for _, n in probes[1] if n)
    return seen


def _raw_ffi() -> bool:
    """Whether the binding has its raw entry points (the safe build's bound
    hasher is the hasher itself, and it has no native append)."""
    from hybridcache._native import BlockHasher

    return not isinstance(BlockHasher("sha256", 4, b"\0" * 32)._bound_call(), BlockHasher)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_scheduler_lockstep(helpers: Any, case: Case) -> None:
    from hybridcache import vllm_tokens

    try:
        seen = run_lockstep(helpers, case)
        assert vllm_tokens.token_append_installed() == _raw_ffi()
    finally:
        vllm_tokens.uninstall_token_append()
    print(case.name, seen)
    assert seen["steps"] == case.steps and seen["tokens"] > 1000 and seen["finished"] > 10
    # What each case is there for happened.
    assert seen["hit_tokens"] > 0 if case.caching else seen["hit_tokens"] == 0
    if case.num_spec:
        assert seen["drafts"] > 0
    if case.name.endswith("storm"):
        assert seen["preempted"] > 0
    if case.layout != "full":
        assert seen["window_frees"] > 0
    if case.admission_window:
        assert seen["probe_hits"] > 0


def test_lockstep_detects_a_divergence(helpers: Any, monkeypatch: Any) -> None:
    """The harness can fail: a manager that hands blocks out in another
    order is caught."""
    facade = _installed().facade_class()
    original = facade.get_computed_blocks

    def no_hits(self: Any, request: Any, max_cache_hit_length: Any = None) -> Any:
        blocks, _, _ = original(self, request, 0)
        return blocks, 0, 0

    monkeypatch.setattr(facade, "get_computed_blocks", no_hits)
    with pytest.raises(AssertionError, match="differ"):
        run_lockstep(helpers, Case("detect", steps=120, seed=5))
