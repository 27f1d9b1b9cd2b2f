"""Clear errors for arguments the native layer could not convert. Called
only after a conversion failed, so the hot path pays nothing for it."""

from __future__ import annotations

from typing import Any

_I64 = 1 << 63


def explain_conversion_error(err: Exception, counts: dict[str, Any], request: Any = None) -> Exception:
    """The most precise exception for `err`, naming the offending argument."""
    for name, v in counts.items():
        if isinstance(v, bool) or not isinstance(v, int):
            if name.startswith("delay") or name.startswith("full_"):
                continue
            return TypeError(f"{name} must be an int, got {type(v).__name__}")
        if not -_I64 <= v < _I64 or v < 0:
            return ValueError(f"{name} must be >= 0 and < 2**63, got {v}")
    if request is not None:
        hashes = getattr(request, "block_hashes", None)
        if not isinstance(hashes, (list, tuple)):
            return TypeError(f"request.block_hashes must be a list of bytes, got {type(hashes).__name__}")
        for i, h in enumerate(hashes):
            if not isinstance(h, bytes):
                return TypeError(f"request.block_hashes[{i}] must be bytes, got {type(h).__name__}")
        rid = getattr(request, "request_id", None)
        if not isinstance(rid, str):
            return TypeError(f"request.request_id must be str, got {type(rid).__name__}")
    return err
