"""`hybridcache.KVCacheManager`: vLLM 0.23.0's `KVCacheManager` API over the
native core. The hot methods (`allocate_slots`, `free`, `cache_blocks`) are
the native class's own, so a call costs one native call; this layer reads the
configuration, shapes events and stats, and makes no allocation decision."""

from __future__ import annotations

from typing import Any

from hybridcache import _native
from hybridcache.block_pool import BlockPoolView
from hybridcache.blocks import KVCacheBlocks
from hybridcache.config import check_retention_interval, read_groups, read_num_blocks
from hybridcache.coordinator import CoordinatorView
from hybridcache.events import EventBuilder, prefix_cache_stats_class


# The vLLM release whose semantics the core follows (its behaviour profile).
PROFILE = "0.23.0"


def _positive_int(name: str, v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    return v


def _check_supported(dcp_world_size: int, pcp_world_size: int, metrics_collector: Any) -> None:
    if dcp_world_size != 1 or pcp_world_size != 1:
        raise NotImplementedError(
            f"decode/prefill context parallelism (dcp_world_size={dcp_world_size}, "
            f"pcp_world_size={pcp_world_size}) is not supported by hybridcache yet"
        )
    if metrics_collector is not None:
        raise NotImplementedError(
            "metrics_collector (per-block KV cache residency metrics) is not supported by hybridcache yet"
        )


class KVCacheManager(_native.NativeManager):
    """Drop-in for `vllm.v1.core.kv_cache_manager.KVCacheManager` (vLLM 0.23.0)."""

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
        _check_supported(dcp_world_size, pcp_world_size, metrics_collector)
        max_model_len = _positive_int("max_model_len", max_model_len)
        if max_num_batched_tokens is None:
            # As vLLM: no admission cap beyond max_model_len.
            max_num_batched_tokens = max_model_len
        elif not isinstance(max_num_batched_tokens, int):
            raise TypeError(f"max_num_batched_tokens must be an int, got {type(max_num_batched_tokens).__name__}")
        elif max_num_batched_tokens < 0:
            raise ValueError(f"max_num_batched_tokens must be >= 0, got {max_num_batched_tokens}")
        groups = read_groups(kv_cache_config, max_num_batched_tokens, max_model_len)
        check_retention_interval(groups)
        self = super().__new__(
            cls,
            read_num_blocks(kv_cache_config),
            [g.native for g in groups],
            max_model_len,
            _positive_int("scheduler_block_size", scheduler_block_size),
            _positive_int("hash_block_size", hash_block_size),
            bool(enable_caching),
            bool(use_eagle),
            bool(enable_kv_cache_events),
            PROFILE,
        )
        self._init_python_side(
            kv_cache_config, groups, max_model_len, enable_caching, use_eagle, log_stats, enable_kv_cache_events
        )
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Everything is set up in `__new__` (the native base needs its
        arguments there); this only accepts the same arguments."""

    def _init_python_side(
        self,
        kv_cache_config: Any,
        groups: list[Any],
        max_model_len: int,
        enable_caching: bool,
        use_eagle: bool,
        log_stats: bool,
        enable_kv_cache_events: bool,
    ) -> None:
        self.max_model_len = max_model_len
        self.enable_caching = bool(enable_caching)
        self.use_eagle = bool(use_eagle)
        self.log_stats = bool(log_stats)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.metrics_collector = None
        self.kv_cache_config = kv_cache_config
        self.num_kv_cache_groups = len(groups)
        self._events: list[Any] = []
        builder = EventBuilder([(g.event_kind, g.sliding_window) for g in groups]) if enable_kv_cache_events else None
        self._event_builder = builder
        self._stats_cls = prefix_cache_stats_class() if self.log_stats else None
        # Not bound to this manager: the native side holds it, and a
        # reference back would be a cycle the garbage collector cannot see.
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in groups))
        self._bind_python(self.empty_kv_cache_blocks, self._on_events if builder else None, self.log_stats)
        # The scheduler's hottest call, bound to this manager: it skips PyO3's
        # keyword matching (same arguments, same result as the class method).
        self.allocate_slots = self._bound_allocate_slots()
        self.block_pool = BlockPoolView(self)
        self.coordinator = CoordinatorView(self)

    @property
    def _native(self) -> KVCacheManager:
        """The native side (this object itself); kept for the views."""
        return self

    def _on_events(self, raw: list[tuple], request: Any) -> None:
        self._events.extend(self._event_builder.build(raw, request))

    def create_kv_cache_blocks(self, blocks: tuple[Any, ...]) -> KVCacheBlocks:
        ids = tuple(g if isinstance(g, list) else [getattr(b, "block_id", b) for b in g] for g in blocks)
        if not any(ids):
            return self.empty_kv_cache_blocks
        return KVCacheBlocks(ids, self)

    # -- vLLM API beyond the native hot path ------------------------------

    def make_prefix_cache_stats(self) -> Any:
        """The prefix-cache stats since the last call (vLLM's class when
        importable), or None when `log_stats` is off."""
        return self._stats(take=True)

    @property
    def prefix_cache_stats(self) -> Any:
        """The stats gathered so far (a snapshot), or None without `log_stats`."""
        return self._stats(take=False)

    def _stats(self, take: bool) -> Any:
        if not self.log_stats:
            return None
        reset, requests, queries, hits, p_requests, p_queries, p_hits = self._take_stats(take)
        stats = self._stats_cls()
        stats.reset = reset
        stats.requests, stats.queries, stats.hits = requests, queries, hits
        stats.preempted_requests, stats.preempted_queries, stats.preempted_hits = p_requests, p_queries, p_hits
        return stats

    def take_events(self) -> list[Any]:
        events, self._events = self._events, []
        return events

