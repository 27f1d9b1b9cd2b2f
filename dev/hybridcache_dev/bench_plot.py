"""`hybridcache bench --plot PNG`: per-step latency distributions of the
bench's report, drawn with matplotlib (``pip install 'vllm-hybridcache[plot]'``).
The wheel's bench calls `plot` when this package is installed."""

from __future__ import annotations

import math
from typing import Any

PLOT_HINT = "pip install 'vllm-hybridcache[plot]' (or: pip install matplotlib)"


def matplotlib_missing() -> str | None:
    """None if matplotlib imports, else the one line saying how to get it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"--plot needs matplotlib, which is not installed: {PLOT_HINT}"
    return None


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
