"""The vLLM oracle as the fuzz and the tests see it: the releases the
differential fuzz replays, the installed one, a test module's skip when
another release (or none) is installed, and the one-line message a tool
gives when vLLM, torch or another optional package is missing."""

from __future__ import annotations

from typing import Any

from hybridcache import releases
from hybridcache.tools.oracle import load_vllm

# The releases the tools' call-by-call comparison runs against.
ORACLE_RELEASES: tuple[releases.Release, ...] = tuple(r for r in releases.RELEASES if r.tools_oracle)
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


def missing(tool: str, what: str, hint: str, why: str = "") -> str:
    """The one line a tool prints when an optional package is missing."""
    return f"{tool}: needs {what} ({hint})" + (f"; {why}" if why else "")


def vllm_missing(tool: str, accepted: Any = None) -> str | None:
    """None when a vLLM the tools compare against (or one of `accepted`)
    imports; else the one line `tool` prints (on stderr, no traceback)
    before it exits with status 2."""
    rows = ORACLE_RELEASES if accepted is None else tuple(accepted)
    version, note = load_vllm(rows)
    if version is not None:
        return None
    hint = " or ".join(r.install_hint for r in rows)
    return missing(tool, f"vLLM {' or '.join(r.version for r in rows)} and torch", hint, note)
