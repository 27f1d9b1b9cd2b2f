"""hybridcache under vLLM 0.23.0's scheduler: the class `hybridcache.vllm.install()`
binds as `vllm.v1.core.sched.scheduler.KVCacheManager` when the installed vLLM
is 0.23.0 (the table in `hybridcache.releases` picks it)."""

from __future__ import annotations

from typing import Any

from hybridcache.coordinator import coordinator_view
from hybridcache.manager import KVCacheManager


class VllmKVCacheManager(KVCacheManager):
    """vLLM 0.23.0's facade as that release's scheduler constructs it
    (after `install()`): `KVCacheManager` with vLLM's keyword arguments,
    plus the `coordinator` view the scheduler reads."""

    _EXPLAINS_STEP_WAITS = False  # vLLM's answer: None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """The arguments of `KVCacheManager`."""
        super().__init__(*args, **kwargs)
        if getattr(self, "coordinator", None) is None:
            self.coordinator = coordinator_view(self)


__all__ = ["VllmKVCacheManager"]
