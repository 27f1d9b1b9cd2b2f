"""vLLM 0.34.0: its facade (`manager.KVCacheManager034`, the shared
partial-hits manager with 0.34.0's row: lookups gated and bounded by
`request.prefix_cache_hit_limit`, zeroing from the config's field,
`evict_first` on the pool, the `get_num_cached_tokens` probe, no
`get_num_common_prefix_blocks`) and its scheduler binding
(`scheduler.VllmKVCacheManager034`)."""
