"""vLLM 0.33.0: its facade (`manager.KVCacheManager033`), its views
(`views`: the block pool with deferred frees, the coordinator classes its
tests name, per-group managers), its layout checks (`layout`) and its
scheduler binding (`scheduler.VllmKVCacheManager033`)."""
