"""vLLM 0.33.0: its facade (`manager.KVCacheManager033`, the shared
partial-hits manager with 0.33.0's row and `get_num_common_prefix_blocks`)
and its scheduler binding (`scheduler.VllmKVCacheManager033`)."""
