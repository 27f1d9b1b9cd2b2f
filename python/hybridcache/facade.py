"""The base of every release's facade (`KVCacheManagerBase`): vLLM's
`KVCacheManager` API over the native core. The hot methods (`allocate_slots`,
`free`, `cache_blocks`) are the native class's own, so a call costs one
native call; this layer reads the configuration, shapes events and stats,
and makes no allocation decision. Each release's facade class lives in its
folder (`hybridcache.releases`) and adds only what that release changed."""

from __future__ import annotations

from typing import Any, cast

from hybridcache import _native
from hybridcache.block_pool import BlockPoolView
from hybridcache.blocks import BlockView, KVCacheBlocks, block_view
from hybridcache.config import read_num_blocks
from hybridcache.coordinator import coordinator_view
from hybridcache.events import EventBuilder, EventSource, prefix_cache_stats_class
from hybridcache.releases import profile_of
from hybridcache.size_checks import check_scheduler_block_size


def _positive_int(name: str, v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    return v


# The metrics collector's method for each kind of the pool's log (kind 3: reset).
_METRIC_METHODS = ("on_block_allocated", "on_block_accessed", "on_block_evicted")


# The type of a native class's methods (PyO3's and the raw entry points).
_METHOD_DESCRIPTOR = type(_native.NativeManager.allocate_slots)


def _install_raw_methods(cls: type) -> None:
    """Gives `cls` the native raw entry points as its `allocate_slots` and
    `cache_blocks` (no PyO3 argument matching; most scheduler calls are
    answered from the request's hot line). They are the class's methods, made
    for exactly `cls`, so CPython specializes the scheduler's lookup and call
    of them; a method a subclass writes in Python stays in force."""
    raw = _native.NativeManager._raw_methods(cls)
    if raw is None:
        return
    for name, method in zip(("allocate_slots", "cache_blocks"), raw):
        first = next(c.__dict__[name] for c in cls.__mro__ if name in c.__dict__)
        if type(first) is _METHOD_DESCRIPTOR:
            setattr(cls, name, method)


class KVCacheManagerBase(_native.NativeManager):
    """What every release's facade shares: the native manager (the hot
    calls are its own), built by `_build` over groups a release's
    constructor read, and the Python side vLLM's API adds to it: KV events
    in the release's shape, prefix-cache stats, the metrics collector's
    calls, `create_kv_cache_blocks`, and the `block_pool` / `coordinator`
    views. A release's facade (`hybridcache.releases.<folder>.manager`)
    subclasses it with that release's constructor and differences; this
    class is not built directly.
    """

    # The facade's private state in slots: the instance dict keeps within
    # CPython's shared-keys limit (30 names), so the scheduler's method
    # and attribute lookups on a manager stay specialized.
    __slots__ = ("__dict__", "__weakref__", "_block_views", "_events", "_event_builder", "_stats_cls")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _install_raw_methods(cls)

    dcp_world_size: int
    pcp_world_size: int

    # An allocation whose prefix hit waits for a step that never starts
    # (`new_step_starts()` never called): the facades of vLLM releases answer
    # None there, as vLLM's managers do; hybridcache's own `KVCacheManager`
    # raises a RuntimeError saying so (True).
    _EXPLAINS_STEP_WAITS = False

    @classmethod
    def _build(
        cls,
        kv_cache_config: Any,
        groups: list[Any],
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        enable_caching: bool,
        use_eagle: bool,
        log_stats: bool,
        enable_kv_cache_events: bool,
        release: str,
        *,
        retention_interval: int | None = None,
        num_hash_lookahead_tokens: int = 0,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
    ) -> Any:
        """The native manager of core profile `release` over `groups`, with
        the Python side every release's facade shares."""
        self = cast("KVCacheManagerBase", _native.NativeManager.__new__(
            cls,
            read_num_blocks(kv_cache_config),
            [g.native for g in groups],
            max_model_len,
            _positive_int("scheduler_block_size", scheduler_block_size),
            _positive_int("hash_block_size", hash_block_size),
            bool(enable_caching),
            bool(use_eagle),
            bool(enable_kv_cache_events),
            retention_interval,
            profile_of(release),
            dcp_world_size,
            pcp_world_size,
        ))
        # After the core's own checks of the sizes (their errors come first).
        check_scheduler_block_size(groups, scheduler_block_size, dcp_world_size * pcp_world_size)
        self.dcp_world_size, self.pcp_world_size = dcp_world_size, pcp_world_size
        self._init_python_side(
            kv_cache_config, groups, max_model_len, enable_caching, use_eagle, log_stats, enable_kv_cache_events,
            metrics_collector, release, num_hash_lookahead_tokens,
        )
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Everything is set up in `__new__` (the native base needs its
        arguments there; see the release's facade class for them); this
        only accepts the same arguments."""

    def _init_python_side(
        self,
        kv_cache_config: Any,
        groups: list[Any],
        max_model_len: int,
        enable_caching: bool,
        use_eagle: bool,
        log_stats: bool,
        enable_kv_cache_events: bool,
        metrics_collector: Any,
        release: str,
        num_hash_lookahead_tokens: int = 0,
    ) -> None:
        self.release = release
        self.max_model_len = max_model_len
        self.enable_caching = bool(enable_caching)
        self.use_eagle = bool(use_eagle)
        self.log_stats = bool(log_stats)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.metrics_collector = metrics_collector
        self.kv_cache_config = kv_cache_config
        self.num_kv_cache_groups = len(groups)
        self._events: list[Any] = []
        # One view per block, made on first use (`_native.block_view`).
        self._block_views: list[Any] = [None] * self.num_blocks
        builder = (
            EventBuilder([(g.event_kind, g.sliding_window) for g in groups], release=release,
                         num_hash_lookahead_tokens=num_hash_lookahead_tokens)
            if enable_kv_cache_events else None
        )
        self._event_builder: Any = builder
        self._stats_cls: Any = prefix_cache_stats_class() if self.log_stats else None
        # Not bound to this manager: the native side holds it, and a
        # reference back would be a cycle the garbage collector cannot see.
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in groups))
        self._bind_python(
            self.empty_kv_cache_blocks,
            self._on_events if builder else None,
            self.log_stats,
            self._on_block_metrics if metrics_collector is not None else None,
            EventSource if builder else None,
            type(self)._EXPLAINS_STEP_WAITS,
        )
        self.block_pool = BlockPoolView(self)
        self.coordinator = coordinator_view(self)

    @property
    def _native(self) -> KVCacheManagerBase:
        """The native side (this object itself); kept for the views."""
        return self

    def _on_events(self, raw: list[tuple], request: Any) -> None:
        self._events.extend(self._event_builder.build(raw, request))

    def _on_block_metrics(self, raw: list[tuple[int, int]]) -> None:
        # The collector's calls vLLM's block pool made, in its order, each
        # with a view of the block (vLLM's collector reads `block_id`).
        collector = self.metrics_collector
        for kind, block_id in raw:
            if kind == 3:
                collector.reset()
            else:
                getattr(collector, _METRIC_METHODS[kind])(block_view(self, block_id))

    def create_kv_cache_blocks(self, blocks: tuple[Any, ...]) -> KVCacheBlocks:
        """vLLM's `create_kv_cache_blocks`: a `KVCacheBlocks` of this manager
        from block lists per group (block views / objects with `block_id`,
        or lists of ids). All groups empty: the shared `empty_kv_cache_blocks`."""
        ids = tuple(g if isinstance(g, list) and (not g or isinstance(g[0], int))
                    else [getattr(b, "block_id", b) for b in g] for g in blocks)
        if not any(ids):
            return self.empty_kv_cache_blocks
        return KVCacheBlocks(ids, self)

    # -- vLLM API beyond the native hot path ------------------------------

    def make_prefix_cache_stats(self) -> Any:
        """The prefix-cache stats since the last call, then reset: a
        `PrefixCacheStats` (vLLM's class when vLLM is importable, else
        `hybridcache.events.PrefixCacheStats`, same fields: reset, requests,
        queries, hits and their preempted_* counterparts), or None when
        `log_stats` is off."""
        return self._stats(take=True)

    @property
    def prefix_cache_stats(self) -> Any:
        """The stats gathered so far (a snapshot), or None without `log_stats`."""
        return self._stats(take=False)

    def _stats(self, take: bool) -> Any:
        if not self.log_stats:
            return None
        reset, requests, queries, hits, p_requests, p_queries, p_hits = self._take_stats(take)
        # One constructor call (the scheduler asks every step).
        return self._stats_cls(reset=reset, requests=requests, queries=queries, hits=hits,
                               preempted_requests=p_requests, preempted_queries=p_queries,
                               preempted_hits=p_hits)

    def take_events(self) -> list[Any]:
        """The KV events recorded since the last call, oldest first, then
        cleared: `BlockStored` / `BlockRemoved` / `AllBlocksCleared`
        (vLLM's classes when importable, else `hybridcache.events`' with the
        same fields). Always empty unless `enable_kv_cache_events`."""
        events, self._events = self._events, []
        return events

