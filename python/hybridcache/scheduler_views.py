"""The vLLM internals a scheduler, engine and connectors of a release
running the partial-block-hits profile read of its facade
(`partial_hits_manager.PartialHitsManager`), as live views over the native
manager:
`manager.block_pool` (with the scheduler's deferred `free_blocks`),
`manager.coordinator` (registered with the coordinator class vLLM would
build, `find_longest_cache_hit_per_group` for the offloading
connector), each `single_type_managers[g]` (named after and registered with
the vLLM manager class its spec gets)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from hybridcache.blocks import BlockView, block_view
from hybridcache.coordinator import CoordinatorView, SingleTypeManagerView, _group_block_ids
from hybridcache.deferred_frees import DeferredFreeBlockPool
from hybridcache.loaded_vllm import loaded_vllm
from hybridcache.layout_checks import layout_kind

if TYPE_CHECKING:
    from hybridcache.partial_hits_manager import PartialHitsManager

# The core profile of the releases these views serve.
PROFILE = "partial-block-hits"


class SchedulerBlockPoolView(DeferredFreeBlockPool):
    """`manager.block_pool` for these releases: the shared pool views with the
    scheduler's deferred frees (`free_blocks` of blocks
    `pop_blocks_for_free` returned), plus vLLM's pool fields."""

    def __init__(self, manager: PartialHitsManager) -> None:
        """The pool view of `manager`, with vLLM's pool fields
        (`num_hash_lookahead_tokens`, `hash_block_size`)."""
        super().__init__(manager)
        self.num_hash_lookahead_tokens = manager.num_hash_lookahead_tokens
        self.hash_block_size = manager._hash_block_size


class EvictFirstBlockPoolView(SchedulerBlockPoolView):
    """`SchedulerBlockPoolView` of a release whose pool's `free_blocks`
    takes `evict_first` (the row's `evict_first`)."""

    def free_blocks(self, ordered_blocks: Any, evict_first: bool = False) -> None:
        """`free_blocks(blocks, evict_first=False)`: drops the references of
        blocks `pop_blocks_for_free` handed out, in eviction order: those
        freed without a hash (or with caching off) are reused first, cached
        ones last, or first too with `evict_first` (blocks another tier
        already holds). ValueError, nothing freed, for any other block."""
        self._native._free_handed_out(list(ordered_blocks), bool(evict_first))


class SchedulerCoordinatorView(CoordinatorView):
    """`manager.coordinator` for these releases: what their scheduler and
    engine read (`single_type_managers[g].block_size` / `.kv_cache_spec`,
    `enable_partial_hash_hits`) and call (`get_num_blocks_to_allocate`
    with vLLM's arguments)."""

    _manager: PartialHitsManager

    def __init__(self, manager: PartialHitsManager) -> None:
        """The coordinator view of `manager`, with per-group views that
        carry each group's spec and block size."""
        super().__init__(manager)
        # vLLM's `enable_partial_hash_hits`: hits land on hash blocks.
        self.enable_partial_hash_hits = bool(manager._native._partial_hash_hits)
        groups = list(manager.kv_cache_config.kv_cache_groups)
        self.single_type_managers = tuple(
            _manager_view_class(groups[g].kv_cache_spec)(manager, g, groups[g].kv_cache_spec)
            for g in range(self._num_groups)
        )
        self.eagle_group_ids = {i for i, g in enumerate(groups) if getattr(g, "is_eagle_group", False)}
        if manager.use_eagle and not self.eagle_group_ids:
            self.eagle_group_ids = set(range(len(groups)))
        self.drop_eagle_group_ids = self.eagle_group_ids if manager.use_eagle else set()
        self.num_reprefillable_tokens = manager.num_reprefillable_tokens
        self.group_block_sizes = tuple(m.block_size for m in self.single_type_managers)
        if manager.coordinator_kind == "hybrid":
            # The hybrid coordinator's dense reference group (full attention
            # sorts first), None without one; other coordinators lack it.
            self.full_attention_group_id = next(
                (i for i, g in enumerate(groups) if layout_kind(g.kv_cache_spec) in ("full", "rswa")
                 and getattr(g.kv_cache_spec, "prefix_cacheable", True)), None)
        self.scheduler_block_size = manager._scheduler_block_size

    @property
    def retention_interval(self) -> int | None:
        """vLLM's sparse-retention interval (`KVCacheConfig.prefix_cache_retention_interval`,
        or the value assigned here since)."""
        return self._manager._retention_interval

    @retention_interval.setter
    def retention_interval(self, value: Any) -> None:
        """Assignable before the manager's first request (see
        `PartialHitsManager._assign_retention_interval`)."""
        self._manager._assign_retention_interval(value)

    def get_num_blocks_to_allocate(  # type: ignore[override]
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Any,
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """vLLM's count (`prefill_end` only matters to Mamba align
        checkpoints; vLLM ignores it unless the retention interval is 0)."""
        if self._manager._retention_interval != 0:
            prefill_end = 0
        return int(self._native.get_num_blocks_to_allocate(
            request_id, num_tokens, _group_block_ids(new_computed_blocks, self._num_groups), num_encoder_tokens,
            total_computed_tokens, num_tokens_main_model, bool(apply_admission_cap), prefill_end,
        ))

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """The manager's `remove_skipped_blocks` (R-SWA gaps given the prompt length)."""
        self._manager._native.remove_skipped_blocks(request_id, processed_computed_tokens, num_prompt_tokens)

    def reset_prefix_cache(self) -> bool:
        """Resets the pool's prefix cache (the manager's call)."""
        return bool(self._manager._native.reset_prefix_cache())

    def pop_blocks_for_free(self, request_id: str) -> list[BlockView]:
        """The manager's `pop_blocks_for_free` by request id."""
        native = self._manager._native
        return [block_view(native, b) for b in native._pop_blocks_for_free(request_id)]


class HybridKVCacheCoordinator(SchedulerCoordinatorView):
    """`SchedulerCoordinatorView` of a layout vLLM serves with its
    HybridKVCacheCoordinator (several groups, prefix caching), with that
    class's per-group hit search. Registered as a virtual subclass of
    vLLM's class, so the offloading connector's `isinstance` check passes."""

    def __init__(self, manager: PartialHitsManager) -> None:
        """The coordinator view of `manager`."""
        super().__init__(manager)
        # Only on vLLM's hybrid coordinator (the granularity of request.block_hashes).
        self.hash_block_size = manager._hash_block_size
        vllm_cls = _loaded_vllm("vllm.v1.core.kv_cache_coordinator", "HybridKVCacheCoordinator")
        if vllm_cls is not None and not issubclass(HybridKVCacheCoordinator, vllm_cls):
            vllm_cls.register(HybridKVCacheCoordinator)

    @property
    def _cache_hit_alignment_tokens(self) -> int:
        """Where hits may end: hash blocks under partial hash hits, else
        scheduler blocks (vLLM's hybrid coordinator)."""
        return _cache_hit_alignment_tokens(self._manager)

    def find_longest_cache_hit_per_group(
        self, block_hashes: list[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[BlockView], ...], tuple[int, ...]]:
        """vLLM's per-group lookup: each group's own hit over
        `block_hashes`, not reconciled with the other groups (blocks per
        group, hit tokens per group)."""
        blocks, hits = self._manager._native._find_longest_cache_hit_per_group(block_hashes, max_cache_hit_length)
        return tuple(list(g) for g in blocks.blocks), tuple(hits)


def _loaded_vllm(module_name: str, name: str) -> Any:
    """`name` of vLLM's module `module_name` where the loaded vLLM runs the
    partial-block-hits profile (`hybridcache.loaded_vllm`)."""
    return loaded_vllm(PROFILE, module_name, name)


# The coordinator view is named as the coordinator vLLM builds for
# the layout (its tests check the class name).
_COORDINATOR_VIEWS: dict[str, type[SchedulerCoordinatorView]] = {
    **{kind: type(name, (SchedulerCoordinatorView,), {"__doc__": f"`SchedulerCoordinatorView` of a layout vLLM serves with its {name}."})
       for kind, name in (("no_prefix_cache", "KVCacheCoordinatorNoPrefixCache"), ("unitary", "UnitaryKVCacheCoordinator"))},
    "hybrid": HybridKVCacheCoordinator,
}


class _NumCachedBlockView(Mapping):
    """`single_type_managers[g].num_cached_block`, read-only: running
    request id -> blocks of group g cached so far."""

    def __init__(self, manager: PartialHitsManager, group: int) -> None:
        """The cached-block counts of group `group` of `manager`."""
        self._native = manager
        self._group = group

    def __getitem__(self, request_id: str) -> int:
        n = self._native._num_cached_blocks(request_id, self._group) if isinstance(request_id, str) else None
        if n is None:
            raise KeyError(request_id)
        return int(n)

    def __iter__(self) -> Iterator[str]:
        return iter([r for r in self._native.request_ids() if self._native._num_cached_blocks(r, self._group) is not None])

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _GroupManagerView(SingleTypeManagerView):
    """One group's manager as vLLM's scheduler, engine and connectors
    read it: `block_size`, `kv_cache_spec`, `block_pool`, `_null_block` (what
    `req_to_blocks` lists outside a window), and the read-only
    `req_to_blocks` / `num_cached_block` views."""

    def __init__(self, manager: PartialHitsManager, group: int, spec: Any) -> None:
        """The view of group `group` of `manager`, whose spec is `spec`."""
        super().__init__(manager, group)
        self.kv_cache_spec = spec
        # vLLM's manager holds block_size * dcp tokens per block (dcp-sharded specs).
        self.block_size = manager._block_sizes[group]
        self.dcp_world_size = self.block_size // int(spec.block_size)
        self.block_pool = manager.block_pool
        self.num_cached_block = _NumCachedBlockView(manager, group)
        # The object `req_to_blocks` lists for blocks outside a window.
        self._null_block = manager.block_pool.null_block
        self._manager = manager
        # Only vLLM's hybrid coordinator lowers it (to hash blocks).
        self.cache_hit_alignment_tokens = (_cache_hit_alignment_tokens(manager) if manager.coordinator_kind == "hybrid"
                                           else manager._scheduler_block_size)

    @property
    def _checkpoints(self) -> dict[str, tuple[int, int]]:
        """A Mamba align group's prefill checkpoints of each request's last
        allocation: request id -> (position, table index), as vLLM's
        MambaManager keeps them (a copy; other groups lack it)."""
        if getattr(self.kv_cache_spec, "mamba_cache_mode", None) != "align":
            raise AttributeError(self._missing("_checkpoints"))
        native = self._manager._native
        return {r: (p, i) for r, p, i in native._align_checkpoints(self.kv_cache_group_id)}


def _cache_hit_alignment_tokens(manager: PartialHitsManager) -> int:
    """vLLM's `_cache_hit_alignment_tokens` of `manager`'s hybrid coordinator."""
    return manager._hash_block_size if manager._native._partial_hash_hits else manager._scheduler_block_size


_MANAGER_VIEWS: dict[type, type[_GroupManagerView]] = {}


def _manager_view_class(spec: Any) -> type[_GroupManagerView]:
    """The per-group view class for `spec`: named as, and registered with,
    the `SingleTypeKVCacheManager` class vLLM would run the group
    with (its spec registry's choice), when vLLM has loaded it."""
    registry = _loaded_vllm("vllm.v1.kv_cache_spec_registry", "KVCacheSpecRegistry")
    vllm_cls = registry.get_manager_class(spec) if registry is not None else None
    if vllm_cls is None:
        return _GroupManagerView
    view = _MANAGER_VIEWS.get(vllm_cls)
    if view is None:
        view = type(vllm_cls.__name__, (_GroupManagerView,),
                    {"__doc__": f"`_GroupManagerView` of a group vLLM runs with its {vllm_cls.__name__}."})
        vllm_cls.register(view)
        _MANAGER_VIEWS[vllm_cls] = view
    return view


__all__ = ["EvictFirstBlockPoolView", "SchedulerBlockPoolView", "SchedulerCoordinatorView", "HybridKVCacheCoordinator"]
