"""Long differential fuzz of `hybridcache.KVCacheManager` against vLLM 0.23.0's.

    python -m hybridcache.fuzz --ops 200000 --seed 1 [--mix full,full_sw] [--caching both]

Random API-level operations (not only what a scheduler does: lookups of any
request, allocations with random token counts, drafts jumping up and down,
lookahead, external computed tokens with async loads, delayed caching,
full_sequence_must_fit, reserved blocks, preemption storms, evictions of any
block ids, prefix-cache resets, remove_skipped_blocks, cache_blocks,
common-prefix queries of any id, ...) go to both managers with the same
request objects; every output is compared (block ids and which are unhashed,
hit lengths, None, free count, usage, events, stats, common prefix blocks,
new block ids), and after every operation also every block's ref_cnt and
hash, the free queue's order and every request's block table.
`check_invariants()` runs after every operation. Setups of the `full` mix
may draw decode / prefill context parallelism (dcp, pcp > 1); any setup may
give each manager a recording vLLM metrics collector, whose calls, sampled
blocks and eviction events are compared too. Setups with a sliding window
also draw VLLM_PREFIX_CACHE_RETENTION_INTERVAL (unset, 0, or 1-3 scheduler
blocks), set while both managers are built.

Interleaved with them, bad inputs (bad counts, unknown ids, foreign
KVCacheBlocks, wrong hash types, out-of-range eviction ids, ...) go to
hybridcache only: each must raise a clear ValueError / TypeError / KeyError /
NotImplementedError (never a PanicException or RuntimeError) and leave the
state exactly as it was (free queue, ref counts, block hashes, every
request's block ids, known hashes).

Every sequence is legal for vLLM 0.23.0; inputs that trigger known vLLM bugs
(which hybridcache reproduces) are steered around and counted, unless
`--allow-known-bugs`. Exit status 0 iff no divergence and no invariant
violation was found. The driver is also used by tests/test_fuzz_stateful.py
(hypothesis) and tests/test_fuzz_slice.py. It lives in
`hybridcache.testing` (`fuzz_setup`, `fuzz_driver`, `bad_inputs`); this module
is the runner and the CLI. Without vLLM 0.23.0 (and torch) the CLI says so in
one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import traceback
from collections.abc import Callable, Sequence

from .testing.fuzz_driver import Driver, Seq
from .testing.fuzz_setup import (
    ACCEPTED_ERRORS,
    MAX_MODEL_LEN,
    MIXES,
    BadInputFailure,
    Divergence,
    Figures,
    Group,
    InvariantViolation,
    ReferenceError_,
    RngChooser,
    Setup,
    build_hybridcache,
    build_vllm,
    random_setup,
)
from .testing.oracle import quiet_logs, vllm_missing

__all__ = [
    "ACCEPTED_ERRORS",
    "MAX_MODEL_LEN",
    "MIXES",
    "BadInputFailure",
    "Divergence",
    "Driver",
    "Figures",
    "Group",
    "InvariantViolation",
    "ReferenceError_",
    "RngChooser",
    "Seq",
    "Setup",
    "build_hybridcache",
    "build_vllm",
    "main",
    "random_setup",
    "run_fuzz",
]


# ---------------------------------------------------------------------------
# Runner


def run_fuzz(
    ops: int,
    seed: int,
    mixes: Sequence[str] = MIXES,
    caching: Sequence[bool] = (True, False),
    ops_per_setup: int = 3000,
    allow_known_bugs: bool = False,
    progress: Callable[[Figures, float], None] | None = None,
    progress_every: int = 20000,
    max_reports: int = 20,
) -> Figures:
    """Runs `ops` operations over a rotation of random setups; never raises
    for findings: they are counted (and the first `max_reports` described)."""
    rng = random.Random(seed)
    c = RngChooser(rng)
    f = Figures()
    start = time.time()
    next_progress = progress_every
    combos = [(m, cb) for m in mixes for cb in caching]
    k = 0
    while f.ops < ops:
        mix, cb = combos[k % len(combos)]
        k += 1
        setup = random_setup(rng, mix, cb)
        # The builders are looked up here, so a test can wrap them.
        d = Driver(setup, allow_known_bugs, f, build_hybridcache, build_vllm)
        budget = min(ops_per_setup, ops - f.ops)
        end = f.ops + budget
        try:
            while f.ops < end:
                d.step_random(c)
                if progress is not None and f.ops >= next_progress:
                    progress(f, time.time() - start)
                    next_progress += progress_every
            d.drain()
        except (Divergence, InvariantViolation, BadInputFailure, ReferenceError_) as e:
            kind = {
                Divergence: "divergences",
                InvariantViolation: "invariant_violations",
                BadInputFailure: "bad_input_failures",
                ReferenceError_: "reference_errors",
            }[type(e)]
            setattr(f, kind, getattr(f, kind) + 1)
            if len(f.reports) < max_reports:
                f.reports.append(
                    f"[{kind}] seed={seed} setup #{f.setups}: {setup.describe()}\n  {e}\n  last ops:\n    "
                    + "\n    ".join(d.log[-15:])
                )
        except Exception as e:  # a driver bug: report, go on with a new setup
            f.reports.append(f"[driver error] {setup.describe()}: {traceback.format_exc()}")
            f.reference_errors += 1
            if len(f.reports) > max_reports * 2:
                raise
    return f


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hybridcache.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mix", default=",".join(MIXES), help=f"comma-separated subset of {','.join(MIXES)}")
    p.add_argument("--caching", choices=("on", "off", "both"), default="both")
    p.add_argument("--ops-per-setup", type=int, default=3000)
    p.add_argument("--progress-every", type=int, default=20000)
    p.add_argument("--allow-known-bugs", action="store_true",
                   help="do not steer around known vLLM 0.23.0 bugs that hybridcache reproduces")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    mixes = [m.strip() for m in a.mix.split(",") if m.strip()]
    for m in mixes:
        if m not in MIXES:
            p.error(f"unknown mix {m!r}; choose from {', '.join(MIXES)}")
    caching = {"on": (True,), "off": (False,), "both": (True, False)}[a.caching]
    why = vllm_missing("python -m hybridcache.fuzz")
    if why:
        print(why, file=sys.stderr)
        return 2

    def progress(f: Figures, secs: float) -> None:
        print(f"[{secs:7.1f}s] {f.ops} ops ({f.ops / max(secs, 1e-9):.0f}/s) divergences={f.divergences} "
              f"invariant_violations={f.invariant_violations} bad_inputs={f.bad_inputs} "
              f"bad_input_failures={f.bad_input_failures} reference_errors={f.reference_errors}", flush=True)

    t0 = time.time()
    with quiet_logs():
        f = run_fuzz(a.ops, a.seed, mixes, caching, a.ops_per_setup, a.allow_known_bugs, progress, a.progress_every)
    secs = time.time() - t0
    for r in f.reports:
        print(r, flush=True)
    print(f"FINAL seed={a.seed} mixes={','.join(mixes)} caching={a.caching} seconds={secs:.1f} {f.summary()}", flush=True)
    return 0 if f.divergences == 0 and f.invariant_violations == 0 and f.bad_input_failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

