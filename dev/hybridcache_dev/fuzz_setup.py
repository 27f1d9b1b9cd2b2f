"""The long fuzz's configurations and bookkeeping: the spec mixes, a random
setup of a mix that every supported vLLM accepts (`random_setup`), the managers built
from it (through `configs`, the one config builder), the exceptions that
classify a finding, the chooser interface the driver draws from, and the
figures a run counts."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from hybridcache import releases

from . import configs
from .configs import GroupSpec

MIXES = ("full", "sw", "full_sw", "full_mamba_align", "sw_mamba", "full_mamba3", "full_chunked")
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
    checkpoint: int | None = None  # Mamba align prefill checkpoint alignment (0.29+)
    half: bool = False  # bfloat16 layers (a mixed-precision cache with float32 ones)


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
    # Context parallelism (single full-attention group only, as the whole-block-hits profile).
    dcp: int = 1
    pcp: int = 1
    replicated: tuple[int, ...] = ()  # groups whose spec is not dcp-sharded (partial-block-hits)
    # A recording metrics collector on each manager at this sample rate.
    metrics_sample_rate: float | None = None
    # VLLM_PREFIX_CACHE_RETENTION_INTERVAL while the managers are built
    # (None: unset, dense caching).
    retention: int | None = None
    # Drawn for the releases after the oldest only (`release_api`); neutral defaults.
    release: str = releases.DEFAULT.version
    spec_tokens: int = 0  # the scheduler's num_lookahead_tokens (drafts per step at most)
    dynamic_drafts: bool = False  # drafts per step vary in [0, spec_tokens]
    hash_lookahead: int = 0  # num_hash_lookahead_tokens
    prefill_lookahead: int = 0  # num_prefill_lookahead
    watermark: float = 0.0
    max_in_flight_tokens: int | None = None
    full_must_fit: bool = False  # scheduler_reserve_full_isl
    deferred_frees: bool = False  # frees may go through pop_blocks_for_free
    async_sched: bool = False  # steps run ahead of their outputs (num_in_flight_tokens)
    shared_prefix_checkpoint: bool = False  # enable_mamba_shared_prefix_checkpoint (partial-block-hits)

    @property
    def align(self) -> bool:
        return any(g.kind == "mamba" and g.mode == "align" for g in self.groups)

    def describe(self) -> str:
        gs = ",".join(
            f"{g.kind}@{g.block_size}" + (f":{g.param}" if g.param else "") + (f":{g.mode}/{g.num_spec}" if g.kind == "mamba" else "")
            + (f"/ckpt{g.checkpoint}" if g.checkpoint else "")
            for g in self.groups
        )
        text = (
            f"{self.mix} [{gs}] caching={self.caching} num_blocks={self.num_blocks} sbs={self.scheduler_block_size} "
            f"hbs={self.hash_block_size} eagle={self.use_eagle} events={self.events} stats={self.log_stats}"
            f" dcp={self.dcp} pcp={self.pcp} replicated={list(self.replicated)} metrics={self.metrics_sample_rate}"
            f" retention={self.retention}"
        )
        if self.release != releases.DEFAULT.version:
            text += (
                f" release={self.release} spec={self.spec_tokens}{'(dyn)' if self.dynamic_drafts else ''} "
                f"hash_lookahead={self.hash_lookahead} prefill_lookahead={self.prefill_lookahead} "
                f"watermark={self.watermark} in_flight={self.max_in_flight_tokens} "
                f"full_must_fit={self.full_must_fit} deferred_frees={self.deferred_frees} async={self.async_sched}"
                f" shared_prefix_checkpoint={self.shared_prefix_checkpoint}"
            )
        return text


def random_setup(rng: Any, mix: str, caching: bool) -> Setup:
    """A random configuration of `mix` that every supported vLLM accepts."""
    mode = "none"
    groups: tuple[Group, ...]
    if mix == "full":
        bs = rng.choice((4, 8))
        groups, sbs, hbs = (Group("full", bs),), bs, bs
    elif mix == "sw":
        bs = rng.choice((4, 8))
        groups, sbs, hbs = (Group("sw", bs, rng.randint(2, 20)),), bs, bs
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
    # Sparse retention (the whole-block-hits profile accepts it only with a sliding window):
    # unset, latest boundary only, or 1-3 scheduler blocks per segment.
    retention = None
    if any(g.kind == "sw" for g in groups):
        retention = rng.choice((None, None, 0, sbs, 2 * sbs, 3 * sbs))
    setup = Setup(
        mix=mix,
        caching=caching,
        groups=groups,
        scheduler_block_size=sbs,
        hash_block_size=hbs if caching else sbs,
        num_blocks=rng.randint(10, 44),
        use_eagle=eagle,
        events=caching and rng.random() < 0.7,
        log_stats=rng.random() < 0.5,
        retention=retention,
    )
    # Drawn last, so the draws above stay what they were.
    if mix == "full" and rng.random() < 0.4:
        # vLLM's resolve_kv_cache_block_sizes for one group: both sizes are
        # the block size times dcp * pcp.
        setup.dcp, setup.pcp = rng.choice(((2, 1), (1, 2), (2, 2)))
        setup.scheduler_block_size = setup.hash_block_size = sbs * setup.dcp * setup.pcp
    if rng.random() < 0.25:
        setup.metrics_sample_rate = rng.choice((1.0, 0.3))
    return setup


def _manager_kwargs(s: Setup) -> dict[str, Any]:
    return dict(
        max_model_len=s.max_model_len,
        scheduler_block_size=s.scheduler_block_size,
        hash_block_size=s.hash_block_size,
        enable_caching=s.caching,
        use_eagle=s.use_eagle,
        log_stats=s.log_stats,
        enable_kv_cache_events=s.events,
        dcp_world_size=s.dcp,
        pcp_world_size=s.pcp,
    )


def _collector(s: Setup) -> dict[str, Any]:
    if s.metrics_sample_rate is None:
        return {}
    from .block_metrics import recording_collector

    return {"metrics_collector": recording_collector(s.metrics_sample_rate)}




_KIND = {"full": "full", "sw": "sliding_window", "chunked": "chunked_local", "mamba": "mamba"}


def group_specs(s: Setup) -> tuple[GroupSpec, ...]:
    """`s`'s groups as the config builders take them."""
    return tuple(
        GroupSpec(
            _KIND[g.kind],
            g.block_size,
            sliding_window=g.param if g.kind == "sw" else None,
            attention_chunk_size=g.param if g.kind == "chunked" else None,
            mamba_cache_mode=g.mode if g.kind == "mamba" else None,
            num_speculative_blocks=g.num_spec if g.kind == "mamba" else 0,
            mamba_checkpoint_alignment=g.checkpoint if g.kind == "mamba" else None,
            half_precision=g.half,
        )
        for g in s.groups
    )


RETENTION_ENV = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"


@contextlib.contextmanager
def retention_interval(value: int | None) -> Iterator[None]:
    """VLLM_PREFIX_CACHE_RETENTION_INTERVAL set to `value` (None: unset)
    while managers are built (both implementations read it then); the
    previous value is restored after."""
    before = os.environ.get(RETENTION_ENV)
    if value is None:
        os.environ.pop(RETENTION_ENV, None)
    else:
        os.environ[RETENTION_ENV] = str(value)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(RETENTION_ENV, None)
        else:
            os.environ[RETENTION_ENV] = before


def build_hybridcache(s: Setup) -> Any:
    with retention_interval(s.retention):
        return configs.hybridcache_manager(configs.hybridcache_kv_cache_config(group_specs(s), s.num_blocks),
                                           {**_manager_kwargs(s), **_collector(s)})


def build_vllm(s: Setup) -> Any:
    with retention_interval(s.retention):
        m = configs.vllm_manager(configs.vllm_kv_cache_config(group_specs(s), s.num_blocks),
                                 {**_manager_kwargs(s), **_collector(s)})
    # vLLM reads the variable at construction (unless its env cache is on).
    assert m.coordinator.retention_interval == s.retention, "vLLM did not see the retention interval"
    return m


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
    context_parallel_setups: int = 0
    metrics_setups: int = 0
    reports: list[str] = field(default_factory=list)
    # Per-profile call counts (e.g. the partial-block-hits deferred frees).
    calls: dict[str, int] = field(default_factory=dict)

    def count(self, name: str, n: int = 1) -> None:
        self.calls[name] = self.calls.get(name, 0) + n

    def merge(self, o: Figures) -> None:
        for f in dataclasses.fields(self):
            if f.name == "reports":
                self.reports.extend(o.reports)
            elif f.name == "calls":
                for k, v in o.calls.items():
                    self.count(k, v)
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(o, f.name))

    def summary(self) -> str:
        return (
            f"ops={self.ops} setups={self.setups} divergences={self.divergences} "
            f"invariant_violations={self.invariant_violations} bad_inputs={self.bad_inputs} "
            f"bad_input_failures={self.bad_input_failures} bad_inputs_unread={self.bad_inputs_unread} reference_errors={self.reference_errors} "
            f"known_bug_avoided={self.known_bug_avoided} allocations={self.allocations} "
            f"none={self.none_allocations} hit_tokens={self.hit_tokens} events={self.events} "
            f"preemptions={self.preemptions} evictions={self.evictions} resets={self.resets} "
            f"context_parallel_setups={self.context_parallel_setups} metrics_setups={self.metrics_setups}"
        ) + "".join(f" {k}={v}" for k, v in sorted(self.calls.items()))

