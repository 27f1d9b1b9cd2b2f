"""What `hybridcache bench` shows: the table (`format_report`) and the
progress lines on stderr (`Progress`)."""

from __future__ import annotations

import math
import sys
from typing import Any

from .tools.bench_trace import CONFIG_TITLES


class Progress:
    """Progress on stderr: one line per phase, with the share of the work done."""

    def __init__(self, total: float, enabled: bool = True):
        self.total, self.done, self.enabled = total, 0.0, enabled

    def phase(self, desc: str) -> None:
        if self.enabled:
            print(f"[{100 * self.done / max(self.total, 1):3.0f}%] {desc}", file=sys.stderr, flush=True)

    def advance(self, n: float) -> None:
        self.done += n


def _fmt(v: float | None, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.{digits}f}"


def binding_text() -> str:
    """Which binding this build has, as the benches print it: a build
    without the raw-ffi feature gives the same answers through PyO3 alone,
    at several times the cost of a hot call."""
    from hybridcache import _native

    safe = "binding safe (built without raw-ffi: every call through PyO3, slower)"
    return "binding raw-ffi" if _native.RAW_FFI else safe


def format_report(report: dict[str, Any]) -> str:
    lines: list[str] = []
    vllm = report.get("vllm")
    header = f"hybridcache {report['hybridcache']} bench"
    header += f" vs vLLM {vllm}" if vllm else f" ({report.get('vllm_note', 'vLLM not installed')}: hybridcache only)"
    header += f", seed {report['seed']}{', --quick' if report['quick'] else ''}, clock {report.get('clock')}"
    load, cpus = report.get("load_average"), report.get("cpu_count")
    if load:
        header += f", load {load[0]:.1f} on {cpus} CPUs"
    lines.append(f"{header}, {report['binding']}")
    if load and cpus and max(load) > cpus:
        lines.append("warning: the machine is busy (load > CPUs); wall-clock figures inflate long steps more "
                     "than short ones. --clock thread_time counts this thread's CPU time only.")
    lines.append(
        "µs in manager calls per scheduler step (p50/p90 over the measured steps) and per call (p50 over them); "
        + ("x = vLLM / hybridcache. " if vllm else "")
        + "decode allocate_slots includes the scheduler's get_block_ids(allow_none=True) of its result; "
        "the timer's own cost (median empty interval) is subtracted from every call."
    )
    cols = ["running", "steps", "preempt", "hc p50", "hc p90"]
    if vllm:
        cols += ["vLLM p50", "vLLM p90", "x p50", "x p90"]
    cols += ["decode alloc", "get_computed", "free"]
    by_config: dict[str, list[dict[str, Any]]] = {}
    for r in report["results"]:
        by_config.setdefault(r["config"], []).append(r)
    for config, results in by_config.items():
        lines += ["", f"{config}: {CONFIG_TITLES.get(config, config)}"]
        rows = [cols]
        notes = []
        for r in results:
            row = [str(r["running"]), str(r["steps"]), str(r["trace"]["preemptions"])]
            if "impls" not in r:
                row += ["DIVERGED"] + ["-"] * (len(cols) - 4)
                notes.append(f"  running={r['running']}: {r.get('divergence', '?')}")
                rows.append(row)
                continue
            hc = r["impls"]["hybridcache"]
            row += [_fmt(hc["step"]["p50_us"]), _fmt(hc["step"]["p90_us"])]
            if vllm:
                vl = r["impls"]["vllm"]
                sp = r["speedup"]
                row += [_fmt(vl["step"]["p50_us"]), _fmt(vl["step"]["p90_us"]),
                        *("-" if x is None else f"{x:.1f}x" for x in (sp["step_p50"], sp["step_p90"]))]
            for k in ("decode_allocate_slots", "get_computed_blocks", "free"):
                # hybridcache's, then vLLM's where it ran (the implementations' order)
                row.append(" / ".join(_fmt(impl["calls"][k]["p50_us"], 2) for impl in r["impls"].values()))
            rows.append(row)
        widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
        for row in rows:
            lines.append("  " + "  ".join(c.rjust(wd) for c, wd in zip(row, widths)))
        if vllm:
            lines.append("  (per-call columns: hybridcache / vLLM µs)")
        lines.extend(notes)
    verified = [r for r in report["results"] if r.get("verified")]
    diverged = [r for r in report["results"] if r.get("verified") is False]
    lines.append("")
    if diverged:
        lines.append(f"DIVERGED in {len(diverged)} configuration(s)")
    elif vllm:
        lines.append(f"verified: identical block tables, hit lengths, stats and free-block counts to vLLM {vllm} "
                     f"in all {len(verified)} configurations ({sum(r['ops'] for r in verified):,} calls each)")
    lines.append(f"total time {report['seconds']:.1f} s")
    return "\n".join(lines)
