"""Long differential fuzz of hybridcache's KVCacheManager against vLLM's.

    python -m hybridcache_dev.fuzz --ops 200000 --seed 1 [--mix full,full_sw] [--caching both]
    python -m hybridcache_dev.fuzz --release VERSION --candidate vllm --ops 20000 --seed 1

`--release` (default: the installed vLLM's) picks the release whose manager
is the reference and whose call sequences are replayed
(`tools.release_api`); `--candidate hybridcache` (default) tests
hybridcache's facade for that release, `--candidate vllm` vLLM's manager
against itself (the harness self-check: zero divergences expected). The
rest of this text describes the base driver (`fuzz_driver.Driver`); a release
with its own driver package (`drive`) follows its scheduler's call order and
sends no bad inputs.

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

Every sequence is legal for the releases the base driver drives; inputs that trigger known vLLM bugs
(which hybridcache reproduces) are steered around and counted, unless
`--allow-known-bugs`. Exit status 0 iff no divergence and no invariant
violation was found. The driver is also used by its release's tests
`test_fuzz_stateful.py` (hypothesis) and `test_fuzz_slice.py`. It lives in
`hybridcache_dev.fuzz_setup` and `fuzz_driver`, `bad_inputs` here; this module
is the runner and the CLI. Without a supported vLLM (and torch) the CLI says so in
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
from typing import Any

from hybridcache import releases
from hybridcache_dev import drive
from hybridcache_dev.fuzz_driver import Driver, Seq
from hybridcache_dev.fuzz_setup import (
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
from hybridcache.tools.oracle import quiet_logs
from hybridcache_dev.oracle import FUZZ_RELEASES, installed_vllm_version, vllm_missing
from hybridcache_dev.release_api import CANDIDATES, release

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
    mixes: Sequence[str] | None = None,
    caching: Sequence[bool] = (True, False),
    ops_per_setup: int = 3000,
    allow_known_bugs: bool = False,
    progress: Callable[[Figures, float], None] | None = None,
    progress_every: int = 20000,
    max_reports: int = 20,
    release_name: str = releases.DEFAULT.version,
    candidate: str = "hybridcache",
    build_candidate: Callable[[Setup], Any] | None = None,
) -> Figures:
    """Runs `ops` operations over a rotation of random setups; never raises
    for findings: they are counted (and the first `max_reports` described).

    `release_name`: the vLLM release replayed (its manager is the
    reference); `candidate`: "hybridcache" (its facade for the release) or
    "vllm" (the self-check); `build_candidate` overrides how the candidate
    is built from a setup (a test wraps it to perturb it). `mixes`: None for
    every mix of the release."""
    api = release(release_name)
    if mixes is None:
        mixes = api.mixes
    rng = random.Random(seed)
    c = RngChooser(rng)
    f = Figures()
    start = time.time()
    next_progress = progress_every
    combos = [(m, cb) for m in mixes for cb in caching]
    refused_in_a_row = 0  # setups the candidate could not be built for
    k = 0
    while f.ops < ops:
        mix, cb = combos[k % len(combos)]
        k += 1
        if api.classic:
            setup = random_setup(rng, mix, cb)
            # The builders are looked up here, so a test can wrap them.
            d = Driver(setup, allow_known_bugs, f, build_candidate or build_hybridcache, build_vllm)
        else:
            setup = api.random_setup(rng, mix, cb)
            build = build_candidate or (lambda s: drive.build_candidate(api, s, candidate))
            if refused_in_a_row >= 100:
                f.reports.append(f"[stopped] the candidate refused the last {refused_in_a_row} setups")
                break
            refused_in_a_row += 1
            try:
                d = drive.driver_class(api)(setup, allow_known_bugs, f, build, lambda s: drive.build_reference(api, s))
            except ReferenceError_ as e:
                f.reference_errors += 1
                f.reports.append(f"[reference_errors] seed={seed} {setup.describe()}\n  {e}")
                continue
            except NotImplementedError as e:
                # A setup the candidate says it does not support yet: counted, skipped.
                f.count("unsupported_setups")
                if len(f.reports) < max_reports and f.calls["unsupported_setups"] == 1:
                    f.reports.append(f"[unsupported setup] {setup.describe()}: {e}")
                continue
            except Exception as e:  # vLLM accepted the setup, the candidate did not
                f.divergences += 1
                if len(f.reports) < max_reports:
                    f.reports.append(f"[divergences] seed={seed} {setup.describe()}\n  constructing the candidate "
                                     f"raised {type(e).__name__}: {e}")
                continue
            refused_in_a_row = 0
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
    p = argparse.ArgumentParser(prog="python -m hybridcache_dev.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--release", choices=FUZZ_RELEASES, default=None,
                   help="the vLLM release replayed (default: the installed vLLM's)")
    p.add_argument("--candidate", choices=CANDIDATES, default="hybridcache",
                   help="what is compared with vLLM's manager: hybridcache's facade for the release, "
                        "or vLLM's manager itself (the harness self-check)")
    p.add_argument("--mix", default=None, help="comma-separated subset of the release's mixes ("
                   + "; ".join(f"{r}: {','.join(release(r).mixes)}" for r in FUZZ_RELEASES) + "); default: all")
    p.add_argument("--caching", choices=("on", "off", "both"), default="both")
    p.add_argument("--ops-per-setup", type=int, default=3000)
    p.add_argument("--progress-every", type=int, default=20000)
    p.add_argument("--allow-known-bugs", action="store_true",
                   help="do not steer around known vLLM bugs that hybridcache reproduces")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    tool = "python -m hybridcache_dev.fuzz"
    rel = a.release
    if rel is None:
        # Later vLLM releases infer a device at import; the manager runs on the CPU.
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        # Without a supported vLLM the oracle check below says what is missing.
        rel = installed_vllm_version() or FUZZ_RELEASES[0]
    elif not release(rel).classic:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    api = release(rel)
    mixes = [m.strip() for m in a.mix.split(",") if m.strip()] if a.mix else list(api.mixes)
    for m in mixes:
        if m not in api.mixes:
            p.error(f"unknown mix {m!r} for vLLM {rel}; choose from {', '.join(api.mixes)}")
    if api.classic and a.candidate != "hybridcache":
        p.error(f"vLLM {rel}'s fuzz checks hybridcache's invariants and bad inputs: --candidate hybridcache only")
    caching = {"on": (True,), "off": (False,), "both": (True, False)}[a.caching]
    why = vllm_missing(tool, [r for r in releases.RELEASES if r.version == rel]) or api.candidate_missing(a.candidate)
    if why:
        print(why if why.startswith(tool) else f"{tool}: {why} (try --candidate vllm)", file=sys.stderr)
        return 2

    def progress(f: Figures, secs: float) -> None:
        print(f"[{secs:7.1f}s] {f.ops} ops ({f.ops / max(secs, 1e-9):.0f}/s) divergences={f.divergences} "
              f"invariant_violations={f.invariant_violations} bad_inputs={f.bad_inputs} "
              f"bad_input_failures={f.bad_input_failures} reference_errors={f.reference_errors}", flush=True)

    t0 = time.time()
    with quiet_logs():
        f = run_fuzz(a.ops, a.seed, mixes, caching, a.ops_per_setup, a.allow_known_bugs, progress, a.progress_every,
                     release_name=rel, candidate=a.candidate)
    secs = time.time() - t0
    for r in f.reports:
        print(r, flush=True)
    head = f"FINAL seed={a.seed} mixes={','.join(mixes)} caching={a.caching}"
    if not api.classic:
        head += f" release={rel} candidate={a.candidate}"
    print(f"{head} seconds={secs:.1f} {f.summary()}", flush=True)
    bad = f.divergences or f.invariant_violations or f.bad_input_failures
    if not api.classic:
        bad = bad or f.reference_errors  # an illegal sequence for the release's driver is a driver bug
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())

