"""Typing stub of the PyO3 extension `hybridcache._native` (rust/python/src/lib.rs).

Integer arguments are taken as Python ints (i64 on the Rust side); counts and
offsets that are negative raise ValueError naming the argument. Block hashes
are `bytes`. Errors of the core map to: ValueError (invalid argument),
KeyError (unknown request), NotImplementedError (unsupported feature),
RuntimeError (broken invariant or a caught panic).
"""

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Literal, TypeAlias, final

from typing_extensions import disjoint_base

__all__ = ["BlockHasher", "BlockView", "KVCacheBlocks", "NativeManager", "__version__"]

__version__: Final[str]

# ("stored", hashes, parent hash, start_token, end_token, block_size, group, positions)
_StoredEvent: TypeAlias = tuple[Literal["stored"], list[bytes], bytes | None, int, int, int, int, list[int]]
# ("removed", hash, group)
_RemovedEvent: TypeAlias = tuple[Literal["removed"], bytes, int]
# ("cleared",)
_ClearedEvent: TypeAlias = tuple[Literal["cleared"]]
_RawEvent: TypeAlias = _StoredEvent | _RemovedEvent | _ClearedEvent

# (kind, block_size, is_eagle_group, reports_new_block_ids, spec_class,
#  admission_cap, window_or_chunk, mamba_cache_mode, num_speculative_blocks).
# kind: "full_attention", "sliding_window", "chunked_local", "cross_attention"
# or "mamba" (any other raises NotImplementedError); window_or_chunk is the
# sliding window / attention chunk size (ignored by other kinds);
# mamba_cache_mode: "none", "all" or "align" (read for "mamba" only).
_GroupArg: TypeAlias = tuple[str, int, bool, bool, int, int | None, int, str, int]

@disjoint_base
class NativeManager:
    """The native manager; use `hybridcache.KVCacheManager`, which wraps it."""

    def __new__(
        cls,
        num_blocks: int,
        groups: Sequence[_GroupArg],
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_num_batched_tokens: int | None,
        enable_caching: bool,
        use_eagle: bool,
        enable_events: bool,
    ) -> NativeManager: ...
    def _bind_python(
        self, empty: KVCacheBlocks, event_sink: Callable[[list[_RawEvent], Any], None] | None, log_stats: bool = False
    ) -> None:
        """Called once by the facade: the shared empty KVCacheBlocks, the event
        sink (None when events are off) and whether lookups are counted."""
    @property
    def num_blocks(self) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def usage(self) -> float: ...
    @property
    def num_requests(self) -> int: ...
    def num_known_hashes(self, request_id: str) -> int: ...
    def get_computed_blocks(self, request: Any) -> tuple[KVCacheBlocks, int]:
        """vLLM's `get_computed_blocks(request)`: the longest prefix-cache hit
        as (KVCacheBlocks, hit tokens); the request's new hashes are stored
        first, and the lookup is counted for prefix-cache stats."""
    def _take_stats(self, take: bool = True) -> tuple[bool, int, int, int, int, int, int]:
        """Prefix-cache lookup counters since the last take (reset unless `take` is False):
        (reset, requests, queries, hits, preempted_requests, preempted_queries, preempted_hits)."""
    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int | None = None,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int | None = None,
        num_external_computed_tokens: int | None = None,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int | None = None,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int | None = None,
    ) -> Any:
        """vLLM 0.23.0's `KVCacheManager.allocate_slots`."""
    def _bound_allocate_slots(self) -> Any:
        """`allocate_slots` as a builtin bound to this manager (no PyO3 argument matching)."""
    def allocate_decode_batch(
        self,
        requests: list[Any],
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
        requests: list[Any] | None = None,
    ) -> tuple[bytes, bytes, bytes]:
        """`allocate_decode_batch` over arrays (lists of ints, or bytes of
        little-endian uint64 handles / uint32 counts). `requests[i]` is read
        only for its `block_hashes` when a block fills (required with prefix
        caching). Everything is checked before anything changes. Returns
        `(ok, offsets, ids)` as bytes: one byte per request (0: None), then
        uint32 offsets and ids: request i's new blocks in group g are
        `ids[offsets[i*G+g] : offsets[i*G+g+1]]`."""
    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """vLLM's `get_blocks(request_id)` (the shared empty KVCacheBlocks
        for a request without blocks)."""
    def free(self, request: Any) -> None:
        """vLLM's `free(request)`: frees the request's blocks, tail first."""
    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """vLLM's `cache_blocks(request, num_computed_tokens)`."""
    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None: ...
    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drops the given blocks (any iterable of ids) from the prefix cache."""
    def reset_prefix_cache(self) -> bool: ...
    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]: ...
    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]: ...
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[int]],
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        """vLLM's `coordinator.get_num_blocks_to_allocate` (reads only)."""
    def align_state(self, request_id: str, group: int) -> tuple[int | None, bool] | None:
        """Mamba align state of a request in a group:
        (last_state_block_idx or None, allocated), or None."""
    def mamba_pre_copy_plan(self, request_ids: list[str], num_accepted: list[int]) -> bytearray:
        """Pre-forward Mamba state-copy plan of this step (int32 rows of
        `group, dst, conv_src, temp_src, bias`, little endian) for the batch
        `request_ids`, given the worker's accepted-token counts."""
    def mamba_post_select_plan(self, request_ids: list[str], num_draft: list[int]) -> tuple[bytearray, int]:
        """Post-verification selection plan: (int32 rows as bytes, columns)."""
    def take_new_block_ids(self) -> list[int]: ...
    def new_step_starts(self) -> None: ...
    def ref_cnt(self, block_id: int) -> int: ...
    def block_hash(self, block_id: int) -> tuple[bytes, int] | None:
        """(hash bytes, group id) of a cached block, else None."""
    def unhashed(self, block_ids: Sequence[int]) -> list[bool]:
        """Which of the given blocks carry no cached hash."""
    def cached_block_ids(self, block_hash: bytes, group_ids: Sequence[int]) -> list[int] | None:
        """vLLM's `block_pool.get_cached_block`, as ids: the earliest cached
        block of `block_hash` in each group, or None on any miss (reads only)."""
    @property
    def num_cached_keys(self) -> int:
        """Number of (block hash, group) keys in the prefix cache."""
    def request_ids(self) -> list[str]:
        """Ids of the requests the manager holds state for."""
    def has_request(self, request_id: str) -> bool: ...
    def free_queue_ends(self) -> tuple[int, int] | None:
        """(front, back) of the free queue, or None when it is empty."""
    def free_queue_neighbors(self, block_id: int) -> tuple[int | None, int | None] | None:
        """A free block's (previous, next) free-queue neighbours (None at the
        queue's ends), or None if the block is not free."""
    def free_queue(self) -> list[int]: ...
    def check_invariants(self) -> None: ...

# ---- block hashing (rust/python/src/hasher.rs) ----


# extra_keys_fn(request, start, end, mm_idx) -> (extra keys or None, mm_idx):
# vLLM's generate_block_hash_extra_keys.
_ExtraKeysFn: TypeAlias = Callable[[Any, int, int, int], tuple[tuple[Any, ...] | None, int]]

@final
class BlockHasher:
    """vLLM 0.23.0's request block hasher, natively and bit-identically, for
    hash_name "sha256_cbor", "xxhash_cbor", "sha256" or "xxhash" (others raise
    ValueError); none_hash is vLLM's NONE_HASH. Use
    `hybridcache.hashing.make_request_block_hasher`."""

    def __new__(
        cls,
        hash_name: str,
        block_size: int,
        none_hash: bytes,
        extra_keys_fn: _ExtraKeysFn | None = None,
    ) -> BlockHasher: ...
    @property
    def hash_name(self) -> str: ...
    @property
    def block_size(self) -> int: ...
    @property
    def none_hash(self) -> bytes: ...
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


@final
class BlockView:
    """vLLM's `KVCacheBlock` fields as a live, read-only view of one block."""

    def __new__(cls, native: Any, block_id: int) -> BlockView: ...
    @property
    def block_id(self) -> int: ...
    @property
    def ref_cnt(self) -> int: ...
    @property
    def block_hash(self) -> bytes | None:
        """vLLM's `BlockHashWithGroupId`: hash bytes + 4-byte big-endian group."""
    @property
    def next_free_block(self) -> Any:
        """vLLM's free-list links: the next / previous block in the free queue
        (the queue's fake head / tail at its ends), or None if not free.
        Served by `block_pool.free_block_queue` of the owning manager."""
    @property
    def prev_free_block(self) -> Any: ...
    @property
    def is_null(self) -> bool: ...
    @property
    def _native(self) -> Any: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class KVCacheBlocks:
    """Block ids per KV-cache group (vLLM's `KVCacheBlocks`); `blocks` builds
    block views on demand."""

    def __new__(cls, block_ids: Iterable[Iterable[int]], native: Any = None) -> KVCacheBlocks: ...
    def get_block_ids(
        self, allow_none: bool = False, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None: ...
    @property
    def blocks(self) -> tuple[list[BlockView], ...]:
        """Block views per group (vLLM's `KVCacheBlocks.blocks`)."""
    @property
    def _ids(self) -> tuple[list[int], ...]: ...
    @property
    def _native(self) -> Any: ...
    def get_unhashed_block_ids(self) -> list[int]: ...
    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        """Unhashed block ids per group, null (padding) blocks left out."""
    def __add__(self, other: KVCacheBlocks, /) -> KVCacheBlocks: ...
    def __radd__(self, other: KVCacheBlocks, /) -> KVCacheBlocks: ...
    def new_empty(self) -> KVCacheBlocks: ...
    def __eq__(self, other: object, /) -> bool: ...
