"""vLLM 0.23.0: its facade (`manager.KVCacheManager`, which is
`hybridcache.KVCacheManager`) and its scheduler binding
(`scheduler.VllmKVCacheManager`). Its views are the shared ones
(`hybridcache.block_pool`, `hybridcache.coordinator`)."""
