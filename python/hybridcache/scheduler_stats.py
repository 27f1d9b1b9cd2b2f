"""Prefix-cache stats recorded by the scheduler, for a release whose
scheduler counts each admission's lookup itself (`record_prefix_cache_stats`)
and keeps the live stats object: the facade holds that object; lookups
count nothing in the core."""

from __future__ import annotations

from typing import Any


# Whether a request skips the prefix-cache lookup, by the attribute's value
# (the row's `read_gate`; the native lookup reads the same).
_SKIPS = {
    "skip_reading_prefix_cache": bool,
    "prefix_cache_hit_limit": lambda limit: limit == 0,
}


class SchedulerRecordedStats:
    """Mixin for a release's facade (over `KVCacheManagerBase`, whose
    `_stats_cls` is the stats class); `_live_stats` holds the live object
    (None without `log_stats`)."""

    __slots__ = ()

    _live_stats: Any

    def prefix_cache_lookup_enabled(self, request: Any) -> bool:
        """Whether a local prefix-cache lookup may run for `request`: with
        caching on, unless the request attribute the release's row names
        (`read_gate`) skips it."""
        manager: Any = self
        gate = manager._release.read_gate
        return manager.enable_caching and not _SKIPS[gate](getattr(request, gate))

    def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
        """Counts one admission's lookup (the scheduler's call), unless
        stats are off or the request skipped the cache."""
        manager: Any = self
        if not manager.log_stats or not self.prefix_cache_lookup_enabled(request):
            return
        self._live_stats.record(num_tokens=request.num_tokens, num_hits=num_hits,
                                preempted=request.num_preemptions > 0)

    # The stats object is live (callers keep it and read it later).
    @property
    def prefix_cache_stats(self) -> Any:
        """The stats gathered since the last `make_prefix_cache_stats`
        (the object itself), or None without `log_stats`."""
        return self._live_stats

    def make_prefix_cache_stats(self) -> Any:
        """The stats since the last call, replaced by a fresh object;
        None without `log_stats`."""
        manager: Any = self
        if not manager.log_stats:
            return None
        stats, self._live_stats = self._live_stats, manager._stats_cls()
        return stats

    def reset_prefix_cache(self) -> bool:
        """Drops every cached hash if no block is in use; False otherwise
        (a reset is recorded in the live stats)."""
        ok = bool(super().reset_prefix_cache())  # type: ignore[misc]
        if ok and self._live_stats is not None:
            self._live_stats.reset = True
        return ok


__all__ = ["SchedulerRecordedStats"]
