"""What `hybridcache bench` hands to this package: the workloads the wheel
does not ship (another seed, running count or length, recorded live by
`bench_trace.record`), the pool-scale figures (`pool_scale`), the batched
decode API (`bench_batched`) and ``--plot`` (`bench_plot`). The table and
the JSON are the wheel's (`hybridcache.bench.finish`), with these parts added.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import Any

from hybridcache import bench, releases
from hybridcache.tools.bench_trace import CONFIGS, load
from hybridcache.tools.oracle import quiet_logs

from . import bench_plot
from .bench_batched import batched_section, format_batched
from .bench_trace import Workload, record
from .pool_scale import format_scale, scale_figures


def recording(config: str, running: int, steps: int, seed: int, release: str) -> bench.Recording:
    """The wheel's recording of the workload where it ships one, else recorded now."""
    rec = load(config, running, steps, seed, release)
    return rec if rec is not None else record(Workload(config=config, running=running, steps=steps, seed=seed,
                                                       release=release))


def main(args: Any, runnings: Sequence[int], steps: int) -> int:
    """`hybridcache bench` with the parts the wheel leaves to this package."""
    if args.plot:
        why = bench_plot.matplotlib_missing()
        if why:  # said before a long run, not after it
            print(f"hybridcache bench: {why}", file=sys.stderr)
            return 2
    extra: list[str] = []
    with contextlib.redirect_stdout(sys.stderr), quiet_logs():
        report = bench.run_bench(configs=args.configs or CONFIGS, runnings=runnings, steps=steps, seed=args.seed,
                                 use_vllm=not args.no_vllm, show_progress=not args.no_progress, quick=args.quick,
                                 clock=args.clock, recording=recording, series=bool(args.plot))
        release = releases.find(report["vllm"]) if report["vllm"] else None
        if args.scale_blocks:
            report["scale"] = scale_figures(release is not None, args.scale_blocks,
                                            (release or releases.DEFAULT).version)
            extra += ["", *format_scale(report["scale"])]
        if args.batched and release is not None:
            # hybridcache's own API, timed against the release's per-request decode calls.
            rows, note = batched_section(release, report_configs(report), runnings, min(steps, 100), args.seed)
            report["batched"], report["batched_note"] = rows, note
            extra += ["", format_batched(rows, release.version) if rows else str(note)]
        why = bench_plot.plot(report, args.plot) if args.plot else None
    if args.plot:
        print(why or f"plot written to {args.plot}", file=sys.stderr)
    return bench.finish(report, args.json, extra)


def report_configs(report: dict[str, Any]) -> list[str]:
    """The configurations the report ran, in order."""
    return list(dict.fromkeys(r["config"] for r in report["results"]))
