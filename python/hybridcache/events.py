"""KV-cache events and prefix-cache stats in vLLM's own classes when vLLM is
importable (so publishers, routers and metrics keep working), else in
look-alike classes with the same fields in the same order."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from hybridcache.hashing import generate_block_hash_extra_keys

MEDIUM_GPU = "GPU"


@dataclass
class BlockStored:
    """KV event: blocks entered the prefix cache (vLLM's `BlockStored`, same
    fields in the same order). `block_hashes` and `parent_block_hash` are
    the low 64 bits as ints unless VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0
    (then bytes); `token_ids` are the blocks' tokens; `medium` is "GPU"."""

    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


@dataclass
class BlockRemoved:
    """KV event: a cached block was evicted (reused or `evict_blocks`) from
    group `group_idx` (vLLM's `BlockRemoved`)."""

    block_hashes: list[Any]
    medium: str | None
    group_idx: int | None = None


@dataclass
class AllBlocksCleared:
    """KV event: `reset_prefix_cache()` emptied the prefix cache (vLLM's
    `AllBlocksCleared`)."""


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookup counts (vLLM's `PrefixCacheStats`): `requests`
    looked up, `queries` (tokens looked up), `hits` (tokens found), the same
    for requests resumed after preemption (`preempted_*`), and `reset`
    (the cache was reset since the last report)."""

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """Counts one lookup of `num_tokens` tokens that found `num_hits`."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


def _vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def event_classes() -> tuple[type, type, type]:
    """(BlockStored, BlockRemoved, AllBlocksCleared), vLLM's when importable."""
    if _vllm_available():
        from vllm.distributed import kv_events as ev

        return ev.BlockStored, ev.BlockRemoved, ev.AllBlocksCleared
    return BlockStored, BlockRemoved, AllBlocksCleared


def prefix_cache_stats_class() -> type:
    """vLLM's `PrefixCacheStats` class when vLLM is importable, else ours."""
    if _vllm_available():
        from vllm.v1.metrics.stats import PrefixCacheStats as VllmStats

        return VllmStats
    return PrefixCacheStats


def external_hash(h: bytes) -> bytes | int:
    """vLLM's `maybe_convert_block_hash`: the low 64 bits as an int unless
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0."""
    if not int(os.getenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")):
        return h
    return int.from_bytes(h, "big") & ((1 << 64) - 1)


class EventBuilder:
    """Turns the core's event tuples into event objects, reading from the
    request of the call that produced them what only it knows."""

    def __init__(self, group_kinds: list[tuple[str, int | None]]) -> None:
        """`group_kinds`: (spec kind, sliding window or None) per group, as
        reported in `BlockStored` events."""
        self._stored, self._removed, self._cleared = event_classes()
        self._group_kinds = group_kinds

    def build(self, raw: list[tuple], request: Any) -> list[Any]:
        """Event objects for the core's raw event tuples of one call on
        `request` (its tokens, LoRA and extra keys fill `BlockStored`)."""
        out = []
        for ev in raw:
            tag = ev[0]
            if tag == "stored":
                out.append(self._build_stored(ev, request))
            elif tag == "removed":
                out.append(self._removed(block_hashes=[external_hash(ev[1])], medium=MEDIUM_GPU, group_idx=ev[2]))
            else:
                out.append(self._cleared())
        return out

    def _build_stored(self, ev: tuple, request: Any) -> Any:
        _, hashes, parent, start, end, block_size, group, positions = ev
        extra: list[Any] = []
        mm_idx = 0
        for pos in positions:
            keys, mm_idx = generate_block_hash_extra_keys(request, pos * block_size, (pos + 1) * block_size, mm_idx)
            extra.append(keys)
        lora = getattr(request, "lora_request", None)
        kind, window = self._group_kinds[group]
        return self._stored(
            block_hashes=[external_hash(h) for h in hashes],
            parent_block_hash=None if parent is None else external_hash(parent),
            token_ids=list(request.all_token_ids[start:end]),
            block_size=block_size,
            lora_id=lora.adapter_id if lora else None,
            medium=MEDIUM_GPU,
            lora_name=lora.name if lora else None,
            extra_keys=extra if extra else None,
            group_idx=group,
            kv_cache_spec_kind=kind,
            kv_cache_spec_sliding_window=window,
        )
