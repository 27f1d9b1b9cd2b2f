"""The `hybridcache` command: `bench --quick --json` gives sane JSON (no timing
assertions), `replay` runs the embedded default trace, and a tampered
recording is caught by the bench's verification."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridcache import bench, releases
from hybridcache.__main__ import main
from hybridcache.tools import bench_trace
from hybridcache.tools.timed_replay import KINDS
from hybridcache_dev.bench_trace import Workload, record

ROOT = Path(__file__).resolve().parents[1]


def _release():
    """The installed vLLM release the tools compare against, or None."""
    release, _ = bench.tool_release("test")
    return release


def _vllm_ok() -> bool:
    return _release() is not None


def test_bench_quick_json(capsys):
    assert main(["bench", "--quick", "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    release = _release()
    with_vllm = release is not None
    assert report["vllm"] == (release.version if with_vllm else None)
    assert report["quick"] is True
    results = report["results"]
    covered = [c for c in bench.CONFIGS if release is None or release.covers(c)]
    assert [(r["config"], r["running"]) for r in results] == [(c, n) for c in covered for n in (64, 256)]
    assert [s["config"] for s in report["skipped"]] == [c for c in bench.CONFIGS if c not in covered]
    for r in results:
        assert r["verified"] is True, r.get("divergence")
        assert r["compared"] == (["hybridcache", "vllm"] if with_vllm else ["hybridcache"])
        assert r["steps"] == 20 and r["ops"] > r["steps"]
        assert 0 < r["mean_running"] <= r["running"]
        trace = r["trace"]
        assert trace["admitted"] > 0 and trace["decode_allocs"] > 0 and trace["hit_tokens"] >= 0
        for name in r["compared"]:
            impl = r["impls"][name]
            assert impl["step"]["count"] == r["steps"]
            assert 0 < impl["step"]["p50_us"] <= impl["step"]["p90_us"]
            assert "step_us_all" not in impl  # per-step series stay out of the JSON
            for kind in KINDS:
                assert kind in impl["calls"]
            decode = impl["calls"]["decode_allocate_slots"]
            assert decode["count"] > 0 and decode["p50_us"] >= 0
        if with_vllm:
            assert r["speedup"]["step_p50"] > 0
            assert set(r["speedup"]) >= {"step_p50", "step_p90", "decode_allocate_slots", "get_computed_blocks", "free"}
    assert "scale" not in report and "batched" not in report  # the development package's parts


def test_bench_pool_scale_figures(capsys):
    """--scale-blocks (the development package): build time and bytes per block of a pool."""
    assert main(["bench", "--quick", "--json", "--no-progress", "--config", "full", "--running", "64",
                 "--scale-blocks", "100000"]) == 0
    report = json.loads(capsys.readouterr().out)
    scale = report["scale"]["hybridcache"]
    assert scale["num_blocks"] == 100_000 and scale["build_ms"] > 0
    assert scale["free_blocks"] == 100_000 - 1  # the null block is never free
    if report["vllm"]:
        assert report["scale"]["vllm"]["free_blocks"] == 100_000 - 1


def test_bench_table_and_plot(tmp_path, capsys):
    """The human-readable table, and --plot (or a clear note without matplotlib)."""
    png = tmp_path / "steps.png"
    args = ["bench", "--no-vllm", "--no-progress", "--running", "8", "--steps", "3", "--scale-blocks", "1000",
            "--config", "full", "--plot", str(png)]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        # Said before the run, in one line, with a non-zero exit.
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "matplotlib" in err and "pip install 'vllm-hybridcache[plot]'" in err
    else:
        assert main(args) == 0
        assert png.stat().st_size > 0
        capsys.readouterr()
    assert main(args[:-2]) == 0  # the table
    captured = capsys.readouterr()
    assert "full: full attention" in captured.out
    assert "hybridcache only" in captured.out
    assert "pool of 1,000 blocks (hybridcache)" in captured.out
    # No vLLM column, so no legend for one.
    assert "x = vLLM / hybridcache" not in captured.out


def test_bench_catches_a_wrong_block_table():
    rec = record(Workload(config="full+swa", running=8, steps=5))
    step, i = next(
        (s, i) for s, ops in enumerate(rec.steps) for i, op in enumerate(ops)
        if op[0] == bench_trace.ALLOC_RUN and isinstance(op[5], tuple) and any(op[5])
    )
    code, idx, a, b, state, expected = rec.steps[step][i]
    tampered = tuple([*g, 999_999] for g in expected)
    rec.steps[step][i] = (code, idx, a, b, state, tampered)
    with pytest.raises(bench.BenchDivergence, match=f"step {step}"):
        bench.replay_timed(rec, [("hybridcache", bench_trace.make_hybridcache_manager)])


def test_a_shipped_recording_catches_a_wrong_allocation_outcome():
    """A shipped recording keeps whether each allocation got blocks."""
    rec = bench.shipped("full", 64, 3, 0, releases.DEFAULT.version)
    step, i = next((s, i) for s, ops in enumerate(rec.steps) for i, op in enumerate(ops)
                   if op[0] == bench_trace.ALLOC_RUN and op[5] == bench_trace.BLOCKS)
    code, idx, a, b, state, _ = rec.steps[step][i]
    rec.steps[step][i] = (code, idx, a, b, state, bench_trace.NO_BLOCKS)
    with pytest.raises(bench.BenchDivergence, match=f"differs from the recording at step {step}"):
        bench.replay_timed(rec, [("hybridcache", bench_trace.make_hybridcache_manager)])


def test_replay_subcommand(capsys):
    assert main(["replay"]) == 0
    out = capsys.readouterr().out
    assert "ops" in out and "steps" in out and "preemptions" in out and "hit tokens" in out
    release = _release()
    if release is not None:
        assert f"verified identical to vLLM {release.version}" in out
    else:  # no vLLM, or a release hybridcache does not support
        _, note = bench.tool_release("hybridcache replay")
        assert "ran hybridcache only" in out
        assert ("vLLM not installed" if note.startswith("vLLM not installed") else f"{note}: ran") in out


def test_replay_without_vllm(capsys):
    assert main(["replay", "--no-vllm", "--requests", "40"]) == 0
    assert "ran hybridcache only" in capsys.readouterr().out


def test_module_entry_point():
    # The same hybridcache this process imported (installed wheel or source tree).
    import hybridcache

    package_root = str(Path(hybridcache.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=package_root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "hybridcache", "--help"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "bench" in proc.stdout and "replay" in proc.stdout


def test_bench_batched_decode_api(capsys):
    """--batched (the development package): hybridcache's one-call decode APIs
    against the release's per-request calls, where its scheduler makes those."""
    release = _release()
    assert main(["bench", "--no-progress", "--config", "full", "--running", "64", "--steps", "5", "--batched"]) == 0
    out = capsys.readouterr().out
    if release is None:
        assert "batched decode API" not in out  # nothing to time it against
    elif release.per_request_decode:
        assert f"verified: every step's new block ids identical to vLLM {release.version}'s" in out
    else:
        assert f"batched decode API: not run on vLLM {release.version}" in out
