"""vLLM 0.23.0's own tests/v1/core/test_prefix_caching.py, run against
hybridcache.KVCacheManager by scripts/run_vllm_peer_tests.py.

Needs the tests fetched from vLLM's sdist first (`bash
scripts/fetch_vllm_tests.sh`, into .cache/vllm-tests) and vLLM 0.23.0
importable; skipped otherwise. Every case that uses only the public manager API
must pass; cases that reach into vLLM internals are classified by the script."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "run_vllm_peer_tests.py"
TESTS_DIR = ROOT / ".cache" / "vllm-tests"
TEST_FILE = TESTS_DIR / "tests" / "v1" / "core" / "test_prefix_caching.py"


def test_vllm_prefix_caching_suite_public_api_passes(tmp_path: Path) -> None:
    if not TEST_FILE.is_file():
        pytest.skip(f"vLLM's tests not fetched ({TEST_FILE} missing): run `bash scripts/fetch_vllm_tests.sh`")
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM 0.23.0 is not installed")
    report = tmp_path / "vllm-peer-report.txt"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--tests-dir", str(TESTS_DIR), "--report", str(report)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode == 2:
        pytest.fail(f"the peer suite could not run:\n{proc.stderr[-3000:]}")
    text = report.read_text() if report.exists() else proc.stdout
    assert proc.returncode == 0, f"public-API cases diverge from vLLM:\n{text}\n{proc.stderr[-3000:]}"
    assert "public-API-only cases:" in text
