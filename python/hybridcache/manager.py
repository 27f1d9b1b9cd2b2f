"""`hybridcache.KVCacheManager`: vLLM 0.23.0's `KVCacheManager` API over the
native core. This layer reads request objects, sends each block hash to the
core once, and shapes results; it makes no allocation decision itself."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hybridcache import _native
from hybridcache.arguments import explain_conversion_error
from hybridcache.block_pool import BlockPoolView
from hybridcache.blocks import KVCacheBlocks
from hybridcache.config import check_retention_interval, read_groups, read_num_blocks
from hybridcache.events import EventBuilder, prefix_cache_stats_class


def _positive_int(name: str, v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    return v


class KVCacheManager:
    """Drop-in for `vllm.v1.core.kv_cache_manager.KVCacheManager` (vLLM 0.23.0)."""

    def __init__(
        self,
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
    ) -> None:
        if dcp_world_size != 1 or pcp_world_size != 1:
            raise NotImplementedError(
                f"decode/prefill context parallelism (dcp_world_size={dcp_world_size}, "
                f"pcp_world_size={pcp_world_size}) is not supported by hybridcache yet"
            )
        if metrics_collector is not None:
            raise NotImplementedError(
                "metrics_collector (per-block KV cache residency metrics) is not supported by hybridcache yet"
            )
        self.max_model_len = _positive_int("max_model_len", max_model_len)
        if max_num_batched_tokens is None:
            # As vLLM: no admission cap beyond max_model_len.
            max_num_batched_tokens = max_model_len
        groups = read_groups(kv_cache_config, max_num_batched_tokens, self.max_model_len)
        check_retention_interval(groups)
        self.enable_caching = bool(enable_caching)
        self.use_eagle = bool(use_eagle)
        self.log_stats = bool(log_stats)
        self.metrics_collector = None
        self.kv_cache_config = kv_cache_config
        self.num_kv_cache_groups = len(groups)
        self._native = _native.NativeManager(
            read_num_blocks(kv_cache_config),
            [g.native for g in groups],
            self.max_model_len,
            _positive_int("scheduler_block_size", scheduler_block_size),
            _positive_int("hash_block_size", hash_block_size),
            max_num_batched_tokens,
            self.enable_caching,
            self.use_eagle,
            bool(enable_kv_cache_events),
        )
        self._events_on = bool(enable_kv_cache_events)
        self._events: list[Any] = []
        self._event_builder = (
            EventBuilder([(g.event_kind, g.sliding_window) for g in groups]) if self._events_on else None
        )
        self._stats_cls = prefix_cache_stats_class() if self.log_stats else None
        self.prefix_cache_stats = self._stats_cls() if self._stats_cls else None
        # How many of each request's block hashes the core already holds.
        self._known_hashes: dict[str, int] = {}
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in groups), self._native)
        self.block_pool = BlockPoolView(self)

    # -- helpers -----------------------------------------------------------

    def _new_hashes(self, request: Any) -> tuple[int, list[bytes] | None]:
        """(offset, hashes the core lacks) for the request, or (n, None)."""
        hashes = request.block_hashes
        known = self._known_hashes.get(request.request_id, 0)
        n = len(hashes)
        if n == known:
            return known, None
        if n < known:  # the request restarted its hash list: resend all
            return 0, list(hashes)
        return known, hashes[known:]

    def _hashes_sent(self, request: Any, new: list[bytes] | None) -> None:
        if new is not None:
            self._known_hashes[request.request_id] = len(request.block_hashes)

    def _drain_events(self, request: Any) -> None:
        if self._events_on and self._native.has_events():
            self._events.extend(self._event_builder.build(self._native.take_events(), request))

    def _ids_of(self, blocks: KVCacheBlocks | None) -> list[list[int]] | None:
        """Block ids of `new_computed_blocks`; None for vLLM's None / shared empty."""
        if blocks is None or blocks is self.empty_kv_cache_blocks:
            return None
        if isinstance(blocks, KVCacheBlocks):
            if blocks._native is not None and blocks._native is not self._native:
                raise ValueError("new_computed_blocks come from another KVCacheManager")
            return [list(g) for g in blocks._ids]
        try:
            return [[b.block_id for b in g] for g in blocks.blocks]
        except AttributeError as e:
            raise TypeError(f"new_computed_blocks must be KVCacheBlocks, got {type(blocks).__name__}") from e

    def create_kv_cache_blocks(self, blocks: tuple[Iterable[Any], ...]) -> KVCacheBlocks:
        ids = tuple(g if isinstance(g, list) else [getattr(b, "block_id", b) for b in g] for g in blocks)
        if not any(ids):
            return self.empty_kv_cache_blocks
        return KVCacheBlocks(ids, self._native)

    # -- vLLM API ----------------------------------------------------------

    @property
    def usage(self) -> float:
        return self._native.usage

    def make_prefix_cache_stats(self) -> Any:
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = self._stats_cls()
        return stats

    def get_computed_blocks(self, request: Any) -> tuple[KVCacheBlocks, int]:
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0
        offset, new = self._new_hashes(request)
        try:
            ids, hits = self._native.get_computed_blocks(request.request_id, request.num_tokens, offset, new)
        except (OverflowError, TypeError) as e:
            raise explain_conversion_error(e, {"request.num_tokens": request.num_tokens}, request) from e
        self._hashes_sent(request, new)
        if self.log_stats:
            self.prefix_cache_stats.record(
                num_tokens=request.num_tokens, num_hits=hits, preempted=request.num_preemptions > 0
            )
        return self.create_kv_cache_blocks(ids), hits

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
    ) -> KVCacheBlocks | None:
        offset, new = self._new_hashes(request) if self.enable_caching else (0, None)
        try:
            ids = self._native.allocate_slots(
                request.request_id,
                num_new_tokens,
                request.num_computed_tokens,
                request.num_tokens,
                num_new_computed_tokens,
                self._ids_of(new_computed_blocks),
                num_lookahead_tokens,
                num_external_computed_tokens,
                delay_cache_blocks,
                num_encoder_tokens,
                full_sequence_must_fit,
                reserved_blocks,
                offset,
                new,
            )
        except (OverflowError, TypeError) as e:
            counts = {
                "num_new_tokens": num_new_tokens,
                "request.num_computed_tokens": request.num_computed_tokens,
                "request.num_tokens": request.num_tokens,
                "num_new_computed_tokens": num_new_computed_tokens,
                "num_lookahead_tokens": num_lookahead_tokens,
                "num_external_computed_tokens": num_external_computed_tokens,
                "num_encoder_tokens": num_encoder_tokens,
                "reserved_blocks": reserved_blocks,
            }
            raise explain_conversion_error(e, counts, request) from e
        self._hashes_sent(request, new)
        if self._events_on:
            self._drain_events(request)
        if ids is None:
            return None
        return self.create_kv_cache_blocks(ids)

    def free(self, request: Any) -> None:
        rid = request.request_id
        self._native.free(rid)
        self._known_hashes.pop(rid, None)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        self._native.remove_skipped_blocks(request_id, total_computed_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self._native.evict_blocks(list(block_ids))
        self._drain_events(None)

    def reset_prefix_cache(self) -> bool:
        if not self._native.reset_prefix_cache():
            return False
        self._drain_events(None)
        if self.log_stats:
            self.prefix_cache_stats.reset = True
        return True

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return self._native.get_num_common_prefix_blocks(running_request_id)

    def take_events(self) -> list[Any]:
        events, self._events = self._events, []
        return events

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return self.create_kv_cache_blocks(self._native.get_block_ids(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self._native.get_block_ids(request_id)

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        if not self.enable_caching:
            return
        offset, new = self._new_hashes(request)
        try:
            self._native.cache_blocks(request.request_id, num_computed_tokens, offset, new)
        except (OverflowError, TypeError) as e:
            raise explain_conversion_error(e, {"num_computed_tokens": num_computed_tokens}, request) from e
        self._hashes_sent(request, new)
        self._drain_events(request)

    def take_new_block_ids(self) -> list[int]:
        return self._native.take_new_block_ids()

    def new_step_starts(self) -> None:
        self._native.new_step_starts()

    def check_invariants(self) -> None:
        """Raises RuntimeError naming the first broken invariant of the core."""
        self._native.check_invariants()
