"""What the user commands `hybridcache replay` and `hybridcache bench` run
on: one workload and scheduler simulator, the per-release call spellings,
and the vLLM oracle check (the development package `hybridcache_dev`, not
in the wheel, builds its fuzzers on them too).

- `configs`: KV-cache group layouts (`GroupSpec`, `parse_mix`) and the one
  config builder, for hybridcache's own classes and for vLLM's;
- `workload`: simulator-side request state, token / prefix / prompt / draft
  generators;
- `scheduler`: the loop of vLLM's ``Scheduler.schedule`` (`SchedulerSim`)
  and its Mamba block-aligned split;
- `compare`: output normalization and `Fanout` (one call, every manager,
  compared);
- `oracle`: importing vLLM quietly, its version check, quiet logs, and the
  one-line message when an optional package is missing;
- `replay_config` and `simulation`: the replay's workload shape and its
  full-API simulation;
- `bench_trace` and `timed_replay`: the bench's recorded hot path and its
  timed, verified replay;
- `release_api` (with `fuzz_setup`, `scratch_groups`): each release as the
  tools and the fuzz see it (managers, requests, calls, observables);
- `block_metrics`: vLLM's metrics collector, recording the calls it gets.

Nothing here imports vLLM or torch at module import time.
"""

from __future__ import annotations

from .compare import Fanout, ReplayDivergence
from .configs import GroupSpec, format_mix, hybridcache_kv_cache_config, parse_mix, vllm_kv_cache_config
from .oracle import ORACLE_RELEASES, load_vllm, quiet_logs, vllm_missing
from .replay_config import DEFAULT_CONFIG, ReplayConfig
from .scheduler import SchedulerSim, mamba_block_aligned_split
from .simulation import ReplaySimulation, ReplaySummary
from .workload import Seq

__all__ = [
    "DEFAULT_CONFIG",
    "ORACLE_RELEASES",
    "Fanout",
    "GroupSpec",
    "ReplayConfig",
    "ReplayDivergence",
    "ReplaySimulation",
    "ReplaySummary",
    "SchedulerSim",
    "Seq",
    "format_mix",
    "hybridcache_kv_cache_config",
    "load_vllm",
    "mamba_block_aligned_split",
    "parse_mix",
    "quiet_logs",
    "vllm_kv_cache_config",
    "vllm_missing",
]
