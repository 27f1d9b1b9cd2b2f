"""`manager.block_pool`: the parts of vLLM's `BlockPool` that schedulers,
connectors and vLLM's own tests read, as live views over the native pool.
Views are built only when accessed; nothing here is on the allocation path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hybridcache.blocks import BlockView, block_view

if TYPE_CHECKING:
    from hybridcache.facade import KVCacheManagerBase as KVCacheManager


class ReadOnlyView:
    """A stand-in for a vLLM object: names hybridcache does not provide (vLLM
    internals) raise an AttributeError saying what the view does offer."""

    def _missing(self, name: str) -> str:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes the view does not define.
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(self._missing(name))


class _Blocks(Sequence):
    """`block_pool.blocks[i]`, built only when indexed."""

    def __init__(self, native: Any) -> None:
        self._native = native

    def __len__(self) -> int:
        return self._native.num_blocks

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [block_view(self._native, b) for b in range(len(self))[i]]
        n = len(self)
        if not isinstance(i, int) or not -n <= i < n:
            raise IndexError(f"block index {i!r} out of range for {n} blocks")
        return block_view(self._native, i % n)


class _FakeFreeListBlock:
    """vLLM's `fake_free_list_head` / `fake_free_list_tail` sentinels (block_id -1)."""

    block_id = -1
    ref_cnt = 0
    block_hash = None
    is_null = False

    def __init__(self, queue: _FreeQueueView, is_head: bool) -> None:
        self._queue = queue
        self._is_head = is_head

    @property
    def next_free_block(self) -> Any:
        if not self._is_head:
            return None
        ends = self._queue._native.free_queue_ends()
        return self._queue.fake_free_list_tail if ends is None else block_view(self._queue._native, ends[0])

    @property
    def prev_free_block(self) -> Any:
        if self._is_head:
            return None
        ends = self._queue._native.free_queue_ends()
        return self._queue.fake_free_list_head if ends is None else block_view(self._queue._native, ends[1])

    def __repr__(self) -> str:
        return f"<free list fake {'head' if self._is_head else 'tail'}>"


class _FreeQueueView(ReadOnlyView):
    """`block_pool.free_block_queue`: counts, the ordered free list, and its
    links (`fake_free_list_head/tail`, `BlockView.next_free_block` /
    `prev_free_block`), read from the native queue on access."""

    def __init__(self, native: Any) -> None:
        self._native = native
        self.fake_free_list_head = _FakeFreeListBlock(self, True)
        self.fake_free_list_tail = _FakeFreeListBlock(self, False)

    @property
    def num_free_blocks(self) -> int:
        return self._native.num_free_blocks

    def get_all_free_blocks(self) -> list[BlockView]:
        return [block_view(self._native, b) for b in self._native.free_queue()]

    def __len__(self) -> int:
        return self._native.num_free_blocks

    def _free_link(self, block_id: int, forward: bool) -> Any:
        """A block's next (forward) or previous free block: a view, a fake
        end, or None when the block is not in the free queue."""
        links = self._native.free_queue_neighbors(block_id)
        if links is None:
            return None
        b = links[1] if forward else links[0]
        if b is None:
            return self.fake_free_list_tail if forward else self.fake_free_list_head
        return block_view(self._native, b)

    def _missing(self, name: str) -> str:
        return (
            f"free_block_queue.{name} is a vLLM FreeKVCacheBlockQueue internal that hybridcache "
            "does not provide (the queue is read-only here: num_free_blocks, get_all_free_blocks(), "
            "fake_free_list_head/tail links)"
        )


class _CachedBlockMapView(ReadOnlyView):
    """`block_pool.cached_block_hash_to_block`, read-only: its size (the
    number of (block hash, group) keys) and lookups. Its mutators and `_cache`
    are vLLM internals hybridcache does not expose."""

    def __init__(self, native: Any) -> None:
        self._native = native

    def __len__(self) -> int:
        return self._native.num_cached_keys

    def __bool__(self) -> bool:
        return self._native.num_cached_keys > 0

    def get_one_block(self, key: bytes) -> BlockView | None:
        """By vLLM's `BlockHashWithGroupId` (hash bytes + 4-byte big-endian group)."""
        key = bytes(key)
        ids = self._native.cached_block_ids(key[:-4], [int.from_bytes(key[-4:], "big")])
        return None if ids is None else block_view(self._native, ids[0])

    def _missing(self, name: str) -> str:
        return (
            f"cached_block_hash_to_block.{name}: the prefix-cache map lives in the native core; "
            "hybridcache exposes it read-only (len(), get_one_block())"
        )


class _EventQueueView(ReadOnlyView, Sequence):
    """`block_pool.kv_event_queue`, read-only: the KV events not yet taken."""

    def __init__(self, manager: KVCacheManager) -> None:
        self._manager = manager

    def __len__(self) -> int:
        return len(self._manager._events)

    def __getitem__(self, i: Any) -> Any:
        return self._manager._events[i]

    def _missing(self, name: str) -> str:
        return (
            f"kv_event_queue.{name}: hybridcache's kv_event_queue is a read-only view; "
            "events come from the native core (take them with take_events())"
        )


class BlockPoolView(ReadOnlyView):
    """`manager.block_pool`: the parts of vLLM's `BlockPool` that
    schedulers, KV connectors and vLLM's tests read, as live read-only
    views over the native pool: `num_gpu_blocks`, `blocks[i]` (block views),
    `null_block` (block 0), `free_block_queue`, `cached_block_hash_to_block`,
    `kv_event_queue`, `get_num_free_blocks()`, `get_usage()`,
    `get_cached_block()`, `take_events()`. Other vLLM internals raise an
    AttributeError saying what is offered; mutators raise NotImplementedError.

    Args:
        manager: the `KVCacheManager` whose pool this is.
    """

    def __init__(self, manager: KVCacheManager) -> None:
        self._manager = manager
        native = manager._native
        self._native = native
        self.num_gpu_blocks: int = native.num_blocks
        self.enable_caching = manager.enable_caching
        self.blocks = _Blocks(native)
        self.free_block_queue = _FreeQueueView(native)
        self.null_block = block_view(native, 0)
        self.metrics_collector = manager.metrics_collector
        self.cached_block_hash_to_block = _CachedBlockMapView(native)
        self.kv_event_queue = _EventQueueView(manager)

    @property
    def enable_kv_cache_events(self) -> bool:
        """Whether the manager records KV events."""
        m = self._manager
        flag = getattr(m, "enable_kv_cache_events", None)
        if flag is not None:
            return bool(flag)
        return getattr(m, "_event_builder", None) is not None

    def get_num_free_blocks(self) -> int:
        """Blocks in the free queue, cached ones included (they are evicted
        least recently freed first); the null block is never counted."""
        return self._native.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of the usable blocks (all but the null block) held by
        requests, in [0, 1]; `manager.usage` is the same."""
        return self._native.usage

    def get_cached_block(self, block_hash: bytes, kv_cache_group_ids: list[int]) -> list[BlockView] | None:
        """vLLM's `get_cached_block`: the first cached block of `block_hash`
        in each group, or None if any group misses (reads only)."""
        ids = self._native.cached_block_ids(bytes(block_hash), list(kv_cache_group_ids))
        if ids is None:
            return None
        return [block_view(self._native, b) for b in ids]

    def take_events(self) -> list[Any]:
        """The manager's pending KV events, then cleared (`manager.take_events()`)."""
        return self._manager.take_events()

    def evict_blocks(self, block_ids: Any) -> None:
        """vLLM's `evict_blocks`: the given blocks leave the prefix cache
        (held ones stay allocated), as `manager.evict_blocks` does; a KV
        connector and vLLM's scheduler tests call it on the pool."""
        self._manager.evict_blocks(block_ids)

    def touch(self, blocks: Any) -> None:
        """vLLM's `touch` (extra references on blocks): not supported;
        raises NotImplementedError."""
        raise NotImplementedError(
            "block_pool.touch (taking extra references on GPU blocks, e.g. by the "
            "SimpleCPUOffloadConnector) is not supported by hybridcache yet"
        )

    def free_blocks(self, ordered_blocks: Any, prepend: bool = False) -> None:
        """vLLM's `free_blocks` (dropping references taken with `touch`):
        not supported; raises NotImplementedError."""
        raise NotImplementedError(
            "block_pool.free_blocks (dropping references taken with touch) is not supported by hybridcache yet"
        )

    def _missing(self, name: str) -> str:
        return (
            f"block_pool.{name} is a vLLM BlockPool internal that hybridcache does not provide "
            "(the pool lives in the native core)"
        )
