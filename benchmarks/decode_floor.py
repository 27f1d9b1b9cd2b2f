"""What a drop-in no-op decode can cost at best under a Python scheduler.

    python benchmarks/decode_floor.py [CONFIG ...] [--running N] [--steps S]

Replays the bench's recorded trace through hybridcache twice, from a fresh
manager each time. Pass 1 times every running request's decode that
changes no block, as the bench does: `allocate_slots(request, n,
num_lookahead_tokens=0)` then `get_block_ids(allow_none=True)` on the
result. Pass 2 runs the same calls but times, just before each of them, the
least any drop-in manager must do there: one C call that reads the
request's `request_id` and `num_computed_tokens` (`operator.attrgetter`),
then one method call on a shared object. Both passes subtract the timer's
own cost, as the bench does, and see the same cache state: the same calls
ran before. The floor is what remains of a no-op decode with a manager that
does nothing at all.
"""

from __future__ import annotations

import argparse
import operator
import statistics

from hybridcache.tools import bench_trace as B
from hybridcache.tools import timed_replay as T
from hybridcache_dev.bench_trace import Workload, record


def _replay(config: str, running: int, steps: int, floor: bool) -> list[int]:
    w = Workload(config=config, running=running, steps=steps, seed=0)
    rec = record(w)
    impl = T.new_impl("hybridcache", B.make_hybridcache_manager, rec)
    m = impl.manager
    empty = m.empty_kv_cache_blocks
    clock = T.CLOCKS["perf_counter"]
    overhead = T.timer_overhead_ns(clock)
    read_two = operator.attrgetter("request_id", "num_computed_tokens")
    shared: dict[int, int] = {}
    bs = w.block_size
    out = []
    for s, ops in enumerate(rec.steps):
        measured = s >= w.warmup_steps
        for code, idx, a, b, state, _expected in ops:
            if state is not None:
                req = impl.reqs[idx]
                num_tokens, req.num_computed_tokens, req.num_preemptions = state
                req.num_tokens = num_tokens
                need = num_tokens // bs
                if len(req.block_hashes) < need:
                    req.block_hashes.extend(req._all_hashes[len(req.block_hashes):need])
            if code == B.ALLOC_RUN:
                if floor:
                    t0 = clock()
                    read_two(req)
                    shared.get(0)
                    dt = clock() - t0
                t1 = clock()
                blocks = m.allocate_slots(req, a, num_lookahead_tokens=0)
                None if blocks is None else blocks.get_block_ids(allow_none=True)
                if not floor:
                    dt = clock() - t1
                if b and measured and blocks is empty:
                    out.append(max(0, dt - overhead))
            elif code == B.FREE:
                m.free(req)
            elif code == B.GET_COMPUTED:
                impl.computed[idx] = m.get_computed_blocks(req)[0]
            elif code == B.ALLOC_NEW:
                m.allocate_slots(req, a, num_new_computed_tokens=b,
                                 new_computed_blocks=impl.computed.pop(idx), num_lookahead_tokens=0)
            elif code == B.NEW_STEP:
                m.new_step_starts()
            elif code == B.TAKE_NEW_IDS:
                m.take_new_block_ids()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="*", default=list(B.CONFIGS))
    p.add_argument("--running", type=int, default=256)
    p.add_argument("--steps", type=int, default=150)
    args = p.parse_args()
    print(f"no-op drop-in decode, {args.running} running, median ns (timer cost subtracted)")
    print(f"  {'config':22s} {'hybridcache':>12s} {'floor':>8s} {'ours above floor':>17s}")
    for config in args.configs:
        ours = statistics.median(_replay(config, args.running, args.steps, floor=False))
        least = statistics.median(_replay(config, args.running, args.steps, floor=True))
        print(f"  {config:22s} {ours:12.0f} {least:8.0f} {ours - least:17.0f}")


if __name__ == "__main__":
    main()
