"""`hybridcache.KVCacheManager`: the plain manager, with the `KVCacheManager`
API of the oldest release in the table (`hybridcache.releases.DEFAULT`: its
constructor and keywords) over the shared base
`hybridcache.facade.KVCacheManagerBase`, the core running that release's
profile. That release's scheduler binds a subclass of it
(`hybridcache.releases.<folder>.scheduler`); later releases' facades are in
their own folders."""

from __future__ import annotations

from typing import Any

from hybridcache.config import read_groups, read_retention_interval
from hybridcache.facade import KVCacheManagerBase, _positive_int
from hybridcache.releases import DEFAULT

RELEASE = DEFAULT


class KVCacheManager(KVCacheManagerBase):
    """Drop-in for `vllm.v1.core.kv_cache_manager.KVCacheManager` (of the
    table's oldest release): the KV-cache blocks of every request of a serving loop, over one
    block pool shared by all KV-cache groups, with prefix caching.

    Args:
        kv_cache_config: a `hybridcache.KVCacheConfig` or vLLM's: the pool
            size and the groups (full attention, sliding window, chunked
            local, Mamba, cross attention, in any mix).
        max_model_len: the longest sequence in tokens; allocations are
            capped there.
        scheduler_block_size: the caller's scheduling granularity in tokens:
            the LCM of the groups' block sizes (vLLM's
            `resolve_kv_cache_block_sizes`). Prefix-cache hits are a multiple
            of it.
        hash_block_size: tokens per request block hash (`request.block_hashes`);
            every group's block size is a multiple of it. With one group and
            prefix caching it must equal that group's block size.
        max_num_batched_tokens: the most tokens one step schedules (caps a
            sliding-window / chunked-local request's admission); None:
            `max_model_len`.
        enable_caching: prefix caching (vLLM's `enable_prefix_caching`).
        use_eagle: an EAGLE drafter shares the cache (a hit drops its last
            block, as vLLM's).
        log_stats: count prefix-cache lookups (`make_prefix_cache_stats`).
        enable_kv_cache_events: record `BlockStored` / `BlockRemoved` /
            `AllBlocksCleared` events (`take_events`).
        dcp_world_size, pcp_world_size: decode / prefill context
            parallelism (positive ints): as vLLM, each block then holds
            `block_size * dcp * pcp` tokens of a group (tables, hits,
            caching, events); vLLM's scheduler passes scheduler_block_size =
            hash_block_size = that. Only for what that release runs with it:
            with prefix caching one full-attention group; without, any
            groups but Mamba.
        metrics_collector: vLLM's `KVCacheMetricsCollector` (or any object
            with its `on_block_allocated` / `on_block_accessed` /
            `on_block_evicted(block)` and `reset()`): it gets the calls
            vLLM's block pool makes, in the same order and number, each with
            a `BlockView` (its `block_id`); they are made when the manager
            call that caused them returns (so its timestamps are a few
            microseconds later than vLLM's).

    Raises:
        ValueError: a count that is not a positive int, block sizes that do
            not divide as above, a bad spec field (each named); dcp/pcp > 1
            with groups that release asserts against (several groups or not
            full attention, with prefix caching).
        TypeError: a config without `kv_cache_groups`, a group without a spec.
        NotImplementedError: sink or encoder-only specs, dcp/pcp > 1 with a
            Mamba group.

    VLLM_PREFIX_CACHE_RETENTION_INTERVAL is read here, as that release reads
    it: unset, every reachable block is cached; 0 or a multiple N of
    `scheduler_block_size`, sliding-window groups cache only the prompt's
    replay boundary and (N) one hit's blocks per N tokens. ValueError for a
    value that is not an int, negative or not such a multiple, or for a
    model without a sliding-window group.

    The calls of a scheduler step (native; their full documentation is in
    `hybridcache/_native.pyi`, shown by IDEs and type checkers):

    - ``new_step_starts()``: once at the start of every step.
    - ``get_computed_blocks(request) -> (KVCacheBlocks, num_hit_tokens)``:
      the longest prefix-cache hit of a request being admitted.
    - ``allocate_slots(request, num_new_tokens, num_new_computed_tokens=0,
      new_computed_blocks=None, num_lookahead_tokens=0, ...) ->
      KVCacheBlocks | None``: blocks for this step's tokens; the blocks
      added (``get_block_ids(allow_none=True)`` is None when none were), or
      None when the pool cannot hold them (preempt a request and retry).
    - ``free(request)``: a finished or preempted request's blocks back to
      the pool (cached ones stay findable until reused).
    - ``get_block_ids(request_id)``, ``get_blocks(request_id)``: a request's
      whole block table per group.
    - ``cache_blocks(request, num_computed_tokens)``,
      ``remove_skipped_blocks(request_id, total_computed_tokens)``,
      ``evict_blocks(block_ids)``, ``reset_prefix_cache()``,
      ``get_num_common_prefix_blocks(request_id)``, ``take_new_block_ids()``,
      ``usage``, ``check_invariants()``.
    - Batched forms for serving loops: ``allocate_decode_batch`` and
      ``allocate_decode_arrays``.

    Errors: bad arguments raise ValueError / TypeError naming the argument
    and leave the manager unchanged; running out of blocks is not an error.
    The caller's contract between calls (what to update on the request) is
    in docs/usage.md.
    """

    __slots__ = ()

    # hybridcache's own API: a missing `new_step_starts()` is named (see
    # `KVCacheManagerBase`); vLLM's scheduler's class below answers None.
    _EXPLAINS_STEP_WAITS = True

    dcp_world_size: int
    pcp_world_size: int

    def __new__(
        cls,
        kv_cache_config: Any,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_num_batched_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
    ) -> KVCacheManager:
        """Builds the manager; the arguments and errors are in the class docstring."""
        dcp_world_size = _positive_int("dcp_world_size", dcp_world_size)
        pcp_world_size = _positive_int("pcp_world_size", pcp_world_size)
        max_model_len = _positive_int("max_model_len", max_model_len)
        # As vLLM: None caps admissions at max_model_len. A step that
        # schedules no token admits nothing: 0 is never a real config.
        max_num_batched_tokens = (max_model_len if max_num_batched_tokens is None
                                  else _positive_int("max_num_batched_tokens", max_num_batched_tokens))
        groups = read_groups(kv_cache_config, max_num_batched_tokens, max_model_len)
        scheduler_block_size = _positive_int("scheduler_block_size", scheduler_block_size)
        return cls._build(kv_cache_config, groups, max_model_len, scheduler_block_size, hash_block_size,
                          enable_caching, use_eagle, log_stats, enable_kv_cache_events, RELEASE.version,
                          retention_interval=read_retention_interval(groups, scheduler_block_size),
                          dcp_world_size=dcp_world_size, pcp_world_size=pcp_world_size,
                          metrics_collector=metrics_collector)


__all__ = ["RELEASE", "KVCacheManager"]
