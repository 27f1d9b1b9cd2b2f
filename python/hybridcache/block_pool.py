"""`manager.block_pool`: the parts of vLLM's `BlockPool` that schedulers and
connectors read, as live views over the native pool."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hybridcache.blocks import BlockView

if TYPE_CHECKING:
    from hybridcache.manager import KVCacheManager


class _Blocks(Sequence):
    """`block_pool.blocks[i]`, built only when indexed."""

    def __init__(self, native: Any) -> None:
        self._native = native

    def __len__(self) -> int:
        return self._native.num_blocks

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [BlockView(self._native, b) for b in range(len(self))[i]]
        n = len(self)
        if not isinstance(i, int) or not -n <= i < n:
            raise IndexError(f"block index {i!r} out of range for {n} blocks")
        return BlockView(self._native, i % n)


class _FreeQueueView:
    def __init__(self, native: Any) -> None:
        self._native = native

    @property
    def num_free_blocks(self) -> int:
        return self._native.num_free_blocks

    def get_all_free_blocks(self) -> list[BlockView]:
        return [BlockView(self._native, b) for b in self._native.free_queue()]

    def __len__(self) -> int:
        return self._native.num_free_blocks

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"free_block_queue.{name} is a vLLM FreeKVCacheBlockQueue internal (its linked list) that "
            "hybridcache does not provide; use num_free_blocks or get_all_free_blocks()"
        )


class BlockPoolView:
    def __init__(self, manager: KVCacheManager) -> None:
        self._manager = manager
        native = manager._native
        self._native = native
        self.num_gpu_blocks: int = native.num_blocks
        self.enable_caching = manager.enable_caching
        self.blocks = _Blocks(native)
        self.free_block_queue = _FreeQueueView(native)
        self.null_block = BlockView(native, 0)
        self.metrics_collector = None

    @property
    def enable_kv_cache_events(self) -> bool:
        m = self._manager
        flag = getattr(m, "enable_kv_cache_events", None)
        if flag is not None:
            return bool(flag)
        return getattr(m, "_event_builder", None) is not None

    def get_num_free_blocks(self) -> int:
        return self._native.num_free_blocks

    def get_usage(self) -> float:
        return self._native.usage

    def take_events(self) -> list[Any]:
        return self._manager.take_events()

    def touch(self, blocks: Any) -> None:
        raise NotImplementedError(
            "block_pool.touch (taking extra references on GPU blocks, e.g. by the "
            "SimpleCPUOffloadConnector) is not supported by hybridcache yet"
        )

    def free_blocks(self, ordered_blocks: Any, prepend: bool = False) -> None:
        raise NotImplementedError(
            "block_pool.free_blocks (dropping references taken with touch) is not supported by hybridcache yet"
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"block_pool.{name} is a vLLM BlockPool internal that hybridcache does not provide "
            "(the pool lives in the native core)"
        )
