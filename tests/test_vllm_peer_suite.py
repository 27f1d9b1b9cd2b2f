"""vLLM's own tests of the installed release (tests/v1/core; for 0.23.0
test_prefix_caching.py), run against that release's hybridcache facade by
scripts/run_vllm_peer_tests.py.

Needs the tests fetched from vLLM's sdist first (`bash
scripts/fetch_vllm_tests.sh VERSION`, into .cache/vllm-tests/VERSION) and a
vLLM whose release has a facade (hybridcache.releases); skipped otherwise,
saying which. Every case that uses only the public manager API must pass;
cases that reach into vLLM internals are classified by the script."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from hybridcache import releases

pytestmark = pytest.mark.vllm()  # whichever release is installed: its own tests

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "run_vllm_peer_tests.py"


def _installed() -> str | None:
    try:
        return releases.release_version(metadata.version("vllm"))
    except metadata.PackageNotFoundError:
        return None


def test_vllm_prefix_caching_suite_public_api_passes(tmp_path: Path) -> None:
    release = _installed()
    if release is None:
        pytest.skip("vLLM is not installed")
    if releases.find(release) is None:
        pytest.skip(f"vLLM {release} has no hybridcache facade yet (hybridcache.releases); its baseline: "
                    "python scripts/run_vllm_peer_tests.py --against-vllm")
    tests_dir = ROOT / ".cache" / "vllm-tests" / release
    if not (tests_dir / "tests" / "v1" / "core" / "test_prefix_caching.py").is_file():
        pytest.skip(f"vLLM {release}'s tests not fetched ({tests_dir} missing): "
                    f"run `bash scripts/fetch_vllm_tests.sh {release}`")
    report = tmp_path / "vllm-peer-report.txt"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--release", release, "--tests-dir", str(tests_dir), "--report", str(report)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode == 2:
        pytest.fail(f"the peer suite could not run:\n{proc.stderr[-3000:]}")
    text = report.read_text() if report.exists() else proc.stdout
    assert proc.returncode == 0, f"public-API cases diverge from vLLM {release}:\n{text}\n{proc.stderr[-3000:]}"
    assert "public-API-only cases:" in text


@pytest.mark.vllm("0.33.0")
def test_vllm_033_tests_run_offline_against_vllm_itself() -> None:
    """The harness for 0.33.0 (its fetched files, VLLM_TARGET_DEVICE=cpu, the
    offline opt-125m config, the scheduler-built manager) runs two of its
    scheduler files against vLLM's own manager, every case passing: the
    baseline the swap mode is read against (the whole baseline,
    `--against-vllm` without --file, takes a few minutes)."""
    tests_dir = ROOT / ".cache" / "vllm-tests" / "0.33.0"
    if not (tests_dir / "tests" / "v1" / "core" / "test_scheduler.py").is_file():
        pytest.skip(f"vLLM 0.33.0's tests not fetched ({tests_dir} missing): "
                    "run `bash scripts/fetch_vllm_tests.sh 0.33.0`")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--against-vllm", "--tests-dir", str(tests_dir),
         "--file", "test_swa_inflight_window_free.py", "--file", "test_deferred_block_free.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "25 passed, 0 cannot run offline on CPU (OFFLINE), 0 not passed otherwise" in proc.stdout


@pytest.mark.vllm("0.34.0")
def test_vllm_034_tests_run_offline_against_vllm_itself() -> None:
    """The same for 0.34.0, whose CPU platform refuses to build a VllmConfig
    on x86 without triton-cpu: every one of these cases builds one through
    `create_scheduler`, so they pass only with the runner's triton-cpu plugin
    (tests/vllm_cpu_triton.py) letting that refusal through."""
    tests_dir = ROOT / ".cache" / "vllm-tests" / "0.34.0"
    if not (tests_dir / "tests" / "v1" / "core" / "test_scheduler.py").is_file():
        pytest.skip(f"vLLM 0.34.0's tests not fetched ({tests_dir} missing): "
                    "run `bash scripts/fetch_vllm_tests.sh 0.34.0`")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--against-vllm", "--tests-dir", str(tests_dir),
         "--file", "test_swa_inflight_window_free.py", "--file", "test_deferred_block_free.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "25 passed, 0 cannot run offline on CPU (OFFLINE), 0 not passed otherwise" in proc.stdout
