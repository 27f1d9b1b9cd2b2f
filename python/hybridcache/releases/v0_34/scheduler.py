"""hybridcache under vLLM 0.34.0's scheduler: the class `hybridcache.vllm.install()`
binds as `vllm.v1.core.sched.scheduler.KVCacheManager` when the installed vLLM
is 0.34.0 (the table in `hybridcache.releases` picks it)."""

from __future__ import annotations

from hybridcache.releases.v0_34.manager import KVCacheManager034


class VllmKVCacheManager034(KVCacheManager034):
    """hybridcache's manager as vLLM 0.34.0's `Scheduler` and
    `AsyncScheduler` construct it: `KVCacheManager034` with the keywords
    they pass, the `coordinator` and `block_pool` views they read included."""


__all__ = ["VllmKVCacheManager034"]
