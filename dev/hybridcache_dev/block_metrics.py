"""vLLM's `KVCacheMetricsCollector`, recording every call it gets:
what the differential tools give each manager to compare what the managers
tell their collectors (the calls in order, the blocks sampled, the eviction
events). Both collectors sample with the global `random`: a tool runs
each manager's call from the same `random` state.

Nothing here imports vLLM at module import time."""

from __future__ import annotations

from typing import Any

Calls = tuple[tuple[str, "int | None"], ...]


def record_calls(collector: Any) -> Any:
    """Wraps `collector`'s methods on the instance (where a block pool looks
    them up) to note each call as (method, block_id) in `collector.calls`;
    returns the collector."""
    collector.calls = []
    for name in ("on_block_allocated", "on_block_accessed", "on_block_evicted"):
        def wrapped(block: Any, name: str = name, inner: Any = getattr(collector, name)) -> None:
            collector.calls.append((name, block.block_id))
            inner(block)

        setattr(collector, name, wrapped)
    inner_reset = collector.reset

    def reset() -> None:
        collector.calls.append(("reset", None))
        inner_reset()

    collector.reset = reset
    return collector


def recording_collector(sample_rate: float) -> Any:
    """A fresh vLLM `KVCacheMetricsCollector(sample_rate)`, recording (needs vLLM)."""
    from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector

    return record_calls(KVCacheMetricsCollector(sample_rate))


def observe(collector: Any, drain: bool = True) -> tuple[Calls, tuple[int, ...], int]:
    """(the calls since the last observation, the sampled block ids, how many
    eviction events `drain_events` hands out, or 0 when not `drain`: a
    scheduler drains them itself), then the calls are cleared."""
    calls, collector.calls = collector.calls, []
    evictions = len(collector.drain_events()) if drain else 0
    return tuple(calls), tuple(sorted(collector.block_metrics)), evictions
