"""vLLM 0.23.0, the table's oldest release: its API is the plain manager's
(`hybridcache.manager.KVCacheManager`, which is `hybridcache.KVCacheManager`),
so its folder holds only its scheduler binding (`scheduler.VllmKVCacheManager`).
Its views are the shared ones (`hybridcache.block_pool`, `hybridcache.coordinator`)."""
