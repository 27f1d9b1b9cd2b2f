"""Typing stub of the PyO3 extension `hybridcache._native` (rust/python/src/lib.rs).

Integer arguments are taken as Python ints (i64 on the Rust side); counts and
offsets that are negative raise ValueError naming the argument. Block hashes
are `bytes`. Errors of the core map to: ValueError (invalid argument),
KeyError (unknown request), NotImplementedError (unsupported feature),
RuntimeError (broken invariant or a caught panic).
"""

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Literal, Protocol, TypeAlias, final, overload

from typing_extensions import disjoint_base

__all__ = [
    "RAW_FFI",
    "BlockHasher",
    "BlockView",
    "KVCacheBlocks",
    "NativeManager",
    "__version__",
    "_register_request_class",
    "block_extra_keys",
    "block_view",
    "native_token_append",
    "none_hash_seed",
]

__version__: Final[str]
# Built with the raw-ffi feature: the hot calls' raw entry points (same answers either way).
RAW_FFI: Final[bool]

# ("stored", hashes, parent hash, start_token, end_token, block_size, group, positions)
_StoredEvent: TypeAlias = tuple[Literal["stored"], list[bytes], bytes | None, int, int, int, int, list[int]]
# ("removed", hash, group)
_RemovedEvent: TypeAlias = tuple[Literal["removed"], bytes, int]
# ("cleared",)
_ClearedEvent: TypeAlias = tuple[Literal["cleared"]]
_RawEvent: TypeAlias = _StoredEvent | _RemovedEvent | _ClearedEvent

class _GroupArg(Protocol):
    """One KV-cache group (`hybridcache.config.NativeGroup`), read by
    attribute name; the fields are documented there."""

    @property
    def kind(self) -> Literal["full_attention", "sliding_window", "chunked_local", "cross_attention", "mamba", "rswa",
                              "circular_buffer"]: ...
    @property
    def block_size(self) -> int: ...
    @property
    def is_eagle_group(self) -> bool: ...
    @property
    def reports_new_block_ids(self) -> bool: ...
    @property
    def spec_class(self) -> int: ...
    @property
    def admission_cap(self) -> int | None: ...
    @property
    def window_or_chunk(self) -> int: ...
    @property
    def mamba_cache_mode(self) -> Literal["none", "all", "align"]: ...
    @property
    def num_speculative_blocks(self) -> int: ...
    @property
    def mamba_checkpoints(self) -> tuple[int, int, int, bool, bool] | None: ...
    @property
    def prefix_cacheable(self) -> bool: ...
    @property
    def extra_retained_tokens(self) -> int: ...

class _Request(Protocol):
    """What the manager reads of a request: vLLM's `Request` and
    `hybridcache.Request` both have it. Also read when present (else taken
    as None / empty): `lora_request`, `cache_salt`, `mm_features`,
    `prompt_embeds` (extra keys of KV events)."""

    @property
    def request_id(self) -> str: ...
    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens, draft tokens not included."""
    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is computed; the caller advances it (docs/usage.md)."""
    @property
    def block_hashes(self) -> Sequence[bytes]:
        """One chain hash per full `hash_block_size` tokens of `all_token_ids`."""
    @property
    def all_token_ids(self) -> Sequence[int]: ...
    @property
    def skip_reading_prefix_cache(self) -> bool: ...
    @property
    def num_preemptions(self) -> int:
        """Read with `log_stats`: a lookup of a request with preemptions
        counts as a preempted one."""
    @property
    def num_prompt_tokens(self) -> int:
        """Read once per request with a retention interval: it places the
        replay boundary sparse retention keeps."""

class _BlocksLike(Protocol):
    """vLLM's `KVCacheBlocks` (block objects with a `block_id`, per group)."""

    @property
    def blocks(self) -> Sequence[Sequence[Any]]: ...

_AllocateSlots: TypeAlias = Callable[..., KVCacheBlocks | None]
_CacheBlocks: TypeAlias = Callable[..., None]

@disjoint_base
class NativeManager:
    """The native manager; use `hybridcache.KVCacheManager`, which wraps it
    (and documents the constructor's arguments)."""

    def __new__(
        cls,
        num_blocks: int,
        groups: Sequence[_GroupArg],
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        enable_caching: bool,
        use_eagle: bool,
        enable_events: bool,
        retention_interval: int | None,
        profile: str,  # a behaviour profile's name: "whole-block-hits", "partial-block-hits"
        dcp_world_size: int,
        pcp_world_size: int,
    ) -> NativeManager: ...
    def _bind_python(
        self,
        empty: KVCacheBlocks,
        event_sink: Callable[[list[_RawEvent], Any], None] | None,
        log_stats: bool = False,
        metrics_sink: Callable[[list[tuple[int, int]]], None] | None = None,
        event_read: Callable[[Any], Any] | None = None,
        explain_step_waits: bool = False,
    ) -> None:
        """Called once by the facade: the shared empty KVCacheBlocks, the event
        sink (None when events are off), whether lookups are counted and the
        block-metrics sink (None without a metrics collector): it gets the
        pool's log of collector calls after each manager call, a list of
        (kind, block_id), kind 0 allocated, 1 accessed, 2 evicted, 3 reset.
        `event_read(request)`: what the event sink reads of a request, read
        before a call changes anything and handed to the sink in the
        request's place (None: the sink gets the request).
        `explain_step_waits`: an allocation whose prefix hit waits for a
        step that never starts (`new_step_starts()` never called) raises
        RuntimeError instead of answering None."""
    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, the null block (0) included."""
    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue (cached ones included)."""
    @property
    def usage(self) -> float:
        """vLLM's `usage`: fraction of the usable blocks (all but the null
        block) that requests hold, in [0, 1]."""
    @property
    def num_requests(self) -> int:
        """Requests the manager holds state for (allocated, not yet freed)."""
    @property
    def coordinator_kind(self) -> Literal["no_prefix_cache", "unitary", "hybrid"]:
        """The coordinator vLLM builds for this config: no prefix
        cache (caching off), unitary (one group) or hybrid."""
    def num_known_hashes(self, request_id: str) -> int:
        """How many of the request's block hashes the manager has read."""
    def get_computed_blocks(
        self, request: _Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int]:
        """vLLM's `get_computed_blocks(request)`: the longest prefix-cache hit
        of a request about to be admitted (`num_computed_tokens == 0`).

        Returns `(blocks, num_hit_tokens)`: the cached blocks per group and
        the tokens they hold, a multiple of `scheduler_block_size` and at
        most `request.num_tokens - 1` (the last token is always computed, to
        sample from). `(empty_kv_cache_blocks, 0)` with caching off or
        `request.skip_reading_prefix_cache`. Takes no reference: pass both to
        `allocate_slots(request, n, num_new_computed_tokens=num_hit_tokens,
        new_computed_blocks=blocks)` in the same step. The request's new
        block hashes are read first; the lookup is counted for
        `make_prefix_cache_stats`.

        `max_cache_hit_length` (profiles with `lookup_hit_cap_arg`; a
        TypeError elsewhere): the most hit tokens instead of
        `num_tokens - 1`. Managers whose profile has the scheduler record
        stats count nothing here (their facade records admissions).

        Raises ValueError for a request without tokens, TypeError /
        AttributeError for a request without the attributes of `_Request`."""
    def _get_computed_blocks_with_boundary(
        self, request: _Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        """`get_computed_blocks`' pair plus `shared_prefix_boundary`, where
        the longest hit one attention type found on its own ends when it
        passes the hit (a sparse-retention group lags a shared prefix),
        else 0."""
    def _find_longest_cache_hit_per_group(
        self, block_hashes: list[bytes], max_cache_hit_length: int
    ) -> tuple[KVCacheBlocks, list[int]]:
        """vLLM's `HybridKVCacheCoordinator.find_longest_cache_hit_per_group`:
        each group's own hit over `block_hashes`, not reconciled with the
        others (blocks, hit tokens per group). ValueError for other
        coordinators (one group, or no prefix caching) and for the
        whole-block-hits profile."""
    def _get_computed_blocks_for_connector(
        self, request: _Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int, bool | None]:
        """vLLM's `get_computed_blocks_for_connector`: with Mamba layers
        beside full attention each group's own hit, the full-attention one
        as the local prefix, and `hit_diverged`; `hit_diverged` None where
        the reconciled `_get_computed_blocks_with_boundary` answered."""
    @property
    def profile(self) -> str:
        """The behaviour profile this manager follows ("whole-block-hits",
        "partial-block-hits"; `hybridcache.releases` says which release
        follows which)."""
    def _set_reprefillable_tokens(self, n: int) -> None:
        """vLLM's multi-module MTP: the last `n` computed tokens are
        never cached (its `num_prefill_lookahead - 1`); set before the first
        request."""
    def _set_watermark(self, blocks: int, statuses: list[Any]) -> None:
        """vLLM's watermark: `blocks` stay free when a request whose
        `status` equals one of `statuses` is admitted while others are
        scheduled (`allocate_slots(..., has_scheduled_reqs=True)`)."""
    def _pop_blocks_for_free(self, request_id: str) -> list[int]:
        """vLLM's `pop_blocks_for_free`, as block ids: the request is
        forgotten; its blocks (table order, leading null blocks left out)
        stay referenced until `_free_handed_out`."""
    def _num_cached_blocks(self, request_id: str, group: int) -> int | None:
        """vLLM's `single_type_managers[group].num_cached_block.get(request_id)`:
        the group's blocks cached for a running request, None otherwise."""
    def _record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """vLLM's `record_blocks_for_zeroing`: the request's blocks from
        `start_token` on are recorded for zeroing again, in the groups that
        record new block ids (ValueError if `start_token` is not a multiple
        of their block size)."""
    def _free_handed_out(self, blocks: Iterable[Any], evict_first: bool = False) -> None:
        """vLLM's `block_pool.free_blocks(blocks)` for blocks
        `_pop_blocks_for_free` handed out (objects with `block_id`, or ids),
        in eviction order: unhashed ones (all with caching off) are reused
        first, cached ones last (first too with vLLM's `evict_first`).
        ValueError, nothing freed, for a block not handed out (as often)."""
    def _set_read_gate(self, attribute: str) -> None:
        """The request attribute lookups read: "skip_reading_prefix_cache"
        (the default) or "prefix_cache_hit_limit" (0 skips, N bounds
        a hit to min(num_tokens - 1, N, the caller's bound))."""
    @property
    def _read_gate(self) -> str:
        """The request attribute lookups read."""
    def _num_cached_tokens(self, request: _Request) -> int:
        """vLLM's `get_num_cached_tokens`: the prefix-cache hit of the
        request's hashes bounded by `num_tokens - 1`, changing nothing; 0
        where the lookup is off for it."""
    def _take_stats(self, take: bool = True) -> tuple[bool, int, int, int, int, int, int]:
        """Prefix-cache lookup counters since the last take (reset unless `take` is False):
        (reset, requests, queries, hits, preempted_requests, preempted_queries, preempted_hits)."""
    def allocate_slots(
        self,
        request: _Request,
        num_new_tokens: int,
        num_new_computed_tokens: int | None = None,
        new_computed_blocks: KVCacheBlocks | _BlocksLike | None = None,
        num_lookahead_tokens: int | None = None,
        num_external_computed_tokens: int | None = None,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int | None = None,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int | None = None,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: Iterable[int] | None = None,
    ) -> KVCacheBlocks | None:
        """vLLM's `KVCacheManager.allocate_slots`: blocks for this
        step's tokens of one request, admission or running.

        The request's table is made to cover
        `min(num_computed_tokens + num_new_computed_tokens +
        num_external_computed_tokens + num_new_tokens + num_lookahead_tokens,
        max_model_len)` tokens, where `num_computed_tokens` is read from the
        request; blocks outside a sliding window / attention chunk are freed
        first; the full blocks of verified tokens (up to
        `request.num_tokens`) are then prefix-cached.

        Args:
            request: the request (`_Request`); its `num_computed_tokens` is
                the state before this step (0 at admission).
            num_new_tokens: tokens to compute this step, > 0 unless
                `num_external_computed_tokens` > 0: the prefill chunk, or
                1 + the draft tokens of a decode
                (`num_tokens + len(spec_token_ids) - num_computed_tokens`).
            num_new_computed_tokens: at admission, the hit length from
                `get_computed_blocks` (None / 0: none).
            new_computed_blocks: at admission, the blocks from
                `get_computed_blocks` (or vLLM's `KVCacheBlocks`); None: none.
            num_lookahead_tokens: extra slots for a drafter with a KV cache
                (EAGLE, draft model: vLLM passes `num_speculative_tokens`);
                not computed, not cached. 0 for n-gram / suffix drafts.
            num_external_computed_tokens: tokens a KV connector loads
                (P/D, offloading), after the local hit.
            delay_cache_blocks: allocate but cache nothing yet (an async KV
                load finishing in a later step; then `cache_blocks`).
            num_encoder_tokens: encoder tokens for cross-attention groups
                (encoder-decoder models), at the first allocation.
            full_sequence_must_fit: return None unless the pool can hold
                the whole request (`request.num_tokens`), not just this step.
            reserved_blocks: free blocks this call must leave free.
            has_scheduled_reqs: (profiles with `allocate_step_args` only; a
                TypeError elsewhere) another request runs this step: a waiting or
                preempted request must then leave the watermark free too.
            skip_zeroing_group_ids: (profiles with `allocate_step_args` only)
                groups whose external-token blocks an async load writes,
                kept out of zeroing; checked to be group indices.

        Returns:
            The blocks added by this call, per group
            (`result.get_block_ids(allow_none=True)` is None when no group
            gained one, as in most decodes), or None when the pool cannot
            hold them: nothing was allocated, and the caller preempts a
            request (`free` it) and retries, or tries again next step.

        Raises:
            ValueError: `num_new_tokens` 0 without external tokens, a
                negative count, `new_computed_blocks` of another manager or
                out of range, new computed blocks for a running request; the
                manager is unchanged.
            TypeError: a count that is not an int (bool, float, None).
        """
    @staticmethod
    def _raw_methods(cls: type) -> tuple[_AllocateSlots, _CacheBlocks] | None:
        """`allocate_slots` and `cache_blocks` as method descriptors of `cls`
        (a subclass of this class; TypeError otherwise): no PyO3 argument
        matching, and the calls that change nothing are answered from the
        request's hot line. The facade's classes take them as their own
        methods. None in a build without the raw entry points."""
    def allocate_decode_batch(
        self,
        requests: Sequence[_Request],
        num_new_tokens: list[int],
        num_lookahead_tokens: int | None = None,
        num_computed_tokens: list[int] | None = None,
        num_tokens: list[int] | None = None,
    ) -> tuple[list[bool], list[int], list[int]]:
        """The decode `allocate_slots` of a whole step in one call: for each
        request in order, exactly `allocate_slots(request, num_new_tokens[i],
        num_lookahead_tokens=num_lookahead_tokens)`. Returns `(ok, offsets,
        ids)`: `ok[i]` is False where that call would return None; the new
        block ids of request i in group g are
        `ids[offsets[i*G + g] : offsets[i*G + g + 1]]`. A serving loop that
        tracks the counts itself passes `num_computed_tokens` / `num_tokens`
        lists, and the requests' attributes are then not read (their block
        hashes still are, when a block fills)."""
    def request_handle(self, request_id: str) -> int:
        """A handle for a request the manager holds (after its first
        allocation), for `allocate_decode_arrays`. It names that request
        until it is freed and is never reused; KeyError for a request the
        manager does not hold."""
    def allocate_decode_arrays(
        self,
        handles: list[int] | bytes | bytearray,
        num_new_tokens: list[int] | bytes | bytearray,
        num_computed_tokens: list[int] | bytes | bytearray,
        num_tokens: list[int] | bytes | bytearray,
        num_lookahead_tokens: int | None = None,
        requests: Sequence[_Request] | None = None,
    ) -> tuple[bytes, bytes, bytes]:
        """`allocate_decode_batch` over arrays (lists of ints, or bytes of
        little-endian uint64 handles / uint32 counts). `requests[i]` is read
        only for its `block_hashes` when a block fills (required with prefix
        caching). Everything is checked before anything changes. Returns
        `(ok, offsets, ids)` as bytes: one byte per request (0: None), then
        uint32 offsets and ids: request i's new blocks in group g are
        `ids[offsets[i*G+g] : offsets[i*G+g+1]]`."""
    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """vLLM's `get_blocks(request_id)`: the request's whole block table
        per group (null block 0 where a sliding window freed one); the
        shared empty KVCacheBlocks for a request without blocks or unknown."""
    def free(self, request: _Request) -> None:
        """vLLM's `free(request)`: the request's blocks go back to the pool,
        tail first (so a prefix's head is evicted last); cached blocks stay
        findable by `get_computed_blocks` until reused. For a finished or
        preempted request (a preempted one is re-admitted from
        `num_computed_tokens = 0`). A request the manager does not hold is a
        no-op."""
    def cache_blocks(self, request: _Request, num_computed_tokens: int) -> None:
        """vLLM's `cache_blocks(request, num_computed_tokens)`: prefix-caches
        the request's full blocks up to `num_computed_tokens` (after an
        allocation with `delay_cache_blocks=True` whose KV load finished).
        ValueError when the request lacks the blocks or block hashes."""
    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        """Frees the request's blocks that attention no longer reads at
        `total_computed_tokens` (outside a sliding window or attention
        chunk); `allocate_slots` does this itself. vLLM calls it before
        handing a table to a KV connector."""
    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drops the given blocks (any iterable of ids) from the prefix
        cache (their hashes are forgotten; held blocks stay with their
        requests). ValueError for an id out of range, before any change."""
    def reset_prefix_cache(self) -> bool:
        """Empties the prefix cache; True on success, False (nothing done)
        while any request still holds blocks, as vLLM's."""
    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Per group, how many leading blocks of that running request every
        running request shares (vLLM's cascade-attention hint)."""
    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block table per group, as ids (`get_blocks(..)
        .get_block_ids()`); empty lists for a request the manager does not hold."""
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[int]],
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int | None = None,
    ) -> int:
        """vLLM's `coordinator.get_num_blocks_to_allocate` (reads only);
        `prefill_end` only matters to Mamba align checkpoints (None: 0)."""
    def align_state(self, request_id: str, group: int) -> tuple[int | None, bool] | None:
        """Mamba align state of a request in a group:
        (last_state_block_idx or None, allocated), or None."""
    def mamba_pre_copy_plan(self, request_ids: list[str], num_accepted: list[int]) -> bytearray:
        """Pre-forward Mamba state-copy plan of this step (int32 rows of
        `group, dst, conv_src, temp_src, bias`, little endian) for the batch
        `request_ids`, given the worker's accepted-token counts."""
    def mamba_post_select_plan(self, request_ids: list[str], num_draft: list[int]) -> tuple[bytearray, int]:
        """Post-verification selection plan: (int32 rows as bytes, columns)."""
    def take_new_block_ids(self) -> list[int]:
        """Blocks newly allocated to full-attention groups since the last
        call (vLLM: the blocks the worker zeroes), then cleared."""
    def new_step_starts(self) -> None:
        """Call once at the start of every scheduler step (vLLM's
        `Scheduler.schedule` does): per-step bookkeeping such as the Mamba
        align groups' blocks cached this step."""
    def _take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """Mamba align states cached since the last call (vLLM's
        boundary-state offloads): {request id: [(group, block id, boundary tokens), ...]}, oldest
        first."""
    def _take_kv_cache_block_copies(self) -> list[tuple[int, int]]:
        """Copy-on-write copies of partial hash hits since the
        last call: (source, copy) block ids, each holding an extra reference
        the caller frees after the step."""
    def _finalize_partial_tail_offloads(self, request_id: str, num_computed_tokens: int,
                                            num_in_flight_tokens: int) -> list[tuple[int, int, int]]:
        """vLLM's `finalize_partial_tail_offloads`: (group, block id,
        boundary tokens) of the request's complete Mamba producer tails."""
    def _adopt_core(self, other: NativeManager) -> None:
        """Swaps this manager's core with `other`'s, keeping this side's
        Python bindings (the facade rebuilds an untouched manager in place)."""
    def _set_shared_prefix_checkpoint(self, on: bool) -> None:
        """vLLM's `mamba_shared_prefix_checkpoint` (narrowed by the facade), before the first request."""
    def _set_partial_hits_dcp(self, dcp_world_size: int) -> None:
        """vLLM's partial-hit rule under decode context parallelism
        (before the first request; the groups come scaled already)."""
    @property
    def _partial_hash_hits(self) -> bool:
        """vLLM's `enable_partial_hash_hits`."""
    def ref_cnt(self, block_id: int) -> int:
        """How many requests hold the block."""
    def block_hash(self, block_id: int) -> tuple[bytes, int] | None:
        """(hash bytes, group id) of a cached block, else None."""
    def block_hash_num_tokens(self, block_ids: Sequence[int]) -> list[int | None]:
        """vLLM's `block_hash_num_tokens` of each block: the prefix
        tokens its hash covers (a full block's end or a partial entry's
        boundary), None without a hash."""
    def _estimate_cached_tokens(self, request: _Request) -> int:
        """vLLM's `estimate_cached_tokens(request)`: over the
        prefix-cacheable groups other than cross attention, the fewest of
        each group's most tokens any of the request's blocks' hash covers
        (0 for none, or for a request the manager does not hold)."""
    def unhashed(self, block_ids: Sequence[int]) -> list[bool]:
        """Which of the given blocks carry no cached hash."""
    def cached_block_ids(self, block_hash: bytes, group_ids: Sequence[int]) -> list[int] | None:
        """vLLM's `block_pool.get_cached_block`, as ids: the earliest cached
        block of `block_hash` in each group, or None on any miss (reads only)."""
    @property
    def num_cached_keys(self) -> int:
        """Number of (block hash, group) keys in the prefix cache."""
    def _align_checkpoints(self, group: int) -> list[tuple[str, int, int]]:
        """vLLM's `_checkpoints` of Mamba align group `group`:
        (request id, position, table index) per request with a checkpoint."""
    def request_ids(self) -> list[str]:
        """Ids of the requests the manager holds state for."""
    def has_request(self, request_id: str) -> bool:
        """Whether the manager holds state for that request (allocated, not freed)."""
    def free_queue_ends(self) -> tuple[int, int] | None:
        """(front, back) of the free queue, or None when it is empty."""
    def free_queue_neighbors(self, block_id: int) -> tuple[int | None, int | None] | None:
        """A free block's (previous, next) free-queue neighbours (None at the
        queue's ends), or None if the block is not free."""
    def free_queue(self) -> list[int]:
        """The free queue's block ids, front (evicted next) first."""
    def check_invariants(self) -> None:
        """Checks every invariant of the pool, prefix cache and request
        tables (ref counts = holders, each free block in the free queue once,
        the null block never handed out, hashes and the prefix map agree,
        tables in range, no block in two groups, ...). A debugging aid:
        costs a pass over all blocks. Raises RuntimeError naming the first
        broken invariant; returns None otherwise."""

# ---- block hashing (rust/python/src/hasher.rs) ----


# extra_keys_fn(request, start, end, mm_idx) -> (extra keys or None, mm_idx):
# the release's generate_block_hash_extra_keys (end: the block's window end,
# the block plus its lookahead tokens).
_ExtraKeysFn: TypeAlias = Callable[[Any, int, int, int], tuple[tuple[Any, ...] | None, int]]

@final
class BlockHasher:
    """vLLM's request block hasher under behaviour profile `profile`'s rules
    ("whole-block-hits", "partial-block-hits"), natively and bit-identically, for hash_name "sha256_cbor",
    "xxhash_cbor", "sha256" or "xxhash" (others raise ValueError); none_hash
    is vLLM's NONE_HASH; num_hash_lookahead_tokens (profiles with lookahead hashes) the tokens
    after each block its hash covers. Use
    `hybridcache.hashing.make_request_block_hasher`."""

    def __new__(
        cls,
        hash_name: str,
        block_size: int,
        none_hash: bytes,
        extra_keys_fn: _ExtraKeysFn | None = None,
        profile: str = "whole-block-hits",
        num_hash_lookahead_tokens: int = 0,
    ) -> BlockHasher: ...
    @property
    def num_hash_lookahead_tokens(self) -> int:
        """Tokens after each block that its hash covers (0: none)."""
    @property
    def hash_name(self) -> str:
        """One of "sha256_cbor", "xxhash_cbor", "sha256", "xxhash"."""
    @property
    def block_size(self) -> int:
        """Tokens per hashed block (the manager's `hash_block_size`)."""
    @property
    def none_hash(self) -> bytes:
        """The parent hash of a request's first block (vLLM's NONE_HASH)."""
    @property
    def digest_size(self) -> int:
        """Length of a block hash: 32 (sha256*) or 16 (xxhash*)."""
    def digest(self, data: bytes) -> bytes:
        """The hash function on already serialized bytes."""
    def hash_block(
        self, parent: bytes | None, token_ids: Sequence[int], extra_keys: tuple[Any, ...] | None = None
    ) -> bytes:
        """vLLM's `hash_block_tokens(hash_fn, parent, token_ids, extra_keys)`."""
    def hash_blocks(
        self,
        token_ids: Iterable[int],
        parent: bytes | None = None,
        start_block: int = 0,
        extra_keys_per_block: Sequence[tuple[Any, ...] | None] | None = None,
    ) -> list[bytes]:
        """Hashes of the full blocks of token_ids from block start_block on,
        chained from parent; extra_keys_per_block has one entry per hashed block."""
    def __call__(self, request: Any) -> list[bytes]:
        """vLLM's `request_block_hasher(request)`: the hashes of the request's
        new full blocks (after `len(request.block_hashes)`)."""
    def _bound_call(self) -> Callable[[Any], list[bytes]]:
        """This hasher as a one-argument builtin bound to it (`__self__`),
        the cheapest call for vLLM's `Request`; same results as calling the
        hasher (the safe build returns the hasher itself)."""

def native_token_append(request_class: type, append: Any, update: Any) -> Any | None:
    """A method descriptor for vLLM's `Request` class standing for its
    `append_output_token_ids` (`append`) that hashes appended tokens with a
    request's `BlockHasher` in the same call; `update` is the class's
    `update_block_hashes`. ValueError for another class or methods than the
    first call's; None without the raw-ffi feature. Use
    `hybridcache.vllm_tokens.install_token_append`."""

def block_view(owner: NativeManager, block_id: int) -> BlockView:
    """The one view of block `block_id` of manager `owner` (vLLM keeps one
    `KVCacheBlock` per block; code compares them with `is`)."""

@final
class BlockView:
    """vLLM's `KVCacheBlock` fields as a live, read-only view of one block."""

    def __new__(cls, native: NativeManager, block_id: int) -> BlockView: ...
    @property
    def block_id(self) -> int:
        """The block's index in the pool (0: the null block)."""
    @property
    def ref_cnt(self) -> int:
        """How many requests hold the block now."""
    @property
    def block_hash(self) -> bytes | None:
        """vLLM's `BlockHashWithGroupId`: hash bytes + 4-byte big-endian group."""
    @property
    def block_hash_num_tokens(self) -> int | None:
        """vLLM's: prefix tokens the block's hash covers, or None."""
    @property
    def next_free_block(self) -> Any:
        """vLLM's free-list links: the next / previous block in the free queue
        (the queue's fake head / tail at its ends), or None if not free.
        Served by `block_pool.free_block_queue` of the owning manager."""
    @property
    def prev_free_block(self) -> Any:
        """See `next_free_block`."""
    @property
    def is_null(self) -> bool:
        """True for block 0, the null block (padding in tables)."""
    @property
    def _native(self) -> Any: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class KVCacheBlocks:
    """Block ids per KV-cache group (vLLM's `KVCacheBlocks`); `blocks` builds
    block views on demand."""

    def __new__(cls, block_ids: Iterable[Iterable[int]] | None = None, native: NativeManager | None = None, *,
                blocks: Iterable[Iterable[Any]] | None = None) -> KVCacheBlocks:
        """Block ids per group; `native`: the manager they belong to (needed
        for `blocks` and the unhashed queries). Or, as vLLM's dataclass is
        built, `blocks=`: blocks per group (objects with `block_id`, or ids)."""
    @overload
    def get_block_ids(self, allow_none: Literal[False] = False, group_ids: Sequence[int] | None = None) -> tuple[list[int], ...]: ...
    @overload
    def get_block_ids(self, allow_none: bool, group_ids: Sequence[int] | None = None) -> tuple[list[int], ...] | None:
        """Block ids per group (group g of the config is entry g; only the
        groups in `group_ids`, in that order, when given). With
        `allow_none=True`, None when no group holds a block: what vLLM's
        scheduler asks of each `allocate_slots` result, so a decode that
        added no block costs no list."""
    @property
    def blocks(self) -> tuple[list[BlockView], ...]:
        """Block views per group (vLLM's `KVCacheBlocks.blocks`)."""
    @property
    def _ids(self) -> tuple[list[int], ...]: ...
    @property
    def _native(self) -> Any: ...
    def get_unhashed_block_ids(self) -> list[int]:
        """Ids of group 0's blocks that carry no prefix-cache hash."""
    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        """Unhashed block ids per group, null (padding) blocks left out."""
    def __add__(self, other: KVCacheBlocks, /) -> KVCacheBlocks:
        """Group-wise concatenation (vLLM's `+`)."""
    def __radd__(self, other: KVCacheBlocks, /) -> KVCacheBlocks: ...
    def new_empty(self) -> KVCacheBlocks:
        """An empty KVCacheBlocks with as many groups."""
    def __eq__(self, other: object, /) -> bool: ...

def block_extra_keys(
    start: int,
    lora_request: Any = None,
    mm_keys: Sequence[Any] | None = None,
    cache_salt: Any = None,
    prompt_embeds_keys: Sequence[Any] | None = None,
    profile: str = "whole-block-hits",
    for_event: bool = False,
) -> tuple[Any, ...] | None:
    """The extra keys of the block starting at token `start` (vLLM's
    generate_block_hash_extra_keys order: LoRA, mm (identifier, offset)
    pairs, cache salt on the first block, prompt-embeds digest), in profile
    `profile`'s form ("partial-block-hits": each tagged, the LoRA with its path), or with
    `for_event` in the form KV events publish (untagged); None when there
    are none."""

def none_hash_seed(hash_name: str, pythonhashseed: str | None = None, profile: str = "whole-block-hits") -> str | None:
    """What profile `profile`'s init_none_hash hashes into NONE_HASH, given
    $PYTHONHASHSEED: the seed, or None for 32 random bytes ("whole-block-hits"
    unseeded); "partial-block-hits" unseeded: "vllm-none-hash" for sha256*, a
    random hex seed for xxhash*."""

def _register_request_class(cls: type) -> None:
    """Registers `hybridcache.request.Request` (done on import): a manager
    with prefix caching refuses such a request whose `_hash_block_size` is
    not its own `hash_block_size` (ValueError at its lookup or admission)."""
