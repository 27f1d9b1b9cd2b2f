"""`hybridcache bench --step`: the whole vLLM scheduler step, the step users feel.

A serving team feels `Scheduler.schedule()` plus `Scheduler.update_from_output()`,
run on the CPU while the GPU waits, not the manager's calls alone. This bench
builds the installed vLLM release's own `Scheduler` several times over the same
configuration and drives them in lockstep with one seeded workload and one
simulated model:

- ``stock``: vLLM's `KVCacheManager`, vLLM's Python request block hasher;
- ``hybridcache``: `hybridcache.vllm.install()` without native hashing;
- ``hc+native``: `install()` as shipped: hybridcache's manager, its native
  request block hasher and its native `append_output_token_ids` (what
  `HYBRIDCACHE_ENABLE=1` gives). `install()` puts that method on vLLM's
  `Request` class, which would reach the other variants' requests too, so
  here it is bound to each hc+native request instead (the same native
  function; an instance attribute, a little slower to look up);
- ``floor``: a manager that answers every call from a recording of an earlier
  stock run, in O(1), with vLLM's hasher. It is the least any drop-in manager
  can cost under that scheduler.

Each step the variants run in a rotated order (so machine noise hits all of
them); only `schedule()` and `update_from_output()` are timed, the garbage
collector paused. Every variant's scheduler output and engine outputs must
equal stock's at every step, else the configuration is reported as diverged.

A separate pass with stopwatches around the manager's calls and the token
appends (`step_profile`, not timed) splits each step into the manager,
request block hashing and the rest (vLLM's scheduler code), and times each
manager method in situ, stock's, hybridcache's and the floor's.

This module needs a supported vLLM (the release table's) and torch; `import hybridcache` never loads it.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hybridcache import releases

VARIANTS = ("stock", "hybridcache", "hc+native", "floor")
LAYOUTS = ("full", "full+swa", "full+3xmamba-align")
SLIDING_WINDOW = 128  # tokens, as `hybridcache bench`'s full+swa
STOP_TOKEN_ID = 999
EOS_TOKEN_ID = 50256
_STUB_ARCH = "HybridcacheStubForCausalLM"


@dataclass(frozen=True)
class StepConfig:
    layout: str
    running: int
    steps: int = 300
    warmup: int = 30
    seed: int = 0
    block_size: int = 16
    prompt_len: tuple[int, int] = (64, 512)
    max_tokens: tuple[int, int] = (32, 256)

    @property
    def mamba_groups(self) -> int:
        return 3 if self.layout == "full+3xmamba-align" else 0

    @property
    def sliding_window(self) -> int:
        return SLIDING_WINDOW if self.layout == "full+swa" else 0

    @property
    def num_spec(self) -> int:
        # EAGLE with two drafts on the hybrid layouts, as the table.
        return 2 if self.mamba_groups or self.sliding_window else 0

    @property
    def max_num_batched_tokens(self) -> int:
        # Every running decode fits, plus room for a few prefill chunks.
        return self.running * (1 + self.num_spec) + 2048

    @property
    def max_model_len(self) -> int:
        return self.prompt_len[1] + self.max_tokens[1] + 64

    @property
    def num_blocks(self) -> int:
        per_request = -(-self.max_model_len // self.block_size) + 2
        if self.mamba_groups:
            per_request += self.mamba_groups * (2 + self.num_spec)
        # Room for the running set, the admissions in flight and cached prefixes.
        return int(per_request * (self.running + 64) * 1.1) + 1


class StepBenchUnavailable(RuntimeError):
    """vLLM (or torch) is missing or not a supported release: one line for the user."""


def load_vllm() -> str:
    """The installed vLLM's version (imported quietly), or StepBenchUnavailable
    with the one line the command prints."""
    from hybridcache import releases
    from hybridcache_dev.oracle import vllm_missing

    # The step bench runs the installed release's own Scheduler, stock
    # against install(): any release with a facade will do.
    line = vllm_missing("hybridcache bench --step", accepted=releases.RELEASES)
    if line is not None:
        raise StepBenchUnavailable(line)
    import vllm

    return str(vllm.__version__)


# --------------------------------------------------------------------------
# Scheduler construction (vLLM's tests/v1/core/utils.py create_scheduler,
# with a local config.json naming a registered stub architecture).


_model_dir: str | None = None


def stub_model_dir(root: str | None = None) -> str:
    """A local model folder (config.json only) naming a registered stub
    architecture, so vLLM's ModelConfig resolves offline without model code."""
    global _model_dir
    if _model_dir is None:
        import torch
        from vllm import ModelRegistry

        class HybridcacheStubForCausalLM(torch.nn.Module):
            """Registered so ModelConfig can resolve an architecture; never run."""

            def __init__(self, *, vllm_config: Any = None, prefix: str = "") -> None:
                super().__init__()

            def embed_input_ids(self, input_ids: Any) -> Any:
                return input_ids

            def forward(self, input_ids: Any, positions: Any, intermediate_tensors: Any = None,
                        inputs_embeds: Any = None) -> Any:
                return input_ids

            def compute_logits(self, hidden_states: Any) -> Any:
                return hidden_states

        if _STUB_ARCH not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(_STUB_ARCH, HybridcacheStubForCausalLM)
        d = tempfile.mkdtemp(prefix="hybridcache-stub-model-", dir=root)
        # Made once per process; gone with it (each bench run made one).
        atexit.register(shutil.rmtree, d, ignore_errors=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({
                "architectures": [_STUB_ARCH], "model_type": "opt", "hidden_size": 64,
                "num_attention_heads": 4, "num_hidden_layers": 2, "ffn_dim": 128, "vocab_size": 1024,
                "max_position_embeddings": 8192, "word_embed_proj_dim": 64, "torch_dtype": "float16",
            }, f)
        _model_dir = d
    return _model_dir


def build_scheduler(cfg: StepConfig, variant: str) -> Any:
    """vLLM's own Scheduler for `cfg`, with the manager `variant` names
    (``floor`` is built stock; `FloorManager` replaces its manager later)."""
    import torch
    from vllm.config import (CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig,
                             SpeculativeConfig, VllmConfig)
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec,
                                            SlidingWindowSpec)
    from vllm.v1.structured_output import StructuredOutputManager

    import hybridcache.vllm as hc_vllm

    model_config = ModelConfig(model=stub_model_dir(), dtype="float16", seed=42, skip_tokenizer_init=True,
                               max_model_len=cfg.max_model_len)
    scheduler_config = SchedulerConfig(
        max_num_seqs=cfg.running, max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_model_len=cfg.max_model_len, enable_chunked_prefill=True, is_encoder_decoder=False)
    cache_config = CacheConfig(block_size=cfg.block_size, gpu_memory_utilization=0.9, cache_dtype="auto",
                               enable_prefix_caching=True,
                               mamba_cache_mode="align" if cfg.mamba_groups else "none")
    spec = None
    if cfg.num_spec:
        spec = SpeculativeConfig(method="ngram", num_speculative_tokens=cfg.num_spec)
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config,
                             cache_config=cache_config, parallel_config=ParallelConfig(),
                             speculative_config=spec, device_config=DeviceConfig(device="cpu"))
    if cfg.num_spec:
        vllm_config.speculative_config.method = "eagle"  # the scheduler reads only the method
    bs = cfg.block_size
    groups = [KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1,
                                                           dtype=torch.float32))]
    for i in range(cfg.mamba_groups):
        groups.append(KVCacheGroupSpec([f"mamba{i}"], MambaSpec(
            block_size=bs, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align",
            num_speculative_blocks=cfg.num_spec)))
    if cfg.sliding_window:
        groups.append(KVCacheGroupSpec(["swa"], SlidingWindowSpec(
            block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=cfg.sliding_window)))
    kv_cache_config = KVCacheConfig(num_blocks=cfg.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    if hasattr(kv_cache_config, "prefix_cache_retention_interval"):
        # vLLM's engine copies the cache config's retention (0 by
        # default: sparse, replay boundaries only) into the KV cache config.
        kv_cache_config.prefix_cache_retention_interval = getattr(
            cache_config, "prefix_cache_retention_interval", None)
    cache_config.num_gpu_blocks = cfg.num_blocks
    register_all_kvcache_specs(vllm_config)
    hybrid = variant in ("hybridcache", "hc+native")
    if hybrid:
        hc_vllm.install(native_hashing=False)
    try:
        return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config, block_size=bs,
                         log_stats=True, structured_output_manager=StructuredOutputManager(vllm_config))
    finally:
        if hybrid:
            hc_vllm.uninstall()


def request_block_hasher(cfg: StepConfig, variant: str) -> Any:
    """The hasher vLLM's engine would give each request: vLLM's, or (hc+native)
    the one `install()` makes the engine build."""
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    import hybridcache.vllm as hc_vllm

    init_none_hash(sha256_cbor)
    if variant == "hc+native":
        return hc_vllm.native_request_block_hasher(get_request_block_hasher)(cfg.block_size, sha256_cbor)
    return get_request_block_hasher(cfg.block_size, sha256_cbor)


# --------------------------------------------------------------------------
# Workload and simulated model (one rng, shared by all variants)


@dataclass(frozen=True)
class Arrival:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int


def make_arrivals(cfg: StepConfig) -> Iterator[Arrival]:
    """Endless seeded arrivals; prompts share a few prefixes so caching hits."""
    rng = random.Random(cfg.seed * 7919 + 1)
    prefixes = [[rng.randrange(1, 900) for _ in range(n)] for n in (0, 32, 64, 128)]
    n = 0
    while True:
        prefix = rng.choice(prefixes)
        length = max(rng.randint(*cfg.prompt_len), len(prefix) + 1)
        prompt = prefix + [rng.randrange(1, 900) for _ in range(length - len(prefix))]
        yield Arrival(f"r{n}", tuple(prompt), rng.randint(*cfg.max_tokens))
        n += 1


def make_request(a: Arrival, hasher: Any) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=a.max_tokens, stop_token_ids=[STOP_TOKEN_ID])
    params.update_from_generation_config({}, EOS_TOKEN_ID)
    return Request(request_id=a.request_id, prompt_token_ids=list(a.prompt), sampling_params=params,
                   pooling_params=None, arrival_time=0.0, block_hasher=hasher)


def simulate_model(so: Any, sched: Any, rng: random.Random) -> Any:
    """One sampled token per decode plus 0..all accepted drafts; nothing for a
    prefill chunk."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids: list[str] = []
    sampled: list[list[int]] = []
    for rid in so.num_scheduled_tokens:
        req_ids.append(rid)
        if sched.requests[rid].is_prefill_chunk:
            sampled.append([])
            continue
        drafts = so.scheduled_spec_decode_tokens.get(rid, [])
        accepted = rng.randint(0, len(drafts)) if drafts else 0
        sampled.append([rng.randrange(1, 900) for _ in range(accepted + 1)])
    return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled, **_index_of(ModelRunnerOutput, req_ids))


def _index_of(output_cls: Any, req_ids: list[str]) -> dict[str, Any]:
    """`req_id_to_index` where the release's `ModelRunnerOutput` has it
    (gone in 0.34.0: the scheduler indexes `req_ids`)."""
    import inspect

    if "req_id_to_index" not in inspect.signature(output_cls).parameters:
        return {}
    return {"req_id_to_index": {r: i for i, r in enumerate(req_ids)}}


def propose_drafts(cfg: StepConfig, so: Any, sched: Any, rng: random.Random) -> Any:
    from vllm.v1.outputs import DraftTokenIds

    if not cfg.num_spec:
        return None
    ids = [rid for rid in so.num_scheduled_tokens if rid in sched.requests]
    return DraftTokenIds(ids, [[rng.randrange(1, 900) for _ in range(cfg.num_spec)] for _ in ids])


def norm_output(so: Any) -> tuple[Any, ...]:
    c = so.scheduled_cached_reqs
    return (
        [(r.req_id, [list(g) for g in r.block_ids], r.num_computed_tokens) for r in so.scheduled_new_reqs],
        list(c.req_ids),
        [None if b is None else [list(g) for g in b] for b in c.new_block_ids],
        list(c.num_computed_tokens),
        list(so.num_scheduled_tokens.items()),
        sorted((k, list(v)) for k, v in so.scheduled_spec_decode_tokens.items()),
        list(getattr(so, "num_common_prefix_blocks", ())),  # gone in 0.34.0
        sorted(so.preempted_req_ids),
        sorted(so.finished_req_ids),
        so.new_block_ids_to_zero,
    )


def norm_engine(outs: dict[int, Any]) -> list[Any]:
    result = []
    for client in sorted(outs):
        eco = outs[client]
        s = eco.scheduler_stats
        result.append((client, [(o.request_id, list(o.new_token_ids), o.finish_reason) for o in eco.outputs],
                       None if s is None else (s.num_running_reqs, s.num_waiting_reqs, s.kv_cache_usage,
                                               vars(s.prefix_cache_stats))))
    return result


# --------------------------------------------------------------------------
# The lockstep driver


class Diverged(AssertionError):
    """A variant's scheduler output differs from stock's."""


class Lockstep:
    """vLLM Schedulers, one per variant, driven by one workload and one model.
    The first variant is the reference the others are checked against."""

    def __init__(self, cfg: StepConfig, variants: Sequence[str], recording: Any = None,
                 wrap: Callable[[str, Any], None] | None = None) -> None:
        from hybridcache_dev.step_floor import FloorManager
        from hybridcache.vllm_tokens import token_append_descriptor

        self.cfg = cfg
        self.variants = tuple(variants)
        self.scheds = {v: build_scheduler(cfg, v) for v in self.variants}
        self.hashers = {v: request_block_hasher(cfg, v) for v in self.variants}
        # install()'s native append, bound to each hc+native request (see the
        # module's docstring); None without the binding's raw-ffi feature.
        self.token_append = token_append_descriptor() if "hc+native" in self.variants else None
        if "floor" in self.scheds:
            self.scheds["floor"].kv_cache_manager = FloorManager(recording)
        if wrap is not None:
            for v, s in self.scheds.items():
                wrap(v, s)
        self.arrivals = make_arrivals(cfg)
        self.rng = random.Random(cfg.seed * 104729 + 17)
        self.clock = time.perf_counter_ns

    def _admit(self) -> None:
        ref = self.scheds[self.variants[0]]
        # Keep the running set full, with a short queue of admissions waiting.
        for _ in range(self.cfg.running + max(4, self.cfg.running // 16) - len(ref.requests)):
            a = next(self.arrivals)
            for v, s in self.scheds.items():
                r = make_request(a, self.hashers[v])
                if v == "hc+native" and self.token_append is not None:
                    # vLLM's Request has 40-50 attributes, past the shared
                    # keys' 30: every instance has its own dict already, and
                    # one more key leaves the others' attribute caches alone.
                    r.append_output_token_ids = self.token_append.__get__(r, type(r))
                s.add_request(r)

    def step(self, i: int, check: bool = True) -> dict[str, int]:
        """One scheduler step of every variant; ns spent in schedule() +
        update_from_output() per variant."""
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

        self._admit()
        clock = self.clock
        k = i % len(self.variants)
        order = self.variants[k:] + self.variants[:k]
        ns: dict[str, int] = {}
        outs: dict[str, Any] = {}
        for v in order:
            sched = self.scheds[v]
            t0 = clock()
            outs[v] = sched.schedule()
            ns[v] = clock() - t0
        ref_v = self.variants[0]
        ref = self.scheds[ref_v]
        if check:
            want = norm_output(outs[ref_v])
            for v in self.variants[1:]:
                if norm_output(outs[v]) != want:
                    raise Diverged(f"step {i}: {v}'s scheduler output differs from {ref_v}'s")
        model = simulate_model(outs[ref_v], ref, self.rng)
        drafts = propose_drafts(self.cfg, outs[ref_v], ref, self.rng) if self.cfg.num_spec else None
        engine: dict[str, Any] = {}
        for v in order:
            mro = ModelRunnerOutput(req_ids=list(model.req_ids), sampled_token_ids=[list(t) for t in model.sampled_token_ids],
                                    **_index_of(ModelRunnerOutput, list(model.req_ids)))
            sched = self.scheds[v]
            t0 = clock()
            engine[v] = sched.update_from_output(outs[v], mro)
            ns[v] += clock() - t0
        if check:
            want_e = norm_engine(engine[ref_v])
            for v in self.variants[1:]:
                if norm_engine(engine[v]) != want_e:
                    raise Diverged(f"step {i}: {v}'s engine outputs differ from {ref_v}'s")
        if drafts is not None:
            # Drafts of requests that finished in this update are dropped.
            live = [(rid, d) for rid, d in zip(drafts.req_ids, drafts.draft_token_ids) if rid in ref.requests]
            for v in order:
                self.scheds[v].update_draft_token_ids(
                    DraftTokenIds([rid for rid, _ in live], [list(d) for _, d in live]))
        return ns


def record_stock(cfg: StepConfig) -> Any:
    """An untimed stock run of cfg.warmup + cfg.steps steps; its manager's answers."""
    from hybridcache_dev.step_floor import RecordingManager

    recorder: list[Any] = []

    def wrap(v: str, s: Any) -> None:
        s.kv_cache_manager = RecordingManager(s.kv_cache_manager)
        recorder.append(s.kv_cache_manager)

    run = Lockstep(cfg, ["stock"], wrap=wrap)
    for i in range(cfg.warmup + cfg.steps):
        run.step(i, check=False)
    return recorder[0]


def timed_run(cfg: StepConfig, variants: Sequence[str] = VARIANTS, recording: Any = None) -> dict[str, list[int]]:
    """ns per step per variant over cfg.steps steps after cfg.warmup untimed
    ones (the floor answers from `recording`, else from a new stock run)."""
    if recording is None and "floor" in variants:
        recording = record_stock(cfg)
    run = Lockstep(cfg, variants, recording)
    samples: dict[str, list[int]] = {v: [] for v in variants}
    for i, ns in gc_paused_steps(run, cfg.warmup + cfg.steps):
        if i >= cfg.warmup:
            for v, t in ns.items():
                samples[v].append(t)
    return samples


def gc_paused_steps(run: Lockstep, n: int,
                    before: Callable[[int], None] | None = None) -> Iterator[tuple[int, dict[str, int]]]:
    """Steps 0..n-1 of `run` as (i, ns per variant), `before(i)` called
    ahead of each. The garbage collector is paused and run every 16 steps,
    between steps: a collection inside a step lands on whichever variant
    happens to allocate then, and the heap here (recordings, four
    schedulers) makes a full one cost hundreds of ms."""
    gc.collect()
    gc.disable()
    try:
        for i in range(n):
            if before is not None:
                before(i)
            yield i, run.step(i)
            if i % 16 == 15:
                gc.collect()
    finally:
        gc.enable()


# --------------------------------------------------------------------------
# The command


def _pct(xs: list[int], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] / 1000.0


def run_config(cfg: StepConfig, profile: bool = True) -> dict[str, Any]:
    recording = record_stock(cfg)
    samples = timed_run(cfg, VARIANTS, recording)
    row: dict[str, Any] = {"layout": cfg.layout, "running": cfg.running, "steps": cfg.steps, "verified": True}
    for v in VARIANTS:
        row[v] = {"p50_us": _pct(samples[v], 0.5), "p90_us": _pct(samples[v], 0.9),
                  "mean_us": statistics.fmean(samples[v]) / 1000.0}
    p50 = {v: row[v]["p50_us"] for v in VARIANTS}
    row["ratios"] = {
        "stock/hybridcache": p50["stock"] / p50["hybridcache"],
        "stock/hc+native": p50["stock"] / p50["hc+native"],
        "hybridcache/floor": p50["hybridcache"] / p50["floor"],
        "hc+native/floor": p50["hc+native"] / p50["floor"],
    }
    if profile:
        from hybridcache_dev.step_profile import profile_step

        # Stock's calls too: what each manager call costs vLLM, beside ours.
        prof = profile_step(cfg, ("stock", "hybridcache", "hc+native"), recording=recording)
        row["shares"], row["manager_calls"], row["manager_totals"] = prof
    return row


def configs(quick: bool, running: Sequence[int] | None = None, layouts: Sequence[str] | None = None,
            steps: int | None = None) -> list[StepConfig]:
    running = running or ((64, 256) if quick else (64, 256, 1024))
    n = steps or (60 if quick else 300)
    out = []
    for layout in layouts or LAYOUTS:
        for r in running:
            probe = StepConfig(layout, r)
            # Enough steps to prefill the whole running set, then some.
            avg_prompt = sum(probe.prompt_len) // 2
            warmup = -(-r * avg_prompt // probe.max_num_batched_tokens) + 20
            out.append(StepConfig(layout, r, steps=n, warmup=warmup))
    return out


def format_rows(rows: list[dict[str, Any]], vllm_version: str) -> str:
    from hybridcache.bench_report import binding_text

    lines = [
        f"Whole scheduler step (vLLM {vllm_version} Scheduler.schedule + update_from_output), us per step, p50 / p90; "
        f"hybridcache's {binding_text()}.",
        "stock = vLLM's manager and hasher; hybridcache = install(native_hashing=False); "
        "hc+native = install() (native request block hashing); floor = a manager answering from a recording "
        "in O(1) (the least any drop-in manager costs). Every variant's schedule checked identical to stock's.",
        "",
        f"{'layout':<20} {'run':>5} {'stock':>15} {'hybridcache':>15} {'hc+native':>15} {'floor':>15} "
        f"{'stock/hc':>9} {'hc/floor':>9} {'nat/floor':>9} {'stock/nat':>9}",
    ]
    for r in rows:
        cells = " ".join(f"{r[v]['p50_us']:>7.0f}/{r[v]['p90_us']:<7.0f}" for v in VARIANTS)
        q = r["ratios"]
        lines.append(f"{r['layout']:<20} {r['running']:>5} {cells} {q['stock/hybridcache']:>9.2f} "
                     f"{q['hybridcache/floor']:>9.2f} {q['hc+native/floor']:>9.2f} {q['stock/hc+native']:>9.2f}")
    if any("shares" in r for r in rows):
        lines += ["", "Where the step goes (profiled pass, not timed): manager / token appends with their "
                      "block hashing / vLLM's scheduler code"]
        for r in rows:
            s = r.get("shares")
            if not s:
                continue
            cells = "   ".join(f"{v}: {s[v]['manager']:5.1%} / {s[v]['hashing']:5.1%} / {s[v]['scheduler']:5.1%}"
                               for v in s)
            lines.append(f"{r['layout']:<20} {r['running']:>5}   {cells}")
    if any("manager_calls" in r for r in rows):
        from hybridcache_dev.step_profile import excess_over_floor, excess_split

        lines += ["", "Where hybridcache's manager calls cost more than the floor's (profiled pass, in situ): "
                      "method, calls per step, ns per call stock / hybridcache / floor, us per step over the floor"]
        for r in rows:
            if "manager_calls" not in r:
                continue
            stock = r["manager_calls"].get("stock", {})
            cells = "; ".join(
                f"{name} x{n:.1f} {stock.get(name, {}).get('ns_per_call', 0):.0f}/{mine:.0f}/{base:.0f} {over:+.1f}"
                for name, n, mine, base, over in excess_over_floor(r["manager_calls"]))
            lines.append(f"{r['layout']:<20} {r['running']:>5}   {cells}")
        lines += ["", "hybridcache's step over the floor's (profiled pass), us per step: in all = inside the "
                      "manager's calls + outside them (vLLM's own code, slower or faster around the calls)"]
        for r in rows:
            if "manager_totals" not in r:
                continue
            over, inside, outside = excess_split(r["manager_totals"])
            lines.append(f"{r['layout']:<20} {r['running']:>5}   {over:+.0f} = {inside:+.0f} inside "
                         f"{outside:+.0f} outside (floor's step {r['manager_totals']['floor']['step_us']:.0f})")
    return "\n".join(lines)


def main(args: Any) -> int:
    try:
        version = load_vllm()
    except StepBenchUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    from hybridcache.tools.oracle import quiet_logs

    with quiet_logs():
        return _run(args, version)


# The layouts each release's facade covers (`releases.Release.layouts`, one
# table for every tool; a release not listed covers them all).
RELEASE_LAYOUTS: dict[str, tuple[str, ...]] = {
    r.version: r.layouts for r in releases.RELEASES if r.layouts is not None
}


def _run(args: Any, version: str) -> int:
    rows = []
    running = getattr(args, "running", None)
    if isinstance(running, str):
        running = [int(x) for x in running.split(",") if x.strip()]
    layouts = getattr(args, "layouts", None)
    covered = RELEASE_LAYOUTS.get(version.split("+")[0])
    if covered is not None:
        wanted = layouts or LAYOUTS
        if any(lay not in covered for lay in wanted):
            print(f"hybridcache bench --step: vLLM {version}: hybridcache's facade covers the layouts "
                  f"{', '.join(covered)} (not {', '.join(lay for lay in wanted if lay not in covered)})",
                  file=sys.stderr)
        layouts = [lay for lay in wanted if lay in covered]
    for cfg in configs(getattr(args, "quick", False), running, layouts,
                       getattr(args, "steps", None)):
        try:
            rows.append(run_config(cfg, profile=not getattr(args, "no_profile", False)))
        except Diverged as e:
            print(f"hybridcache bench --step: {cfg.layout} at {cfg.running} running DIVERGED: {e}", file=sys.stderr)
            return 1
        if not getattr(args, "json", False):
            print(f"  done: {cfg.layout} at {cfg.running} running", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"vllm": version, "rows": rows}, indent=2))
    else:
        print(format_rows(rows, version))
    return 0
