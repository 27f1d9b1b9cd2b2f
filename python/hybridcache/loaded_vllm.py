"""vLLM's own classes, when the vLLM that has loaded them is a release whose
row runs a given core profile: the views and drains register with, or
build, vLLM's classes so `isinstance` checks and field-by-field
comparisons (connectors, vLLM's own tests) pass. vLLM is never imported
here; its scheduler has loaded these modules before it builds the manager."""

from __future__ import annotations

import sys
from typing import Any

from hybridcache.releases import find


def loaded_vllm(profile: str, module_name: str, name: str) -> Any:
    """`name` of vLLM's module `module_name` if vLLM has loaded it and the
    loaded vLLM is a release of the table running core profile `profile`;
    else None."""
    version = getattr(sys.modules.get("vllm"), "__version__", None)
    installed = find(version) if isinstance(version, str) else None
    if installed is None or installed.profile != profile:
        return None
    return getattr(sys.modules.get(module_name), name, None)


__all__ = ["loaded_vllm"]
