"""`hybridcache bench`: scheduler-step latency of hybridcache's manager next to
the installed vLLM release's (a row of `releases`; layouts a release's facade
does not cover are skipped with a note), on the serving traces the wheel
ships (`tools.bench_trace`), replayed and timed call by call, and verified
against the recording and across the implementations (`tools.timed_replay`).

Other workloads, the pool-scale figures, the batched decode API and
``--plot`` are the development package's (`hybridcache_dev.bench`).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from . import releases
from .bench_report import Progress, binding_text, format_report
from .tools.bench_trace import (CONFIGS, RUNNING, STEPS, Recording, load, make_hybridcache_manager, make_vllm_manager,
                                ships)
from .tools.oracle import quiet_logs, tool_release
from .tools.timed_replay import CLOCKS, BenchDivergence, impl_result, ratio, replay_timed

DEV = "hybridcache's development package (pip install -e dev, from the repository)"
Recorder = Callable[[str, int, int, int, str], Recording]


def shipped(config: str, running: int, steps: int, seed: int, release: str) -> Recording:
    """The wheel's recording of the workload (the first `steps` measured steps)."""
    rec = load(config, running, steps, seed, release)
    if rec is None:
        raise LookupError(f"the wheel ships the recordings of --running {','.join(map(str, RUNNING))}, up to "
                          f"--steps {STEPS}, seed 0; other workloads are recorded by {DEV}")
    return rec


def run_recording(rec: Recording, use_vllm: bool, progress: Any = None, chunk_steps: int = 8,
                  clock: str = "perf_counter", series: bool = False) -> dict[str, Any]:
    """Replays `rec` on hybridcache (and vLLM); the result, with the per-step
    series when `series`."""
    meta = rec.meta
    warmup, steps = meta["warmup_steps"], meta["steps"]
    factories: list[tuple[str, Callable[[Recording], Any]]] = [("hybridcache", make_hybridcache_manager)]
    if use_vllm:
        factories.append(("vllm", make_vllm_manager))
    if progress:
        progress.phase(f"replay {meta['config']} @ {meta['running']}")
    result: dict[str, Any] = {
        "config": meta["config"], "running": meta["running"], "num_blocks": meta["num_blocks"],
        "warmup_steps": warmup, "steps": steps, "ops": rec.num_ops,
        "mean_running": sum(rec.running_after_step[warmup:]) / max(1, steps), "trace": rec.counters,
        "compared": [name for name, _ in factories],
    }
    try:
        on_chunk = (lambda n: progress.advance(n / len(factories) / len(rec.steps))) if progress else None
        impls = replay_timed(rec, factories, chunk_steps, clock, on_chunk=on_chunk)
    except BenchDivergence as e:
        return {**result, "verified": False, "divergence": str(e)}
    # Every result agreed with the recording and across the implementations.
    result["verified"] = True
    result["timer_overhead_ns"] = impls[0].timer_overhead_ns
    result["impls"] = {impl.name: impl_result(impl, warmup, series) for impl in impls}
    if use_vllm:
        hc, vl = result["impls"]["hybridcache"], result["impls"]["vllm"]
        result["speedup"] = {
            **{f"step_{q}": ratio(vl["step"][f"{q}_us"], hc["step"][f"{q}_us"]) for q in ("p50", "p90", "mean")},
            **{k: ratio(vl["calls"][k]["p50_us"], hc["calls"][k]["p50_us"])
               for k in ("decode_allocate_slots", "get_computed_blocks", "free")},
        }
    return result


def run_bench(configs: Sequence[str] = CONFIGS, runnings: Sequence[int] = RUNNING, steps: int = STEPS,
              seed: int = 0, use_vllm: bool = True, show_progress: bool = True, quick: bool = False,
              clock: str = "perf_counter", recording: Recorder = shipped, series: bool = False) -> dict[str, Any]:
    """Every configuration at every running count, against the installed
    vLLM release when hybridcache supports it (else hybridcache alone, on the
    oldest release's recordings); the report `format_report` shows."""
    from . import __version__

    start = time.perf_counter()
    release, note = tool_release("hybridcache bench", use_vllm)
    name = release.version if release is not None else releases.DEFAULT.version
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
        results = []
        for c in configs:
            for r in runnings:
                progress.phase(f"load {c} @ {r}")
                rec = recording(c, r, steps, seed, name)
                results.append(run_recording(rec, release is not None, progress, clock=clock, series=series))
                del rec
    finally:
        gc.unfreeze()
    return {
        "hybridcache": __version__, "vllm": release.version if release is not None else None, "vllm_note": note,
        "quick": quick, "clock": clock, "binding": binding_text(), "load_average": _loadavg(), "seed": seed,
        "python": sys.version.split()[0], "cpu_count": os.cpu_count(), "results": results, "skipped": skipped,
        "seconds": time.perf_counter() - start,
    }


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
    parser.add_argument("--quick", action="store_true", help="a short run: 20 measured steps, 64 and 256 running")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout (no table)")
    parser.add_argument("--config", action="append", choices=CONFIGS, dest="configs",
                        help="configuration to run (repeatable; default: all)")
    parser.add_argument("--running", type=str, default=None,
                        help="running-request counts, comma-separated (default 64,256,1024; --quick 64,256)")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"measured steps per configuration (default {STEPS}; --quick 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-vllm", action="store_true", help="run hybridcache only, even if vLLM is importable")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="perf_counter",
                        help="timer around each call: perf_counter (wall, default) or thread_time "
                        "(this thread's CPU time: ignores time the OS ran other processes, on a busy machine)")
    dev = parser.add_argument_group(f"with {DEV}")
    dev.add_argument("--plot", metavar="PNG", help="draw per-step latency distributions into PNG (and matplotlib)")
    dev.add_argument("--scale-blocks", type=int, default=0, metavar="N",
                     help="also time building a pool of N blocks and its bytes per block")
    dev.add_argument("--batched", action="store_true",
                     help="also time the batched decode API against a release's per-request decode calls")


def development_part(args: Any, runnings: Sequence[int], steps: int) -> str | None:
    """What of the request only the development package runs, or None."""
    for flag in ("plot", "scale_blocks", "batched"):
        if getattr(args, flag):
            return f"--{flag.replace('_', '-')}"
    if not all(ships(r, steps, args.seed) for r in runnings):
        return "a workload the wheel does not ship (another --seed, --running or more --steps)"
    return None


def finish(report: dict[str, Any], as_json: bool, extra: Iterable[str] = ()) -> int:
    """Prints the report (JSON, or the table and `extra` lines) and the
    skipped configurations; the exit status."""
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join([format_report(report), *extra]))
    for s in report["skipped"]:
        print(f"hybridcache bench: {s['config']} skipped on vLLM {report['vllm']}: {s['reason']}", file=sys.stderr)
    if not report["results"]:
        print("hybridcache bench: nothing to run: every configuration asked for was skipped", file=sys.stderr)
        return 2
    return 1 if any(r.get("verified") is False for r in report["results"]) else 0


def main(args: Any) -> int:
    try:
        runnings = _int_list(args.running) if args.running else ([64, 256] if args.quick else list(RUNNING))
    except ValueError as e:
        print(f"hybridcache bench: --running: {e}", file=sys.stderr)
        return 2
    steps = args.steps if args.steps is not None else (20 if args.quick else STEPS)
    if steps <= 0 or args.scale_blocks < 0:
        print(f"hybridcache bench: --{'steps' if steps <= 0 else 'scale-blocks'} must be positive", file=sys.stderr)
        return 2
    part = development_part(args, runnings, steps)
    if part is not None:
        # Said before a long run, not after it.
        if importlib.util.find_spec("hybridcache_dev") is None:
            print(f"hybridcache bench: {part} needs {DEV}", file=sys.stderr)
            return 2
        from hybridcache_dev.bench import main as development_main

        return development_main(args, runnings, steps)
    # Whatever vLLM (or anything else) logs goes to stderr, not into the table
    # / JSON, and only its errors: vLLM's and torch's warnings are quiet.
    with contextlib.redirect_stdout(sys.stderr), quiet_logs():
        report = run_bench(configs=args.configs or CONFIGS, runnings=runnings, steps=steps, seed=args.seed,
                           use_vllm=not args.no_vllm, show_progress=not args.no_progress, quick=args.quick,
                           clock=args.clock)
    return finish(report, args.json)
