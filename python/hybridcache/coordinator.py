"""`manager.coordinator`: the parts of vLLM's `KVCacheCoordinator`
that code outside the manager reads, served by the native core.

vLLM's scheduler calls `kv_cache_manager.coordinator.get_num_blocks_to_allocate`
(`Scheduler._request_remaining_blocks`, the reservation of in-flight prefills
that gates async KV loads). Everything here is computed on demand; no Python
object is kept per request (block views: one per block, `blocks.block_view`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

from hybridcache.block_pool import ReadOnlyView
from hybridcache.blocks import BlockView, KVCacheBlocks, block_view

if TYPE_CHECKING:
    from hybridcache.facade import KVCacheManagerBase as KVCacheManager


def _group_block_ids(new_computed_blocks: Any, num_groups: int) -> list[list[int]]:
    """Block ids per group of `new_computed_blocks`: vLLM's tuple of block
    lists (`KVCacheBlocks.blocks`), a `KVCacheBlocks`, or lists of ids."""
    if new_computed_blocks is None:
        return [[] for _ in range(num_groups)]
    if isinstance(new_computed_blocks, KVCacheBlocks):
        new_computed_blocks = new_computed_blocks.get_block_ids()
    groups = list(new_computed_blocks)
    if len(groups) != num_groups:
        raise ValueError(f"new_computed_blocks has {len(groups)} groups, the manager has {num_groups}")
    out = []
    for g in groups:
        out.append([b if isinstance(b, int) else b.block_id for b in g] if g else [])
    return out


class LiveBlockList(Sequence):
    """`req_to_blocks[request_id]`: the request's block views of one group
    as they are at each read. vLLM hands out its live list, which later
    allocations extend and window frees overwrite in place, and its tests
    hold it across calls; read-only. Once the request is freed it keeps
    what the request held last, as vLLM's popped list does."""

    def __init__(self, manager: KVCacheManager, group: int, request_id: str) -> None:
        self._manager = manager
        self._group = group
        self._request_id = request_id
        self._last: list[BlockView] = []
        self._now()

    def _now(self) -> list[BlockView]:
        native = self._manager._native
        if native.has_request(self._request_id):
            null = self._manager.block_pool.null_block
            ids = native.get_block_ids(self._request_id)[self._group]
            self._last = [null if b == 0 else block_view(native, b) for b in ids]
        return self._last

    @overload
    def __getitem__(self, i: int) -> BlockView: ...
    @overload
    def __getitem__(self, i: slice) -> list[BlockView]: ...
    def __getitem__(self, i: int | slice) -> BlockView | list[BlockView]:
        return self._now()[i]

    def __len__(self) -> int:
        return len(self._now())

    def __iter__(self) -> Iterator[BlockView]:
        return iter(self._now())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LiveBlockList):
            other = other._now()
        return self._now() == other

    __hash__ = None  # type: ignore[assignment]  # as a list's

    def __repr__(self) -> str:
        return repr(self._now())


class _ReqToBlocksView(Mapping):
    """`single_type_managers[g].req_to_blocks`, read-only: request id ->
    block views of group `g`, built on access (block 0 is the pool's
    `null_block` object, as in vLLM)."""

    def __init__(self, manager: KVCacheManager, group: int) -> None:
        self._manager = manager
        self._group = group

    def __getitem__(self, request_id: str) -> LiveBlockList:
        if not self._manager._native.has_request(request_id):
            raise KeyError(request_id)
        return LiveBlockList(self._manager, self._group, request_id)

    def __contains__(self, request_id: object) -> bool:
        return isinstance(request_id, str) and self._manager._native.has_request(request_id)

    def __iter__(self) -> Iterator[str]:
        return iter(self._manager._native.request_ids())

    def __len__(self) -> int:
        return self._manager._native.num_requests


class SingleTypeManagerView(ReadOnlyView):
    """Read-only stand-in for one of vLLM's `SingleTypeKVCacheManager`s:
    `coordinator.single_type_managers[g]` offers `kv_cache_group_id` and
    `req_to_blocks` (request id -> block views of group g); other vLLM
    internals raise an AttributeError saying so."""

    def __init__(self, manager: KVCacheManager, group: int) -> None:
        """The view of group `group` of `manager`."""
        self.kv_cache_group_id = group
        self.req_to_blocks = _ReqToBlocksView(manager, group)

    def _missing(self, name: str) -> str:
        return (
            f"single_type_managers[{self.kv_cache_group_id}].{name} is a vLLM SingleTypeKVCacheManager "
            "internal that hybridcache does not provide (read-only here: req_to_blocks)"
        )


class CoordinatorView(ReadOnlyView):
    """`manager.coordinator`: a read-mostly stand-in for vLLM's
    `KVCacheCoordinator`, for code outside the manager that reads it
    (vLLM's scheduler calls `get_num_blocks_to_allocate`): the config
    fields, `single_type_managers`, `block_pool`, and the calls below. Its
    per-group managers live in the native core; other vLLM internals raise
    an AttributeError saying what is offered."""

    def __init__(self, manager: KVCacheManager) -> None:
        """The coordinator view of `manager`."""
        self._manager = manager
        self._native = manager._native
        self._num_groups = manager.num_kv_cache_groups
        self.kv_cache_config = manager.kv_cache_config
        self.max_model_len = manager.max_model_len
        self.enable_caching = manager.enable_caching
        self.use_eagle = manager.use_eagle
        self.single_type_managers = tuple(SingleTypeManagerView(manager, g) for g in range(self._num_groups))

    @property
    def block_pool(self) -> Any:
        """The manager's `block_pool` view."""
        return self._manager.block_pool

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[Any]] | KVCacheBlocks | None,
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        """vLLM's `coordinator.get_num_blocks_to_allocate` (reads only): how
        many free blocks allocating up to `num_tokens` tokens for the request
        would take, all groups together, given `new_computed_blocks` (vLLM's
        tuple of block lists, a `KVCacheBlocks`, or lists of ids; None: none)
        and `total_computed_tokens`. vLLM's scheduler uses it to reserve
        blocks for in-flight prefills. ValueError for a wrong number of groups
        or a bad count."""
        return self._native.get_num_blocks_to_allocate(
            request_id,
            num_tokens,
            _group_block_ids(new_computed_blocks, self._num_groups),
            num_encoder_tokens,
            total_computed_tokens,
            num_tokens_main_model,
            bool(apply_admission_cap),
        )

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Same as `manager.get_num_common_prefix_blocks`."""
        return self._native.get_num_common_prefix_blocks(running_request_id)

    def get_blocks(self, request_id: str) -> tuple[list[BlockView], ...]:
        """vLLM's `coordinator.get_blocks`: block views per group (built per call)."""
        native = self._native
        return tuple([block_view(native, b) for b in g] for g in native.get_block_ids(request_id))

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Same as `manager.remove_skipped_blocks`."""
        self._manager.remove_skipped_blocks(request_id, total_computed_tokens)

    def new_step_starts(self) -> None:
        """Same as `manager.new_step_starts`."""
        self._manager.new_step_starts()

    def _missing(self, name: str) -> str:
        return (
            f"coordinator.{name} is a vLLM KVCacheCoordinator internal that hybridcache does not "
            "provide (its per-group managers live in the native core; single_type_managers[g] "
            "offers a read-only req_to_blocks); use the KVCacheManager API"
        )


class KVCacheCoordinatorNoPrefixCache(CoordinatorView):
    """The coordinator view when prefix caching is off (named as vLLM's)."""


class UnitaryKVCacheCoordinator(CoordinatorView):
    """The coordinator view of a one-group model with prefix caching (named as vLLM's)."""


class HybridKVCacheCoordinator(CoordinatorView):
    """The coordinator view of a model of several groups with prefix caching (named as vLLM's)."""


_VIEWS: dict[str, type[CoordinatorView]] = {
    "no_prefix_cache": KVCacheCoordinatorNoPrefixCache,
    "unitary": UnitaryKVCacheCoordinator,
    "hybrid": HybridKVCacheCoordinator,
}


def coordinator_view(manager: KVCacheManager) -> CoordinatorView:
    """`manager.coordinator`: a view whose class is named as the coordinator
    vLLM builds for the same config (the core chose it)."""
    return _VIEWS[manager._native.coordinator_kind](manager)
