"""Training run for a profile-guided build (scripts/build_wheel.sh): the
calls a serving loop makes, so the compiler lays the hot paths out densely
(under a Python scheduler a call's cost is mostly instruction-cache misses).

Runs on an instrumented hybridcache alone (no vLLM, no torch): the bench's
scheduler trace for every configuration, with a seed and batch sizes the
bench's defaults do not use, through the drop-in API, then the batched
array API. Takes a few seconds per configuration.
"""

from __future__ import annotations

import random
import sys
from array import array

from hybridcache.bench import CONFIGS, Workload, hybridcache_kv_cache_config, run_workload
from hybridcache.manager import KVCacheManager
from hybridcache.request import Request

SEED = 7


def drop_in(config: str, running: int, steps: int) -> None:
    result = run_workload(Workload(config=config, running=running, steps=steps, seed=SEED), use_vllm=False)
    if not result["verified"]:
        raise SystemExit(f"training replay diverged: {result.get('divergence')}")


def arrays(config: str, running: int, steps: int) -> None:
    w = Workload(config=config, running=1, steps=1, seed=SEED)
    kwargs = w.manager_kwargs()
    kwargs.update(log_stats=False, enable_kv_cache_events=False)
    num_blocks = running * (8 + 5 * steps // w.block_size + 4 * 20) + 10
    m = KVCacheManager(hybridcache_kv_cache_config(w, num_blocks), **kwargs)
    rng = random.Random(SEED)
    reqs = [Request(f"r{i}", [rng.randrange(1000) for _ in range(rng.randrange(32, 96))], w.block_size)
            for i in range(running)]
    for r in reqs:
        if m.allocate_slots(r, r.num_tokens) is None:
            raise SystemExit("training pool too small")
        r.num_computed_tokens = r.num_tokens
        r.append_output_token_ids([1])
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
        for r, d in zip(reqs, drafts):
            accepted = rng.randint(0, d)
            r.num_computed_tokens += 1 + accepted
            r.append_output_token_ids([7] * (1 + accepted))
        m.new_step_starts()


def main() -> int:
    for config in CONFIGS:
        for running in (128, 512):
            drop_in(config, running, steps=30)
        arrays(config, running=384, steps=40)
        print(f"pgo training: {config} done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
