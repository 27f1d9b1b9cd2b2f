"""The tools' behaviour at their edges (issue 18): a missing optional
package is said in one line with a non-zero exit and no traceback; the
plot has a title, a caption and labelled ticks on every panel; `replay`
keeps vLLM's and torch's log lines out of its output; importing the tools
imports neither vLLM nor torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hybridcache
from hybridcache_dev.bench_plot import _log_ticks

PACKAGE_ROOT = str(Path(hybridcache.__file__).resolve().parents[1])


def _run(code: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


def _without(*modules: str) -> str:
    """Code that makes `modules` unimportable (as if not installed)."""
    return "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules)


def test_fuzz_without_vllm_says_so_in_one_line() -> None:
    out = _run(_without("vllm", "torch") + (
        "sys.argv = ['python -m hybridcache_dev.fuzz', '--ops', '10']\n"
        "import runpy\n"
        "runpy.run_module('hybridcache_dev.fuzz', run_name='__main__')\n"
    ))
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert "needs vLLM 0.23.0 and torch" in lines[0] and "pip install vllm==0.23.0" in lines[0]
    assert out.stdout == ""


def test_bench_plot_without_matplotlib_fails_clearly() -> None:
    out = _run(_without("matplotlib") + (
        "from hybridcache.__main__ import main\n"
        "raise SystemExit(main(['bench', '--no-vllm', '--plot', 'x.png', '--steps', '1', '--running', '4']))\n"
    ))
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "matplotlib" in lines[0] and "pip install 'vllm-hybridcache[plot]'" in lines[0]


@pytest.mark.parametrize("flag", [["--plot", "x.png"], ["--scale-blocks", "100"]])
def test_bench_without_the_development_package_says_so_in_one_line(flag: list[str]) -> None:
    out = _run(_without("hybridcache_dev") + (
        "from hybridcache.__main__ import main\n"
        f"raise SystemExit(main(['bench', '--no-vllm', '--steps', '1', '--running', '4', *{flag!r}]))\n"
    ))
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"{flag[0]} needs hybridcache's development package (pip install -e dev" in lines[0]


def test_bench_without_the_development_package_leaves_out_the_pool_figures() -> None:
    out = _run(_without("hybridcache_dev") + (
        "from hybridcache.__main__ import main\n"
        "raise SystemExit(main(['bench', '--no-vllm', '--no-progress', '--steps', '2', '--config', 'full']))\n"
    ))
    assert out.returncode == 0, out.stderr
    assert "full: full attention" in out.stdout and "pool of" not in out.stdout


def test_bench_without_vllm_has_no_vllm_legend() -> None:
    out = _run(_without("vllm", "torch") + (
        "from hybridcache.__main__ import main\n"
        "raise SystemExit(main(['bench', '--no-progress', '--steps', '2', '--running', '4', "
        "'--scale-blocks', '100', '--config', 'full']))\n"
    ))
    assert out.returncode == 0, out.stderr
    assert "hybridcache only" in out.stdout
    assert "x = vLLM" not in out.stdout and "vLLM p50" not in out.stdout


def test_tools_import_neither_vllm_nor_torch() -> None:
    out = _run(
        "import sys\n"
        "import hybridcache, hybridcache.tools, hybridcache.replay, hybridcache.bench, hybridcache_dev.fuzz\n"
        "import hybridcache_dev.bench_batched, hybridcache.bench_report, hybridcache_dev.bench_plot\n"
        "print(sorted(m for m in ('vllm', 'torch', 'matplotlib') if m in sys.modules))\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("lo,hi", [(30.0, 45.0), (3.0, 3000.0), (0.5, 0.9), (100.0, 100.0)])
def test_log_ticks_label_every_range(lo: float, hi: float) -> None:
    ticks = _log_ticks(lo, hi)
    assert ticks and ticks == sorted(set(ticks))
    assert len(ticks) >= (2 if hi > lo * 1.05 else 1)
    assert all(lo * 0.9 <= t <= hi * 1.1 for t in ticks)


def test_plot_has_title_caption_and_ticks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from hybridcache_dev import bench_plot

    figures = []
    monkeypatch.setattr(plt, "close", lambda fig: figures.append(fig))
    steps = [float(20 + i % 7) for i in range(30)]
    impl = {"step_us_all": steps}
    report = {
        "hybridcache": "0", "vllm": None, "seed": 0, "clock": "perf_counter",
        "results": [
            {"config": c, "running": n, "warmup_steps": 5, "impls": {"hybridcache": impl}}
            for c in ("full", "full+swa") for n in (8, 16)
        ],
    }
    assert bench_plot.plot(report, str(tmp_path / "p.png")) is None
    (fig,) = figures
    assert fig._suptitle is not None and "bench" in fig._suptitle.get_text()
    assert any("ECDF" in t.get_text() for t in fig.texts)
    axes = [ax for ax in fig.axes if ax.has_data()]
    assert len(axes) == 4
    for ax in axes:
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert len(labels) >= 2, labels


@pytest.mark.vllm("0.23.0")
@pytest.mark.usefixtures("vllm_available")
def test_replay_keeps_vllm_and_torch_logs_out() -> None:
    out = _run(
        "from hybridcache.__main__ import main\n"
        "raise SystemExit(main(['replay', '--requests', '60']))\n"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "verified identical to vLLM 0.23.0" in out.stdout
    assert "Failed to reset prefix cache" not in out.stderr + out.stdout
    assert "deprecated" not in out.stderr, out.stderr[-2000:]
    assert len(out.stdout.strip().splitlines()) == 3
