"""`KVCacheManager034`: vLLM 0.34.0's `KVCacheManager` API. Its rules are
0.33.0's (the core's partial-block-hits profile); what 0.34.0 changed is
its row's flags, read by `partial_hits_manager.PartialHitsManager` (the
`prefix_cache_hit_limit` read gate and hit bound, zeroing from the
config's `needs_kv_cache_zeroing` field, `block_pool.free_blocks(...,
evict_first=)`), and the one method it added, `get_num_cached_tokens`.
`get_num_common_prefix_blocks` is gone."""

from __future__ import annotations

from hybridcache import _native
from hybridcache.blocks import KVCacheBlocks
from hybridcache.partial_hits_manager import PartialHitsManager
from hybridcache.releases import of_folder

RELEASE = of_folder("v0_34")


class KVCacheManager034(PartialHitsManager):
    """Drop-in for `vllm.v1.core.kv_cache_manager.KVCacheManager` of vLLM
    0.34.0 (see `PartialHitsManager` for the layouts covered)."""

    _release = RELEASE

    # How many of a request's tokens the prefix cache holds (cache-aware
    # admission's probe): the hit search bounded by `num_tokens - 1`, with
    # no reference, touch, event or stat; 0 where the lookup is off for
    # the request. The native method itself, no Python frame.
    get_num_cached_tokens = _native.NativeManager._num_cached_tokens


__all__ = ["KVCacheManager034", "RELEASE", "KVCacheBlocks"]
