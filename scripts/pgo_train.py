"""Training run for a profile-guided build (scripts/build_wheel.sh): the
calls a serving loop makes, so the compiler lays the hot paths out densely
(under a Python scheduler a call's cost is mostly instruction-cache misses).

Runs on an instrumented hybridcache alone (no vLLM, no torch): the bench's
scheduler trace for every configuration, with a seed and batch sizes the
bench's defaults do not use, through the drop-in API, then the batched
array API. Takes a few seconds per configuration.
"""

from __future__ import annotations

import sys
from array import array

from hybridcache.bench import CONFIGS, Workload, run_workload
from hybridcache.bench_batched import accept_drafts, decoding_manager

SEED = 7
# Each release's facade and rules: their hot paths differ (0.33.0's scheduler
# calls `cache_blocks` for every running request, its Mamba caching rules).
RELEASES = ("0.23.0", "0.33.0")


def drop_in(config: str, running: int, steps: int, release: str) -> None:
    w = Workload(config=config, running=running, steps=steps, seed=SEED, release=release)
    result = run_workload(w, use_vllm=False)
    if not result["verified"]:
        raise SystemExit(f"training replay diverged: {result.get('divergence')}")


def arrays(config: str, running: int, steps: int) -> None:
    m, reqs, rng = decoding_manager(config, running, steps, SEED)
    handles = array("Q", [m.request_handle(r.request_id) for r in reqs]).tobytes()
    for _ in range(steps):
        drafts = [rng.choice([0, 0, 1, 2, 4]) for _ in reqs]
        m.allocate_decode_arrays(
            handles,
            array("I", [1 + d for d in drafts]).tobytes(),
            array("I", [r.num_computed_tokens for r in reqs]).tobytes(),
            array("I", [r.num_tokens for r in reqs]).tobytes(),
            0,
            reqs,
        )
        accept_drafts(reqs, drafts, rng)
        m.new_step_starts()


def main() -> int:
    for config in CONFIGS:
        for release in RELEASES:
            for running in (128, 512):
                drop_in(config, running, steps=30, release=release)
        arrays(config, running=384, steps=40)
        print(f"pgo training: {config} done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
