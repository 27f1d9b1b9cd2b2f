"""hybridcache: a drop-in, Rust-backed replacement for vLLM 0.23.0's v1
`KVCacheManager`. Importing it loads neither torch nor vLLM."""

from hybridcache._native import __version__
from hybridcache.blocks import BlockView, KVCacheBlocks
from hybridcache.config import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from hybridcache.manager import KVCacheManager
from hybridcache.request import LoRARequest, Request

SUPPORTED_VLLM_VERSION = "0.23.0"

__all__ = [
    "SUPPORTED_VLLM_VERSION",
    "BlockView",
    "ChunkedLocalAttentionSpec",
    "CrossAttentionSpec",
    "FullAttentionSpec",
    "KVCacheBlocks",
    "KVCacheConfig",
    "KVCacheGroupSpec",
    "KVCacheManager",
    "LoRARequest",
    "MambaSpec",
    "Request",
    "SlidingWindowSpec",
    "__version__",
]
