"""Decode steps through hybridcache alone, for instruction and cache-miss
profiles (no timing: run it under callgrind).

    python benchmarks/profile_decode.py CONFIG MODE RUNNING STEPS [flush]

CONFIG: full | full+swa | full+3xmamba-align; MODE: dropin (the scheduler's
`allocate_slots(request, n, num_lookahead_tokens=0)` + `get_block_ids(
allow_none=True)` per running request) or arrays (one `allocate_decode_arrays`
per step). `flush` overwrites 2 MiB between steps, as the Python scheduler's
own work between manager calls would evict the manager's code and data.

Steady-state cost per request: run it twice (e.g. 10 and 40 steps) under

    valgrind --tool=callgrind --cache-sim=yes --callgrind-out-file=OUT \\
        python benchmarks/profile_decode.py full dropin 256 40 flush

and subtract the two runs' inclusive counts of the native entry points
(`allocate_slots_fast`, `__pymethod_allocate_slots__`, `get_block_ids`,
`allocate_decode_arrays`) from `callgrind_annotate --inclusive=yes`. Under a
Python scheduler, instruction-cache misses (I1mr) weigh as much as
instructions: a no-op decode runs ≈ 100 ns hot and ≈ 450 ns in the bench.
"""

from __future__ import annotations

import sys
from array import array

from hybridcache_dev.bench_batched import accept_drafts, decoding_manager


def main(argv: list[str]) -> None:
    config, mode, running, steps = argv[0], argv[1], int(argv[2]), int(argv[3])
    flush = len(argv) > 4 and argv[4] == "flush"
    m, reqs, rng = decoding_manager(config, running, steps, seed=0)
    handles = array("Q", [m.request_handle(r.request_id) for r in reqs]).tobytes()
    scratch = bytearray(2 << 20)
    for _ in range(steps):
        drafts = [rng.choice([0, 0, 1, 2, 4]) for _ in range(running)]
        counts = [1 + d for d in drafts]
        if flush:
            scratch[::64] = bytes(len(scratch) // 64)
        if mode == "arrays":
            computed = array("I", [r.num_computed_tokens for r in reqs]).tobytes()
            totals = array("I", [r.num_tokens for r in reqs]).tobytes()
            m.allocate_decode_arrays(handles, array("I", counts).tobytes(), computed, totals, 0, reqs)
        else:
            for r, n in zip(reqs, counts):
                blocks = m.allocate_slots(r, n, num_lookahead_tokens=0)
                if blocks is not None:
                    blocks.get_block_ids(allow_none=True)
        accept_drafts(reqs, drafts, rng)
        m.new_step_starts()


if __name__ == "__main__":
    main(sys.argv[1:])
