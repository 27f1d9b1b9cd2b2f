"""What `hybridcache bench` shows: the table (`format_report`), the plot
(`plot`, needs matplotlib: ``pip install 'vllm-hybridcache[plot]'``) and the
progress lines on stderr (`Progress`)."""

from __future__ import annotations

import math
import sys
from typing import Any

from .tools.bench_trace import CONFIG_TITLES

PLOT_HINT = "pip install 'vllm-hybridcache[plot]' (or: pip install matplotlib)"


def matplotlib_missing() -> str | None:
    """None if matplotlib imports, else the one line saying how to get it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"--plot needs matplotlib, which is not installed: {PLOT_HINT}"
    return None


class Progress:
    """Progress on stderr: one line per phase, with the share of the work done."""

    def __init__(self, total: float, enabled: bool = True):
        self.total, self.done, self.enabled = total, 0.0, enabled

    def phase(self, desc: str) -> None:
        if self.enabled:
            print(f"[{100 * self.done / max(self.total, 1):3.0f}%] {desc}", file=sys.stderr, flush=True)

    def advance(self, n: float) -> None:
        self.done += n

    def close(self) -> None:
        self.enabled = False


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def _fmt(v: float | None, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.{digits}f}"


def binding_text() -> str:
    """Which binding this build has, as the benches print it: a build
    without the raw-ffi feature gives the same answers through PyO3 alone,
    at several times the cost of a hot call."""
    from hybridcache import _native

    if _native.RAW_FFI:
        return "binding raw-ffi"
    return "binding safe (built without raw-ffi: every call through PyO3, slower)"


def _fmt_ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}x"


def format_report(report: dict[str, Any]) -> str:
    lines: list[str] = []
    vllm = report.get("vllm")
    header = f"hybridcache {report['hybridcache']} bench"
    header += f" vs vLLM {vllm}" if vllm else f" ({report.get('vllm_note', 'vLLM not installed')}: hybridcache only)"
    header += f", seed {report['seed']}{', --quick' if report['quick'] else ''}, clock {report.get('clock')}"
    load, cpus = report.get("load_average"), report.get("cpu_count")
    if load:
        header += f", load {load[0]:.1f} on {cpus} CPUs"
    if report.get("binding"):
        header += f", {report['binding']}"
    lines.append(header)
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
        lines.append("")
        lines.append(f"{config}: {CONFIG_TITLES.get(config, config)}")
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
                        _fmt_ratio(sp["step_p50"]), _fmt_ratio(sp["step_p90"])]
            for k in ("decode_allocate_slots", "get_computed_blocks", "free"):
                h = hc["calls"][k]["p50_us"]
                if vllm:
                    v = r["impls"]["vllm"]["calls"][k]["p50_us"]
                    row.append(f"{_fmt(h, 2)} / {_fmt(v, 2)}")
                else:
                    row.append(_fmt(h, 2))
            rows.append(row)
        widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
        for row in rows:
            lines.append("  " + "  ".join(c.rjust(wd) for c, wd in zip(row, widths)))
        if vllm:
            lines.append("  (per-call columns: hybridcache / vLLM µs)")
        lines.extend(notes)
    scale = report.get("scale")
    if scale:
        lines.append("")
        for name, s in scale.items():
            bpb = s["bytes_per_block"]
            lines.append(
                f"pool of {s['num_blocks']:,} blocks ({name}): built in {_fmt(s['build_ms'])} ms, "
                f"{'?' if bpb is None else _fmt(bpb)} bytes of metadata per block (RSS delta)"
            )
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


def _log_ticks(lo: float, hi: float, count: int = 4) -> list[float]:
    """About `count` round tick values spread geometrically over [lo, hi]
    (a log axis over less than a decade has no labelled ticks of its own)."""
    lo, hi = max(lo, 1e-3), max(hi, 1e-3)
    if hi <= lo * 1.05:
        return [float(f"{lo:.2g}")]
    ticks: list[float] = []
    for i in range(count):
        v = float(f"{lo * (hi / lo) ** (i / (count - 1)):.2g}")
        if not ticks or v > ticks[-1]:
            ticks.append(v)
    return ticks


def plot(report: dict[str, Any], path: str) -> str | None:
    """Per-step latency distributions (ECDF, log scale), one panel per
    configuration and batch size; None on success, else why nothing was drawn."""
    why = matplotlib_missing()
    if why:
        return why
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, NullLocator

    results = [r for r in report["results"] if "impls" in r]
    configs = list(dict.fromkeys(r["config"] for r in results))
    runnings = sorted({r["running"] for r in results})
    if not results:
        return "nothing to plot"
    fig, axes = plt.subplots(len(configs), len(runnings), figsize=(4.2 * len(runnings), 3.2 * len(configs) + 1.2),
                             squeeze=False)
    for r in results:
        ax = axes[configs.index(r["config"])][runnings.index(r["running"])]
        lo, hi = math.inf, 0.0
        for name, impl in r["impls"].items():
            v = sorted(impl["step_us_all"][r["warmup_steps"]:])
            if not v:
                continue
            lo, hi = min(lo, v[0]), max(hi, v[-1])
            ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=name)
        ax.set_xscale("log")
        if hi > 0:
            ticks = _log_ticks(lo, hi)
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticks(ticks)
            ax.set_xticklabels([f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ratio = (r.get("speedup") or {}).get("step_p50")
        ax.set_title(f"{r['config']}, {r['running']} running" + (f" (p50 {ratio:.1f}x)" if ratio else ""), fontsize=9)
        ax.set_xlabel("µs of manager calls per step")
        ax.set_ylabel("fraction of steps")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    for row in axes:  # panels no result fills
        for ax in row:
            if not ax.has_data():
                ax.set_axis_off()
    vllm = report.get("vllm")
    fig.suptitle(
        f"hybridcache {report.get('hybridcache', '?')} bench" + (f" vs vLLM {vllm}" if vllm else "")
        + f": manager time per scheduler step (seed {report.get('seed')}, clock {report.get('clock')})",
        fontsize=11,
    )
    caption = (
        "Each panel: the distribution (ECDF) of the µs spent in KV-cache manager calls per scheduler step, "
        "over the measured steps (warm-up left out), log x axis; one line per implementation."
    )
    if vllm:
        caption += " Panel titles: configuration, running requests and p50 ratio (vLLM / hybridcache)."
    fig.text(0.5, 0.01, caption, ha="center", va="bottom", fontsize=8, wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
