"""`hybridcache.KVCacheManager`: vLLM 0.23.0's `KVCacheManager` API over the
native core. The hot methods (`allocate_slots`, `free`, `cache_blocks`) are
the native class's own, so a call costs one native call; this layer reads the
configuration, shapes events and stats, and makes no allocation decision."""

from __future__ import annotations

from typing import Any, cast

from hybridcache import _native
from hybridcache.block_pool import BlockPoolView
from hybridcache.blocks import BlockView, KVCacheBlocks, block_view
from hybridcache.config import read_groups, read_num_blocks, read_retention_interval
from hybridcache.coordinator import coordinator_view
from hybridcache.events import EventBuilder, prefix_cache_stats_class
from hybridcache.releases import profile_of


# The vLLM release whose semantics the core follows (its behaviour profile).
PROFILE = "0.23.0"


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


class KVCacheManager(_native.NativeManager):
    """Drop-in for `vllm.v1.core.kv_cache_manager.KVCacheManager` (vLLM
    0.23.0): the KV-cache blocks of every request of a serving loop, over one
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
            hash_block_size = that. Only for what vLLM 0.23.0 runs with it:
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
            with groups vLLM 0.23.0 asserts against (several groups or not
            full attention, with prefix caching).
        TypeError: a config without `kv_cache_groups`, a group without a spec.
        NotImplementedError: sink or encoder-only specs, dcp/pcp > 1 with a
            Mamba group.

    VLLM_PREFIX_CACHE_RETENTION_INTERVAL is read here, as vLLM 0.23.0 reads
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
    in the README.
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
        if max_num_batched_tokens is None:
            # As vLLM: no admission cap beyond max_model_len.
            max_num_batched_tokens = max_model_len
        elif not isinstance(max_num_batched_tokens, int):
            raise TypeError(f"max_num_batched_tokens must be an int, got {type(max_num_batched_tokens).__name__}")
        elif max_num_batched_tokens <= 0:
            # A step that schedules no token admits nothing: never a real config.
            raise ValueError(f"max_num_batched_tokens must be > 0, got {max_num_batched_tokens}")
        groups = read_groups(kv_cache_config, max_num_batched_tokens, max_model_len)
        scheduler_block_size = _positive_int("scheduler_block_size", scheduler_block_size)
        return cls._build(kv_cache_config, groups, max_model_len, scheduler_block_size, hash_block_size,
                          enable_caching, use_eagle, log_stats, enable_kv_cache_events, PROFILE,
                          retention_interval=read_retention_interval(groups, scheduler_block_size),
                          dcp_world_size=dcp_world_size, pcp_world_size=pcp_world_size,
                          metrics_collector=metrics_collector)

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
        """The native manager of `release`'s semantics over `groups`, with
        the Python side every release's facade shares."""
        self = cast("KVCacheManager", _native.NativeManager.__new__(
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
        self.dcp_world_size, self.pcp_world_size = dcp_world_size, pcp_world_size
        self._init_python_side(
            kv_cache_config, groups, max_model_len, enable_caching, use_eagle, log_stats, enable_kv_cache_events,
            metrics_collector, release, num_hash_lookahead_tokens,
        )
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Everything is set up in `__new__` (the native base needs its
        arguments there; see the class docstring for them); this only
        accepts the same arguments."""

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
        release: str = PROFILE,
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
        )
        self.block_pool = BlockPoolView(self)
        self.coordinator = coordinator_view(self)

    @property
    def _native(self) -> KVCacheManager:
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


_install_raw_methods(KVCacheManager)
