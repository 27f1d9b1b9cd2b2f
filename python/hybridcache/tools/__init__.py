"""What the user commands `hybridcache replay` and `hybridcache bench` run on:
the recorded traces they apply (`trace`, `bench_trace`), the bench's timed
replay (`timed_replay`), output normalization and comparison (`compare`), the
config builders (`configs`), each release's call spelling (`release_api`) and
the vLLM oracle check (`oracle`). The development package `hybridcache_dev`
(not in the wheel) records the traces and builds its fuzzers on these.
Nothing here imports vLLM or torch at module import time.
"""
