"""vLLM's `Request.append_output_token_ids` with hybridcache's native block
hashing in the same call (part of `hybridcache.vllm.install()`'s native
hashing).

vLLM's scheduler appends every sampled token with
`request.append_output_token_ids(token)`: two list appends, then
`update_block_hashes()`, then the request's block hasher, which mostly finds
no new full block. That is two Python frames and a builtin call per token.
`install_token_append()` replaces the method on vLLM's `Request` class with
a native method descriptor (`hybridcache._native.native_token_append`)
doing the same work in one call, for the body both supported releases share
(`Release.native_token_append`). Requests whose hasher is not hybridcache's,
subclasses and other spellings run vLLM's own code. Without the binding's
`raw-ffi` feature there is no descriptor and vLLM's method stays.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

_REQUEST_MODULE = "vllm.v1.request"

logger = logging.getLogger(__name__)

_descriptor: Any = None  # the native descriptor, made once per process
_vllm_append: Any = None  # the vLLM function it stands for
_vllm_update: Any = None  # the class's update_block_hashes it follows


def _request_class() -> Any:
    return importlib.import_module(_REQUEST_MODULE).Request


def install_token_append() -> bool:
    """Puts the native `append_output_token_ids` on vLLM's `Request` class.
    True where it is there now; False where the binding has none, or the
    class's `append_output_token_ids` or `update_block_hashes` is no longer
    the one the descriptor follows (vLLM's method, or the other, stays).
    Idempotent. The descriptor does not look at `update_block_hashes` at
    every token: one replaced after this call is followed from the next
    call on (the engine's next hasher, or `install()`)."""
    cls = _request_class()
    current = cls.__dict__.get("append_output_token_ids")
    update = cls.__dict__.get("update_block_hashes")
    if _descriptor is not None and update is not _vllm_update:
        uninstall_token_append()
        logger.warning("hybridcache: Request.update_block_hashes was replaced; vLLM's append kept")
        return False
    if current is None or update is None:
        return False
    if current is _descriptor:
        return True
    if _descriptor is None:
        if token_append_descriptor() is None:
            return False
    elif current is not _vllm_append:
        logger.warning("hybridcache: Request.append_output_token_ids was replaced by another; kept")
        return False
    cls.append_output_token_ids = _descriptor
    return True


def token_append_descriptor() -> Any:
    """The native descriptor standing for vLLM's `append_output_token_ids`
    (made on first use, not put on the class), or None without the raw-ffi
    feature or where the class's methods are not vLLM's. Its `__get__(request)`
    binds it to one request (the step bench's `hc+native` requests)."""
    global _descriptor, _vllm_append, _vllm_update
    from hybridcache import _native

    if _descriptor is not None:
        return _descriptor
    cls = _request_class()
    current = cls.__dict__.get("append_output_token_ids")
    update = cls.__dict__.get("update_block_hashes")
    if current is None or update is None:
        return None
    try:
        _descriptor = _native.native_token_append(cls, current, update)
    except ValueError as e:
        # Another Request class or method than the first one's.
        logger.warning("hybridcache: vLLM's append_output_token_ids kept: %s", e)
        return None
    if _descriptor is not None:
        _vllm_append, _vllm_update = current, update
    return _descriptor


def uninstall_token_append() -> None:
    """Restores vLLM's `append_output_token_ids` (no-op if not installed)."""
    if token_append_installed():
        _request_class().append_output_token_ids = _vllm_append


def token_append_installed() -> bool:
    """Whether vLLM's `Request` class has the native `append_output_token_ids`."""
    import sys

    module = sys.modules.get(_REQUEST_MODULE)
    return (module is not None and _descriptor is not None
            and module.Request.__dict__.get("append_output_token_ids") is _descriptor)
