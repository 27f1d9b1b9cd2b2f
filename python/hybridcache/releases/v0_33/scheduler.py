"""hybridcache under vLLM 0.33.0's scheduler: the class `hybridcache.vllm.install()`
binds as `vllm.v1.core.sched.scheduler.KVCacheManager` when the installed vLLM
is 0.33.0 (the table in `hybridcache.releases` picks it)."""

from __future__ import annotations

from hybridcache.releases.v0_33.manager import KVCacheManager033


class VllmKVCacheManager033(KVCacheManager033):
    """hybridcache's manager as vLLM 0.33.0's `Scheduler` constructs it:
    `KVCacheManager033` with the keywords that scheduler passes, the
    `coordinator` and `block_pool` views it reads included."""


__all__ = ["VllmKVCacheManager033"]
