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
- `release_api`: one call spelling per core profile (managers, requests,
  calls, observables), which the development package's fuzz extends.

Nothing here imports vLLM or torch at module import time.
"""
