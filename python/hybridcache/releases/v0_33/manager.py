"""`KVCacheManager033`: vLLM 0.33.0's `KVCacheManager` API
(`partial_hits_manager.PartialHitsManager` with 0.33.0's row), plus what
0.33.0 alone has: `get_num_common_prefix_blocks`, which always answers
zeros (cascade attention is gone)."""

from __future__ import annotations

from hybridcache.blocks import KVCacheBlocks
from hybridcache.partial_hits_manager import PartialHitsManager
from hybridcache.releases import of_folder

RELEASE = of_folder("v0_33")


class KVCacheManager033(PartialHitsManager):
    """Drop-in for `vllm.v1.core.kv_cache_manager.KVCacheManager` of vLLM
    0.33.0 (see `PartialHitsManager` for the layouts covered)."""

    _release = RELEASE

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Cascade attention is gone in 0.33.0: zeros, one per group."""
        return [0] * self.num_kv_cache_groups


__all__ = ["KVCacheManager033", "RELEASE", "KVCacheBlocks"]
