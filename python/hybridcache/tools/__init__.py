"""hybridcache's shared test toolkit: one workload and scheduler simulator
for ``hybridcache replay``, ``hybridcache bench`` and ``python -m
hybridcache_dev.fuzz`` (and the tests that use them).

- `configs`: KV-cache group layouts (`GroupSpec`, `parse_mix`) and the one
  config builder, for hybridcache's own classes and for vLLM's;
- `workload`: simulator-side request state, token / prefix / prompt / draft
  generators;
- `scheduler`: the loop of vLLM 0.23.0's ``Scheduler.schedule`` (`SchedulerSim`)
  and its Mamba block-aligned split;
- `compare`: output normalization and `Fanout` (one call, every manager,
  compared);
- `oracle`: importing vLLM quietly, its version check, quiet logs, and the
  one-line message when an optional package is missing;
- `replay_config` and `simulation`: the replay's workload shape and its
  full-API simulation;
- `bench_trace` and `timed_replay`: the bench's recorded hot path and its
  timed, verified replay;
- `fuzz_setup`, `fuzz_driver` and `bad_inputs`: the long fuzz's random
  API-level driver;
- `release_api` and `fuzz_driver033`: the fuzz per vLLM release (0.23.0,
  0.33.0: managers, requests, calls, observables) and 0.33.0's driver;
- `block_metrics`: vLLM's metrics collector, recording the calls it gets.

Nothing here imports vLLM or torch at module import time.
"""

from __future__ import annotations

from .compare import Fanout, ReplayDivergence
from .configs import GroupSpec, format_mix, hybridcache_kv_cache_config, parse_mix, vllm_kv_cache_config
from .oracle import ORACLE_RELEASES, load_vllm, quiet_logs, vllm_missing
from .replay_config import DEFAULT_CONFIG, MIX_PRESETS, ReplayConfig
from .scheduler import SchedulerSim, mamba_block_aligned_split
from .simulation import ReplaySimulation, ReplaySummary
from .workload import Seq

__all__ = [
    "DEFAULT_CONFIG",
    "MIX_PRESETS",
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
