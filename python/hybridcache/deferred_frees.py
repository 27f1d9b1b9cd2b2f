"""Deferred frees, for a release whose scheduler frees a finished request's
blocks after the step: the manager hands them out (`pop_blocks_for_free`,
forgetting the request) and the scheduler later drops their references
through `block_pool.free_blocks`, in eviction order."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hybridcache.block_pool import BlockPoolView
from hybridcache.blocks import BlockView, block_view

if TYPE_CHECKING:
    from hybridcache.facade import KVCacheManagerBase


class DeferredFrees:
    """Mixin for a release's facade (over `KVCacheManagerBase`)."""

    __slots__ = ()

    def pop_blocks_for_free(self, request: Any) -> list[BlockView]:
        """Forgets the request and returns its blocks in allocation order
        (leading null blocks left out) without freeing them: the caller
        hands them to `block_pool.free_blocks` later, tail first."""
        native: Any = self
        return [block_view(native, b) for b in native._pop_blocks_for_free(request.request_id)]


class DeferredFreeBlockPool(BlockPoolView):
    """`manager.block_pool` with the scheduler's deferred `free_blocks`."""

    def __init__(self, manager: KVCacheManagerBase) -> None:
        """The pool view of `manager`."""
        super().__init__(manager)

    def free_blocks(self, ordered_blocks: Any) -> None:  # type: ignore[override]
        """`free_blocks(blocks)`: drops the references of blocks
        `pop_blocks_for_free` handed out, in eviction order: those freed
        without a hash (or with caching off) are reused first, cached ones
        last. ValueError, nothing freed, for any other block."""
        self._native._free_handed_out(list(ordered_blocks))


__all__ = ["DeferredFreeBlockPool", "DeferredFrees"]
