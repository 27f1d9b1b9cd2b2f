"""The vLLM oracle as the fuzz and the tests see it: the releases the
differential fuzz replays, the installed one, and a test module's skip
when another release (or none) is installed."""

from __future__ import annotations

from typing import Any

from hybridcache import releases
from hybridcache.tools.oracle import load_vllm

# The releases the differential fuzz replays (`--release`, `release_api`).
FUZZ_RELEASES: tuple[str, ...] = releases.SUPPORTED_VLLM_VERSIONS


def installed_vllm_version() -> str | None:
    """The installed vLLM's release (imported quietly, local label dropped)
    when it is one hybridcache supports, else None."""
    version, _ = load_vllm(releases.RELEASES)
    return None if version is None else releases.release_version(version)


def module_needs_vllm(version: str) -> Any:
    """For a test module that compares against vLLM `version`: the vLLM
    module, or the whole module skipped (with the installed version named)
    where another release or none is installed."""
    import pytest

    vllm = pytest.importorskip("vllm", reason=f"needs vLLM {version}")
    if releases.find(vllm.__version__) is not releases.find(version):
        pytest.skip(f"needs vLLM {version}, found {vllm.__version__}", allow_module_level=True)
    return vllm
