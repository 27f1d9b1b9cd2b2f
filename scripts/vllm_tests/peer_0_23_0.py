"""How vLLM 0.23.0's own tests (tests/v1/core/test_prefix_caching.py) are
run against hybridcache and which of their cases reach into vLLM internals,
for scripts/run_vllm_peer_tests.py (see its docstring for what each table
means). The files come from scripts/vllm_tests/vllm-0.23.0.sha256."""

# Nothing to set: vLLM 0.23.0's tests run on CPU, offline, as they are.
ENV: dict[str, str] = {}
# Hugging Face model configs the tests name (none for this file).
HF_MODELS: tuple[str, ...] = ()
# The manager the tests build by the name `KVCacheManager` is swapped; vLLM's
# Scheduler (the file's few scheduler cases) keeps building vLLM's own.
SWAP_SCHEDULER = False
# Cases that cannot run on a CPU machine offline, under vLLM itself (none).
OFFLINE: dict[str, str] = {}

# Why a case cannot run against hybridcache, by test function name (all of its
# parametrizations), from reading each test in vLLM 0.23.0's file: the reason
# and the vLLM-internal attributes it reaches for. A listed case is expected to
# fail only there: with an AttributeError naming one of those attributes (it
# does not exist on hybridcache's objects), or with the NotImplementedError of a
# feature hybridcache documents as unsupported. Failing any other way (a wrong
# assertion on public data before the internal access, a crash) is reported as
# a divergence all the same.
BLOCK_POOL = ("constructs vllm BlockPool directly", ())
HASH_MAP = ("constructs vllm BlockHashToBlockMap/KVCacheBlock directly", ())
CACHE_POP = (
    "mutates internals: pops/restores block_pool.cached_block_hash_to_block entries "
    "(hybridcache's map view is read-only)",
    ("cached_block_hash_to_block",),
)
POOL_WRITES = (
    "calls BlockPool internals on manager.block_pool: get_new_blocks/cache_full_blocks",
    ("get_new_blocks", "cache_full_blocks"),
)
INTERNALS: dict[str, tuple[str, tuple[str, ...]]] = {
    "test_prefill_hybrid_model": CACHE_POP,
    "test_prefill_hybrid_model_eagle": CACHE_POP,
    "test_eagle_with_sliding_window": CACHE_POP,
    "test_different_block_size": CACHE_POP,
    "test_block_stored_event_group_idx": POOL_WRITES,
    "test_block_stored_event_group_idx_multiple_groups": POOL_WRITES,
    "test_block_stored_event_group_idx_out_of_bounds": (
        "appends to block_pool.kv_event_queue (a read-only view here), patches vllm kv_cache_manager.logger",
        ("kv_event_queue",),
    ),
    # These never build a KVCacheManager: they test vLLM's own classes.
    "test_cache_blocks": BLOCK_POOL,
    "test_cache_blocks_multi_group": BLOCK_POOL,
    "test_maybe_evict_cached_block": BLOCK_POOL,
    "test_null_parent_block_hash": BLOCK_POOL,
    "test_block_removed_event_group_idx": BLOCK_POOL,
    "test_block_lookup_cache_single_block_per_key": HASH_MAP,
    "test_block_lookup_cache_multi_blocks_per_key": HASH_MAP,
}
# Public-API cases of a feature hybridcache documents as not implemented yet
# (README: NotImplementedError). Not counted against the exit code unless --strict.
UNSUPPORTED: dict[str, str] = {}

# Cases that read vLLM internals which hybridcache serves through read-only
# compatibility views (block_pool.get_cached_block / cached_block_hash_to_block
# / kv_event_queue / free_block_queue.fake_free_list_head-tail links,
# coordinator.single_type_managers[g].req_to_blocks). They must pass, like the
# public-API cases.
VIEWS: dict[str, str] = {
    "test_prefill": "free_block_queue.fake_free_list_head/tail links",
    "test_decode": "coordinator.single_type_managers[0].req_to_blocks",
    "test_prefill_not_enough_free_blocks_with_computed_blocks": "coordinator.single_type_managers[0].req_to_blocks",
    "test_swa_free_split_keeps_cached_tail_ahead_of_scratch":
        "coordinator.single_type_managers[1].req_to_blocks, block_pool.get_cached_block",
    "test_reset_prefix_cache": "block_pool.cached_block_hash_to_block (truthiness)",
    "test_kv_cache_events": "len(block_pool.cached_block_hash_to_block), len(block_pool.kv_event_queue)",
    "test_eagle_swa_boundary_caches_post_boundary_block": "block_pool.get_cached_block",
    "test_eagle_grouped_swa_siblings_use_same_cache_mask": "block_pool.get_cached_block",
    "test_hybrid_cache_blocks_swa_tail_window_only": "block_pool.get_cached_block",
    "test_hybrid_cache_blocks_clamped_to_lcm": "block_pool.get_cached_block",
    "test_pure_swa_retention_dense_default_caches_all": "block_pool.get_cached_block",
    # VLLM_PREFIX_CACHE_RETENTION_INTERVAL: which blocks sparse retention caches.
    "test_hybrid_local_kv_retention_interval_aligns_in_manager": "block_pool.get_cached_block",
    "test_hybrid_local_kv_retention_latest_only_reuses_replay_boundary": "block_pool.get_cached_block",
    "test_hybrid_local_kv_retention_mtp_reuses_latest_boundary": "block_pool.get_cached_block",
    "test_pure_swa_retention_latest_only": "block_pool.get_cached_block",
    "test_pure_swa_retention_interval_caches_sparse_tails":
        "type(manager.coordinator).__name__ (the view is named as vLLM's coordinator), block_pool.get_cached_block",
}
# Features hybridcache documents as not implemented: a listed case that fails
# with a NotImplementedError naming one of them failed as expected.
NOT_IMPLEMENTED: tuple[str, ...] = ()
