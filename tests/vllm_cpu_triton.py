"""pytest plugin: vLLM's CPU platform on an x86 machine without triton-cpu.

Where vLLM's `CpuPlatform.check_and_update_config` refuses to go on when
`vllm.triton_utils.HAS_TRITON` is false (vLLM 0.34.0: "RuntimeError: vLLM on
x86 CPUs requires Triton (triton-cpu)"), every `VllmConfig` built on a CPU
machine with PyPI's torch fails: its Triton is the CUDA build, unusable
without a GPU driver, and triton-cpu is not on PyPI. Scheduler and
KV-cache-manager tests build a `VllmConfig` but run no Triton kernel.

The plugin wraps that classmethod where its code reads HAS_TRITON (vLLM
0.33.0's only logs a warning; 0.23.0's does not read it). A call runs as
vLLM's; only when it refuses with a RuntimeError naming Triton while
HAS_TRITON is false (the behaviour, not vLLM's version, decides) is the same
call made again with HAS_TRITON reading true, and the flag is restored right
after. vLLM 0.34.0 refuses before it changes anything in the config (it has
read only `model_config`), so the second call starts from the same state.
Everything else, the kernels included, sees the real value.

Load it with `-p vllm_cpu_triton` (this directory on sys.path), as
scripts/run_vllm_peer_tests.py does, or call `install()`.
"""

from __future__ import annotations

import functools
import types
from typing import Any

_NAME = "HAS_TRITON"
# How many calls vLLM refused for lack of Triton and the plugin let through.
REFUSALS_PASSED = 0
_MARK = "_hybridcache_triton_cpu_shim"


def reads_has_triton(func: Any) -> bool:
    """Whether `func`'s code (or a function nested in it) names HAS_TRITON."""
    code = getattr(func, "__code__", None)
    stack = [code] if code is not None else []
    while stack:
        c = stack.pop()
        if _NAME in c.co_names:
            return True
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return False


def _cpu_platform() -> type | None:
    try:
        from vllm.platforms.cpu import CpuPlatform
    except ImportError:  # no vLLM, or one without a CPU platform
        return None
    return CpuPlatform


def install() -> bool:
    """Wraps CpuPlatform.check_and_update_config where its code reads
    HAS_TRITON; True iff it is wrapped (now or before)."""
    platform = _cpu_platform()
    if platform is None:
        return False
    raw = platform.__dict__.get("check_and_update_config")
    if not isinstance(raw, classmethod):
        return False
    func = raw.__func__
    if getattr(func, _MARK, False):
        return True
    if not reads_has_triton(func):
        return False

    @functools.wraps(func)
    def check_and_update_config(cls: type, vllm_config: Any) -> Any:
        # The classmethod imports HAS_TRITON from vllm.triton_utils when it
        # runs, so the module attribute is what it reads.
        import vllm.triton_utils as triton_utils

        try:
            return func(cls, vllm_config)
        except RuntimeError as e:
            if getattr(triton_utils, _NAME) or "triton" not in str(e).lower():
                raise
        global REFUSALS_PASSED
        REFUSALS_PASSED += 1
        saved = getattr(triton_utils, _NAME)
        setattr(triton_utils, _NAME, True)
        try:
            return func(cls, vllm_config)
        finally:
            setattr(triton_utils, _NAME, saved)

    setattr(check_and_update_config, _MARK, True)
    check_and_update_config.__dict__["_original"] = raw
    platform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign]
    return True


def uninstall() -> None:
    """Puts the original classmethod back (no-op where none was wrapped)."""
    platform = _cpu_platform()
    raw = platform.__dict__.get("check_and_update_config") if platform is not None else None
    if isinstance(raw, classmethod) and getattr(raw.__func__, _MARK, False):
        platform.check_and_update_config = raw.__func__.__dict__["_original"]  # type: ignore[union-attr]


def pytest_configure(config: Any) -> None:
    config.stash[_KEY] = install()


def pytest_report_header(config: Any) -> str | None:
    if config.stash.get(_KEY, False):
        return ("vllm_cpu_triton: CpuPlatform.check_and_update_config wrapped (a refusal for lack of "
                "triton-cpu is retried with HAS_TRITON read as true)")
    return None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REFUSALS_PASSED:
        terminalreporter.write_line(
            f"vllm_cpu_triton: {REFUSALS_PASSED} VllmConfig check(s) refused for lack of triton-cpu, let through")


def pytest_unconfigure(config: Any) -> None:
    if config.stash.get(_KEY, False):
        uninstall()


try:
    import pytest

    _KEY: Any = pytest.StashKey[bool]()
except ImportError:  # install() / uninstall() used without pytest
    _KEY = None
