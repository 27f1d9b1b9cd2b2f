"""How vLLM 0.33.0's own tests are run against hybridcache, for
scripts/run_vllm_peer_tests.py (see its docstring for what each table means).
The files come from scripts/vllm_tests/vllm-0.33.0.sha256.

The swap builds hybridcache's 0.33.0 facade (hybridcache.releases).
INTERNALS / VIEWS / UNSUPPORTED can list cases by name, as for 0.23.0
(peer_0_23_0.py; keys are a test function's name, or `FILE_STEM::name` where
two files share one); UNSUPPORTED_FEATURES / INTERNAL_MARK classify the rest by
what hybridcache raised.
"""

# vLLM 0.33.0 cannot infer a device on a machine without a GPU: tests that
# build a VllmConfig fail with "Failed to infer device type" unless told.
ENV: dict[str, str] = {"VLLM_TARGET_DEVICE": "cpu"}
# Model configs the tests load from the Hugging Face cache (HF_HUB_OFFLINE=1):
# hand-written from each model's architecture metadata, no weights, in
# scripts/vllm_tests/hf/ORG/NAME/config.json.
HF_MODELS: tuple[str, ...] = ("facebook/opt-125m",)
# The 0.33.0 scheduler tests build the manager through vLLM's Scheduler, so
# the scheduler's `KVCacheManager` is swapped too.
SWAP_SCHEDULER = True

# Cases that cannot run on a CPU machine offline even under vLLM itself
# (measured: `run_vllm_peer_tests.py --against-vllm`, 0.33 oracle venv). The
# multimodal ones build a ModelConfig of llava-hf/llava-1.5-7b-hf, whose
# architecture vLLM inspects by importing its model implementation (pixtral,
# mistral_common, vllm._C, ...): far beyond what the manager and scheduler
# import, so a config.json alone does not do. They test the encoder cache,
# not the KV-cache manager.
LLAVA = "builds llava-hf/llava-1.5-7b-hf's ModelConfig: vLLM imports the model implementation (multimodal encoder cache)"
OFFLINE: dict[str, str] = {
    "test_scheduler::test_cpu_encoder_input_updates_preserve_shm_handles": LLAVA,
    "test_scheduler::test_cpu_encoder_input_updates_restore_after_kv_load_failure": LLAVA,
    "test_scheduler::test_cpu_encoder_input_updates_resume_and_abort": LLAVA,
    "test_scheduler::test_cpu_encoder_input_updates_wait_for_completed_prefill": LLAVA,
    "test_scheduler::test_eagle3_mm_encoder_cache_with_shift": LLAVA,
    "test_scheduler::test_ec_connector_allocate_encoder_tokens_with_external_load": LLAVA,
    "test_scheduler::test_ec_connector_cache_hit_external_load": LLAVA,
    "test_scheduler::test_ec_connector_cache_miss_computes_locally": LLAVA,
    "test_scheduler::test_ec_connector_defers_running_request_for_async_reload": LLAVA,
    "test_scheduler::test_ec_connector_ensure_cache_available_defers_request": LLAVA,
    "test_scheduler::test_ec_connector_schedule_multiple_requests": LLAVA,
    "test_scheduler::test_ec_connector_text_only_request": LLAVA,
    "test_scheduler::test_ec_connector_unable_to_allocate": LLAVA,
    "test_scheduler::test_ec_connector_update_connector_output_called": LLAVA,
    "test_scheduler::test_ec_connector_waits_for_embeddings_in_prefix_replay": LLAVA,
    "test_scheduler::test_ec_connector_with_partial_cache_hit_multi_round": LLAVA,
    "test_scheduler::test_encoder_cache_accepts_matching_embed_count": LLAVA,
    "test_scheduler::test_encoder_cache_embed_count_mismatch_restores_prior_hit_state": LLAVA,
    "test_scheduler::test_encoder_cache_recomputed_when_evicted_during_preemption": LLAVA,
    "test_scheduler::test_encoder_cache_rejects_mismatched_embed_count_within_request": LLAVA,
    "test_scheduler::test_encoder_cache_retained_across_preemption_and_resume": LLAVA,
    "test_scheduler::test_encoder_only_prompt_longer_than_budget_is_chunked": LLAVA,
    "test_scheduler::test_free_encoder_inputs_notifies_the_ec_connector": LLAVA,
    "test_scheduler::test_free_encoder_inputs_respects_unconfirmed_placeholders": LLAVA,
    "test_scheduler::test_free_encoder_inputs_unchanged_without_spec_decode": LLAVA,
    "test_scheduler::test_no_mm_input_chunking": LLAVA,
    "test_scheduler::test_no_mm_input_chunking_at_item_boundary": LLAVA,
    "test_scheduler::test_no_mm_input_chunking_for_same_step_duplicate": LLAVA,
    "test_scheduler::test_priority_scheduling_ec_connector_preemption_and_resumption": LLAVA,
    "test_scheduler::test_same_step_duplicate_encoder_input_stays_cached": LLAVA,
    "test_scheduler::test_schedule_multimodal_requests": LLAVA,
    "test_scheduler::test_schedule_partial_requests": LLAVA,
    "test_scheduler::test_unavailable_encoder_input_fails_the_request_as_retryable": LLAVA,
    "test_scheduler::test_waiting_encoder_stall_does_not_starve_later_requests": LLAVA,
    "test_scheduler::test_waiting_encoder_stall_is_counted_as_deferred": LLAVA,
    "test_scheduler::test_waiting_encoder_stall_kv_holder_keeps_drain_priority": LLAVA,
    "test_scheduler::test_encoder_cache_rejects_mismatched_embed_count":
        LLAVA + "; and vLLM's conftest fixture caplog_vllm",
    "test_scheduler::test_streaming_lookahead_hashes_follow_recomputed_kv":
        "builds Qwen/Qwen3-Next-80B-A3B-Instruct's ModelConfig: vLLM imports the model implementation",
    "test_scheduler::test_async_scheduling_pp_allows_rescheduling_with_output_placeholders":
        "the CPU platform rejects async scheduling with pipeline parallelism",
}

CACHE_POP = (
    "mutates internals: pops entries of block_pool.cached_block_hash_to_block._cache "
    "(hybridcache's map view is read-only)",
    ("cached_block_hash_to_block",),
)
INTERNALS: dict[str, tuple[str, tuple[str, ...]]] = {
    "test_prefill_hybrid_model": CACHE_POP,
    "test_prefill_hybrid_model_eagle": CACHE_POP,
    "test_eagle_with_sliding_window": CACHE_POP,
    "test_different_block_size": CACHE_POP,
    "test_block_stored_event_group_idx_out_of_bounds": (
        "appends to block_pool.kv_event_queue (a read-only view here), patches vllm kv_cache_manager.logger",
        ("kv_event_queue",),
    ),
}
# Regression tests of vLLM #33775 that take blocks off the free list
# (`free_block_queue.fake_free_list_head`) and pass them to `allocate_slots` as
# a cache hit: hybridcache's admission check refuses blocks that are not the
# request's own prefix-cache hits (a clear ValueError, nothing changed). The
# bug itself (an external allocation evicting another group's hit) is
# covered by the two-phase allocation, run by the fuzz's external loads.
FABRICATED_HIT = ("passes free-list blocks (fake_free_list_head) in as a cache hit", "not a cache hit of request")
BAD_INPUT: dict[str, tuple[str, str]] = {
    # allocate_slots(req, n, num_new_computed_tokens) without the hit's
    # blocks: vLLM then caches fresh, unwritten blocks under the prefix's hashes.
    "test_boundary_states_offered_past_prompt_for_resumed_prefill": (
        "passes num_new_computed_tokens without new_computed_blocks", "holds no blocks"),
    # truncate_computed_blocks past a full-attention group's blocks: vLLM
    # asserts (the case expects its AssertionError), hybridcache refuses it.
    "test_truncate_computed_blocks_allows_short_mamba_group_only": (
        "truncates past a full-attention group's hit blocks", "exceeds the"),
    "test_cache_hit_local_and_external": FABRICATED_HIT,
    "test_cache_hit_local_and_external_three_groups": FABRICATED_HIT,
    "test_cache_hit_local_and_external_three_groups_preempt_and_reallocate": FABRICATED_HIT,
    "test_cache_hit_local_and_external_two_groups_preempt_and_reallocate": FABRICATED_HIT,
}
UNSUPPORTED: dict[str, str] = {}
# Cases whose failure is `assert block is block` (vLLM keeps one KVCacheBlock
# object per block) or that hold vLLM's live `req_to_blocks` lists: none now
# (hybridcache interns one view per block, `blocks.block_view`, and
# `req_to_blocks[req]` reads the request's table at each access).
IDENTITY: dict[str, str | tuple[str, str]] = {}
VIEWS: dict[str, str] = {}
NOT_IMPLEMENTED: tuple[str, ...] = ()
# Not listed case by case (yet): a failure is expected when hybridcache
# raised the NotImplementedError of what its 0.33.0 facade documents as not
# ported (Mamba, R-SWA and circular-buffer layouts, mixed-precision zeroing, dcp/pcp,
# multi-module MTP), or a read-only view's AttributeError naming a
# vLLM internal it does not provide. Any other failure is a divergence.
# prefix_cache/test_mamba_eagle_resume_checkpoint.py runs
# enable_mamba_shared_prefix_checkpoint (covered); one case calls Mamba's
# private `_cache_partial_tail_block` (an internal, by the mark below).
UNSUPPORTED_FEATURES: tuple[str, ...] = (
    "hybridcache's facade for this vLLM release needs at least one KV cache group",
    "not supported by hybridcache's facade for this vLLM release yet",
)
INTERNAL_MARK = "internal that hybridcache does not provide"
