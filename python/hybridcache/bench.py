"""`hybridcache bench`: scheduler-step latency of hybridcache's manager next to
the installed vLLM release's (a row of `releases`; layouts a release's facade
does not cover are skipped with a note), on recorded serving traces.

1. *The trace* (`tools.bench_trace`): a scheduler loop over hybridcache's
   facade, recorded call by call: arrivals with shared prefixes, chunked
   prefill (Mamba-align block-aligned chunks), decode with 0..16 draft tokens
   and random acceptance, preemption when the pool runs dry, aborts. The
   wheel ships the default grid's recordings; the development package
   records any other size or seed.
2. *Replay* (`tools.timed_replay`): against a fresh manager of each
   implementation, alternating every few steps (ABBA order); only the manager
   calls are timed (the timer's median cost subtracted), the garbage
   collector paused while timing.
3. *Verify*: each result agrees with the recording and with the other
   implementation's, and so do the free blocks after every step; otherwise
   the configuration is reported as diverged.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import releases
from .bench_report import Progress, binding_text, format_report
from .tools.bench_trace import (
    CONFIG_TITLES,
    CONFIGS,
    RUNNING,
    STEPS,
    Recording,
    load,
    make_hybridcache_manager,
    make_vllm_manager,
)
from .tools.oracle import quiet_logs, tool_release
from .tools.timed_replay import (
    CLOCKS,
    KINDS,
    BenchDivergence,
    impl_result,
    ratio,
    replay_timed,
    timer_overhead_ns,
)

SCALE_BLOCKS = 1_000_000
DEV = "hybridcache's development package (pip install -e dev, from the repository)"
BATCHED_DEV = f"batched decode API: timed by {DEV}"


def has_dev() -> bool:
    """Whether the development package is importable (the repository's dev/)."""
    return importlib.util.find_spec("hybridcache_dev") is not None


def recording(config: str, running: int, steps: int, seed: int, release: str) -> Recording:
    """The workload's recording: shipped (the default grid, seed 0, its first
    `steps` measured steps), else recorded live by the development package."""
    rec = load(config, running, steps, seed, release)
    if rec is not None:
        return rec
    if not has_dev():
        raise LookupError(f"the wheel ships the recordings of --running {','.join(map(str, RUNNING))}, up to "
                          f"--steps {STEPS}, seed 0; other workloads are recorded by {DEV}")
    from hybridcache_dev.bench_trace import Workload, record

    return record(Workload(config=config, running=running, steps=steps, seed=seed, release=release))


def run_recording(
    rec: Recording, use_vllm: bool, progress: Any = None, chunk_steps: int = 8, clock: str = "perf_counter"
) -> dict[str, Any]:
    """Replays `rec` on hybridcache (and vLLM), returns the result."""
    meta = rec.meta
    warmup, steps = meta["warmup_steps"], meta["steps"]
    factories: list[tuple[str, Callable[[Recording], Any]]] = [("hybridcache", make_hybridcache_manager)]
    if use_vllm:
        factories.append(("vllm", make_vllm_manager))
    if progress:
        progress.phase(f"replay {meta['config']} @ {meta['running']}")
    result: dict[str, Any] = {
        "config": meta["config"],
        "running": meta["running"],
        "num_blocks": meta["num_blocks"],
        "max_num_batched_tokens": meta["kwargs"]["max_num_batched_tokens"],
        "warmup_steps": warmup,
        "steps": steps,
        "ops": rec.num_ops,
        "mean_running": sum(rec.running_after_step[warmup:]) / max(1, steps),
        "trace": rec.counters,
        "record_seconds": rec.seconds,
        "compared": [name for name, _ in factories],
        "verified": None,
    }
    start = time.perf_counter()
    try:
        on_chunk = (lambda n: progress.advance(n / len(factories) / len(rec.steps))) if progress else None
        impls = replay_timed(rec, factories, chunk_steps, clock, on_chunk=on_chunk)
    except BenchDivergence as e:
        result["verified"] = False
        result["divergence"] = str(e)
        result["replay_seconds"] = time.perf_counter() - start
        return result
    result["replay_seconds"] = time.perf_counter() - start
    # Every result agreed with the recording and across the implementations.
    result["verified"] = True
    result["timer_overhead_ns"] = impls[0].timer_overhead_ns
    result["impls"] = {impl.name: impl_result(impl, warmup) for impl in impls}
    if use_vllm:
        hc, vl = result["impls"]["hybridcache"], result["impls"]["vllm"]
        result["speedup"] = {
            "step_p50": ratio(vl["step"]["p50_us"], hc["step"]["p50_us"]),
            "step_p90": ratio(vl["step"]["p90_us"], hc["step"]["p90_us"]),
            "step_mean": ratio(vl["step"]["mean_us"], hc["step"]["mean_us"]),
            **{
                k: ratio(vl["calls"][k]["p50_us"], hc["calls"][k]["p50_us"])
                for k in ("decode_allocate_slots", "get_computed_blocks", "free")
            },
        }
    return result



# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------


def run_bench(
    configs: Sequence[str] = CONFIGS,
    runnings: Sequence[int] = RUNNING,
    steps: int = 300,
    seed: int = 0,
    use_vllm: bool = True,
    show_progress: bool = True,
    scale_blocks: int = SCALE_BLOCKS,
    quick: bool = False,
    clock: str = "perf_counter",
) -> dict[str, Any]:
    from . import __version__

    start = time.perf_counter()
    release, note = tool_release("hybridcache bench", use_vllm)
    vllm_version = release.version if release is not None else None
    # The installed release's scheduler calls and facade (the oldest release's without vLLM).
    name = vllm_version or releases.DEFAULT.version
    skipped = [
        {"config": c, "reason": f"hybridcache's vLLM {name} facade does not cover this layout yet "
                                f"(it covers: {', '.join(release.layouts or ())})"}
        for c in configs if release is not None and not release.covers(c)
    ]
    configs = [c for c in configs if release is None or release.covers(c)]
    progress = Progress(len(configs) * len(runnings), show_progress)
    # Everything alive now (vLLM, torch) is left out of later collections.
    gc.collect()
    gc.freeze()
    try:
        scale = None
        if scale_blocks:  # measured by the development package
            from hybridcache_dev.pool_scale import scale_figures

            progress.phase(f"pool of {scale_blocks:,} blocks")
            scale = scale_figures(bool(vllm_version), scale_blocks, name)
        results = []
        for c in configs:
            for r in runnings:
                progress.phase(f"load {c} @ {r}")
                rec = recording(c, r, steps, seed, name)
                results.append(run_recording(rec, bool(vllm_version), progress, clock=clock))
                del rec
        # The batched decode API is hybridcache's own, timed against a release's per-request decode calls.
        batched, batched_note = _batched(release, configs, runnings, min(steps, 100), seed)
    finally:
        progress.close()
        gc.unfreeze()
    return {
        "hybridcache": __version__,
        "vllm": vllm_version,
        "vllm_note": note,
        "quick": quick,
        "clock": clock,
        "binding": binding_text(),
        "load_average": _loadavg(),
        "seed": seed,
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "scale": scale,
        "results": results,
        "skipped": skipped,
        "batched": batched,
        "batched_note": batched_note,
        "seconds": time.perf_counter() - start,
    }


def _batched(release: releases.Release | None, configs: Sequence[str], runnings: Sequence[int], steps: int,
             seed: int) -> tuple[list[dict[str, Any]] | None, str | None]:
    """(rows, note): the batched decode API against the release's per-request
    calls, timed by the development package's `bench_batched` where it is installed."""
    if release is None:
        return None, None
    if not has_dev():
        return None, BATCHED_DEV
    from hybridcache_dev.bench_batched import batched_section

    return batched_section(release, configs, runnings, steps, seed)


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from e
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"expected positive integers, got {text!r}")
    return values


def add_arguments(parser: Any) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="a short run: 20 measured steps, 64 and 256 running, a 100k-block pool")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout (no table)")
    parser.add_argument("--plot", metavar="PNG", help="draw per-step latency distributions into PNG (needs the development package and matplotlib)")
    parser.add_argument("--config", action="append", choices=CONFIGS, dest="configs",
                        help="configuration to run (repeatable; default: all)")
    parser.add_argument("--running", type=str, default=None,
                        help="running-request counts, comma-separated (default 64,256,1024; --quick 64,256)")
    parser.add_argument("--steps", type=int, default=None,
                        help="measured steps per configuration (default 300; --quick 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-vllm", action="store_true", help="run hybridcache only, even if vLLM is importable")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="perf_counter",
                        help="timer around each call: perf_counter (wall, default) or thread_time "
                        "(this thread's CPU time: ignores time the OS ran other processes, on a busy machine)")
    parser.add_argument("--scale-blocks", type=int, default=None,
                        help="pool size for the build-time / bytes-per-block figures "
                        "(default 1,000,000; --quick 100,000; 0: skip; needs the development package, "
                        "skipped without it)")


def main(args: Any) -> int:
    import json

    try:
        runnings = _int_list(args.running) if args.running else ([64, 256] if args.quick else list(RUNNING))
    except ValueError as e:
        print(f"hybridcache bench: --running: {e}", file=sys.stderr)
        return 2
    steps = args.steps if args.steps is not None else (20 if args.quick else 300)
    scale_blocks = args.scale_blocks if args.scale_blocks is not None else (100_000 if args.quick else SCALE_BLOCKS)
    if steps <= 0:
        print("hybridcache bench: --steps must be positive", file=sys.stderr)
        return 2
    # Say what is missing before a long run, not after it.
    for flag, wanted in (("--plot", args.plot), ("--scale-blocks", args.scale_blocks)):
        if wanted and not has_dev():
            print(f"hybridcache bench: {flag} needs {DEV}", file=sys.stderr)
            return 2
    if not has_dev():
        scale_blocks = 0  # the default pool-scale figures: with the development package only
    draw: Callable[[dict[str, Any], str], str | None] | None = None
    if args.plot:
        from hybridcache_dev import bench_plot

        why, draw = bench_plot.matplotlib_missing(), bench_plot.plot
        if why:
            print(f"hybridcache bench: {why}", file=sys.stderr)
            return 2
    # Whatever vLLM (or anything else) logs goes to stderr, not into the table
    # / JSON, and only its errors: vLLM's and torch's warnings are quiet.
    try:
        with contextlib.redirect_stdout(sys.stderr), quiet_logs():
            report = run_bench(configs=args.configs or CONFIGS, runnings=runnings, steps=steps, seed=args.seed,
                               use_vllm=not args.no_vllm, show_progress=not args.no_progress,
                               scale_blocks=max(0, scale_blocks), quick=args.quick, clock=args.clock)
            why = draw(report, args.plot) if draw else None
    except LookupError as e:
        print(f"hybridcache bench: {e}", file=sys.stderr)
        return 2
    if args.plot:
        print(why or f"plot written to {args.plot}", file=sys.stderr)
    if args.json:
        out = dict(report)
        # The per-step series are for --plot; keep the JSON small.
        out["results"] = [_without_series(r) for r in report["results"]]
        print(json.dumps(out, indent=2))
    else:
        print(format_report(report))
        if report.get("batched"):
            from hybridcache_dev.bench_batched import format_batched

            print(f"\n{format_batched(report['batched'], report['vllm'])}")
        elif report.get("batched_note"):
            print(f"\n{report['batched_note']}")
    for s in report["skipped"]:
        print(f"hybridcache bench: {s['config']} skipped on vLLM {report['vllm']}: {s['reason']}", file=sys.stderr)
    if not report["results"]:
        print("hybridcache bench: nothing to run: every configuration asked for was skipped", file=sys.stderr)
        return 2
    return 1 if any(r.get("verified") is False for r in report["results"]) else 0


def _without_series(r: dict[str, Any]) -> dict[str, Any]:
    r = dict(r)
    if "impls" in r:
        r["impls"] = {k: {kk: vv for kk, vv in v.items() if kk != "step_us_all"} for k, v in r["impls"].items()}
    return r
