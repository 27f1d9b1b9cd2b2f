"""Plugging hybridcache into vLLM's scheduler, for each release in the table
of `hybridcache.releases`.

`install()` rebinds the name `KVCacheManager` in
`vllm.v1.core.sched.scheduler` to the facade class of the installed vLLM's
release, so every `Scheduler` (and `AsyncScheduler`) built afterwards
constructs hybridcache's manager; any other vLLM version raises a
RuntimeError listing the supported ones. It also rebinds
`get_request_block_hasher` in `vllm.v1.engine.core`, so the engine hashes
request blocks with hybridcache's native hasher (bit-identical for vLLM's four
hash functions; any other function keeps vLLM's hasher); a native hasher
also puts a native `append_output_token_ids` on vLLM's `Request` that hashes
appended tokens in the same call (`hybridcache.vllm_tokens`). `install(native_hashing=False)`
or HYBRIDCACHE_NATIVE_HASHING=0 keeps vLLM's hasher. `uninstall()` restores
both. `register()` is the `vllm.general_plugins` entry point: it installs
when the environment variable HYBRIDCACHE_ENABLE=1.

This module is `hybridcache.vllm`; all imports of vLLM below are absolute, so
they resolve to the real `vllm` package.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from hybridcache import releases

ENABLE_ENV = "HYBRIDCACHE_ENABLE"
NATIVE_HASHING_ENV = "HYBRIDCACHE_NATIVE_HASHING"
_SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
_ENGINE_MODULE = "vllm.v1.engine.core"

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_original: Any = None  # vLLM's class while installed, else None
_installed: Any = None  # the facade class bound in the scheduler module while installed
_original_hasher_factory: Any = None  # vLLM's get_request_block_hasher while rebound, else None


def vllm_version() -> str | None:
    """The installed vLLM's version (imports vLLM), or None without vLLM."""
    try:
        import vllm
    except ImportError:
        return None
    return getattr(vllm, "__version__", None)


def check_vllm_version() -> releases.Release:
    """The supported release the installed vLLM is; raises RuntimeError
    (listing the supported releases) for any other version or no vLLM."""
    return releases.require(vllm_version())


def facade_class() -> type:
    """The facade class `install()` binds for the installed vLLM (RuntimeError
    as `check_vllm_version`)."""
    return check_vllm_version().facade_class()


def _scheduler_module() -> Any:
    import importlib

    return importlib.import_module(_SCHEDULER_MODULE)


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value == "":
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be 1 or 0, got {os.environ[name]!r}")


def _hashing_release() -> releases.Release | None:
    """The installed vLLM's release where the native hasher follows its
    rules exactly (`Release.native_hasher`), else None."""
    release = releases.find(vllm_version())
    return release if release is not None and release.native_hasher else None


def _lookahead_tokens(release: releases.Release, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """`num_hash_lookahead_tokens` of a factory call past `(block_size,
    hash_fn)`: the third parameter of a release with `hash_lookahead`; None
    where the call is not one the release's `get_request_block_hasher`
    takes (without `hash_lookahead` it takes no more)."""
    if not release.hash_lookahead:
        return 0 if not args and not kwargs else None
    if len(args) > 1 or any(k != "num_hash_lookahead_tokens" for k in kwargs) or (args and kwargs):
        return None
    value = args[0] if args else kwargs.get("num_hash_lookahead_tokens", 0)
    return value if type(value) is int and value >= 0 else None


def native_request_block_hasher(vllm_factory: Any, token_append: bool = False) -> Any:
    """A drop-in for vLLM's `get_request_block_hasher` (`(block_size,
    hash_fn)`, or with `Release.hash_lookahead` `(hash_block_size, hash_fn,
    num_hash_lookahead_tokens=0)`):
    hybridcache's native hasher, under the installed release's rules, when
    `hash_fn` is one of vLLM's own hash functions (it reads vLLM's
    `NONE_HASH`, which the engine initialises just before), else
    `vllm_factory`'s Python hasher (also for a release it has no rules for).
    With `token_append`, a native hasher also puts the native
    `append_output_token_ids` on vLLM's `Request` (`hybridcache.vllm_tokens`)
    and vLLM's Python hasher takes it off: requests hashed in Python would
    pay for calls from native code into Python at every token."""
    from hybridcache.hashing import HASH_FUNCTION_NAMES, make_request_block_hasher
    from hybridcache.vllm_tokens import install_token_append, uninstall_token_append

    def get_request_block_hasher(block_size: int, caching_hash_fn: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(caching_hash_fn, "__name__", None)
        release = _hashing_release()
        lookahead = None if release is None else _lookahead_tokens(release, args, kwargs)
        native = (
            lookahead is not None
            and getattr(caching_hash_fn, "__module__", None) == "vllm.utils.hashing"
            and name in HASH_FUNCTION_NAMES
        )
        if not native:
            if token_append:
                uninstall_token_append()
            return vllm_factory(block_size, caching_hash_fn, *args, **kwargs)
        assert release is not None and lookahead is not None
        hasher = make_request_block_hasher(
            block_size, caching_hash_fn, profile=release.profile, num_hash_lookahead_tokens=lookahead
        )
        if token_append:
            install_token_append()
        # vLLM calls it at every appended token: a one-argument builtin
        # bound to the hasher is the cheapest call (`native_hasher_of` finds
        # the hasher again).
        return hasher._bound_call()

    get_request_block_hasher.hybridcache_native = True  # type: ignore[attr-defined]
    return get_request_block_hasher


def native_hasher_of(hasher: Any) -> Any:
    """The `BlockHasher` behind a request block hasher the installed
    factory built (the hasher itself, or the builtin bound to it), else
    None (vLLM's own Python hasher)."""
    from hybridcache._native import BlockHasher

    for h in (hasher, getattr(hasher, "__self__", None)):
        if isinstance(h, BlockHasher):
            return h
    return None


def _install_hasher(release: releases.Release) -> None:
    global _original_hasher_factory
    import importlib

    engine: Any = importlib.import_module(_ENGINE_MODULE)
    current = engine.get_request_block_hasher
    if getattr(current, "hybridcache_native", False):
        return
    _original_hasher_factory = current
    engine.get_request_block_hasher = native_request_block_hasher(current, release.native_token_append)


def _uninstall_hasher() -> None:
    global _original_hasher_factory
    from hybridcache.vllm_tokens import uninstall_token_append

    uninstall_token_append()
    if _original_hasher_factory is None:
        return
    import sys

    engine: Any = sys.modules.get(_ENGINE_MODULE)
    if engine is not None and getattr(engine.get_request_block_hasher, "hybridcache_native", False):
        engine.get_request_block_hasher = _original_hasher_factory
    _original_hasher_factory = None


def install(native_hashing: bool | None = None) -> None:
    """Makes the installed vLLM's `Scheduler` build hybridcache's KV-cache
    manager (the facade class of its release; RuntimeError listing the
    supported releases for any other vLLM) and, unless `native_hashing` is
    False (default: $HYBRIDCACHE_NATIVE_HASHING, else True) or the release's
    hashing is not the native hasher's (`Release.native_hasher`), vLLM's
    engine hash request blocks natively. Idempotent; affects schedulers and
    engines constructed afterwards."""
    global _original, _installed
    release = check_vllm_version()
    facade = release.facade_class()
    if native_hashing is None:
        native_hashing = _env_flag(NATIVE_HASHING_ENV, True)
    native_hashing = native_hashing and release.native_hasher
    module = _scheduler_module()
    with _lock:
        if native_hashing:
            _install_hasher(release)
        else:
            _uninstall_hasher()
        if _original is not None:
            return
        current = module.KVCacheManager
        if current is facade:  # installed by an earlier copy of this module
            return
        _original = current
        _installed = module.KVCacheManager = facade
    announce(release.version, facade, native_hashing)


def announce(version: str, facade: type, native_hashing: bool) -> None:
    """The one line, through vLLM's logger, that says hybridcache is on in
    this process: the vLLM release and the facade class its Scheduler builds."""
    from vllm.logger import init_logger

    init_logger("vllm.hybridcache").info(
        "hybridcache is on: vLLM %s's Scheduler builds %s.%s%s", version, facade.__module__,
        facade.__qualname__, ", with native block hashing" if native_hashing else "")


def uninstall() -> None:
    """Restores vLLM's own `KVCacheManager` in the scheduler module,
    vLLM's `get_request_block_hasher` in the engine and its
    `Request.append_output_token_ids` (no-op if not installed). Schedulers
    and requests already built keep their manager and hasher."""
    global _original, _installed
    with _lock:
        _uninstall_hasher()
        if _original is None:
            return
        module = _scheduler_module()
        if module.KVCacheManager is _installed:
            module.KVCacheManager = _original
        _original = _installed = None


def native_hashing_installed() -> bool:
    """True while vLLM's engine builds hybridcache's native request block hasher."""
    import sys

    engine = sys.modules.get(_ENGINE_MODULE)
    return engine is not None and getattr(engine.get_request_block_hasher, "hybridcache_native", False)


def is_installed() -> bool:
    """Whether vLLM's scheduler module currently builds hybridcache's manager."""
    import sys

    module = sys.modules.get(_SCHEDULER_MODULE)
    if module is None:
        return False
    bound = getattr(module, "KVCacheManager", None)
    # By this module (`_installed`), or by an earlier copy of it: then the
    # bound class is still the installed release's facade.
    return bound is not None and (bound is _installed or bound is _facade_or_none())


def _facade_or_none() -> Any:
    try:
        return facade_class()
    except RuntimeError:
        return None


def register() -> None:
    """`vllm.general_plugins` entry point: installs iff HYBRIDCACHE_ENABLE=1."""
    if _env_flag(ENABLE_ENV, False):
        install()
