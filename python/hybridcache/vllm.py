"""Plugging hybridcache into vLLM 0.23.0's scheduler.

`install()` rebinds the name `KVCacheManager` in
`vllm.v1.core.sched.scheduler`, so every `Scheduler` (and `AsyncScheduler`)
built afterwards constructs hybridcache's manager; `uninstall()` restores
vLLM's. `register()` is the `vllm.general_plugins` entry point: it installs
when the environment variable HYBRIDCACHE_ENABLE=1.

This module is `hybridcache.vllm`; all imports of vLLM below are absolute, so
they resolve to the real `vllm` package.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from hybridcache.coordinator import CoordinatorView
from hybridcache.manager import KVCacheManager

SUPPORTED_VLLM_VERSION = "0.23.0"
ENABLE_ENV = "HYBRIDCACHE_ENABLE"
_SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_original: Any = None  # vLLM's class while installed, else None


class VllmKVCacheManager(KVCacheManager):
    """hybridcache's manager as vLLM's scheduler constructs it (after
    `install()`): `KVCacheManager` with vLLM's keyword arguments, plus the
    `coordinator` view the scheduler reads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """The arguments of `KVCacheManager`."""
        super().__init__(*args, **kwargs)
        if getattr(self, "coordinator", None) is None:
            self.coordinator = CoordinatorView(self)


def vllm_version() -> str | None:
    """The installed vLLM's version (imports vLLM), or None without vLLM."""
    try:
        import vllm
    except ImportError:
        return None
    return getattr(vllm, "__version__", None)


def check_vllm_version() -> None:
    """Raises RuntimeError unless the installed vLLM is 0.23.0."""
    version = vllm_version()
    if version is None:
        raise RuntimeError(f"hybridcache.vllm.install() needs vLLM {SUPPORTED_VLLM_VERSION}, but vLLM is not installed")
    if version.split("+", 1)[0] != SUPPORTED_VLLM_VERSION:
        raise RuntimeError(
            f"hybridcache supports vLLM {SUPPORTED_VLLM_VERSION} only (it replaces that version's "
            f"KVCacheManager); the installed vLLM is {version}"
        )


def _scheduler_module() -> Any:
    import importlib

    return importlib.import_module(_SCHEDULER_MODULE)


def install() -> None:
    """Makes vLLM 0.23.0's `Scheduler` build hybridcache's KV-cache manager.
    Idempotent; affects schedulers constructed afterwards."""
    global _original
    check_vllm_version()
    module = _scheduler_module()
    with _lock:
        if _original is not None:
            return
        current = module.KVCacheManager
        if current is VllmKVCacheManager:  # installed by an earlier copy of this module
            return
        _original = current
        module.KVCacheManager = VllmKVCacheManager
    logger.info("hybridcache: vLLM's Scheduler now uses hybridcache.KVCacheManager")


def uninstall() -> None:
    """Restores vLLM's own `KVCacheManager` in the scheduler module (no-op if
    not installed). Schedulers already built keep their manager."""
    global _original
    with _lock:
        if _original is None:
            return
        module = _scheduler_module()
        if module.KVCacheManager is VllmKVCacheManager:
            module.KVCacheManager = _original
        _original = None


def is_installed() -> bool:
    """Whether vLLM's scheduler module currently builds hybridcache's manager."""
    import sys

    module = sys.modules.get(_SCHEDULER_MODULE)
    return module is not None and getattr(module, "KVCacheManager", None) is VllmKVCacheManager


def register() -> None:
    """`vllm.general_plugins` entry point: installs iff HYBRIDCACHE_ENABLE=1."""
    value = os.environ.get(ENABLE_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        install()
    elif value not in ("", "0", "false", "no", "off"):
        raise ValueError(f"{ENABLE_ENV} must be 1 or 0, got {os.environ[ENABLE_ENV]!r}")
