"""hybridcache: a drop-in, Rust-backed replacement for vLLM's v1
`KVCacheManager`, for each release in the table of `hybridcache.releases`
(`SUPPORTED_VLLM_VERSIONS`). Importing it loads neither torch nor vLLM.

Without vLLM, build a `KVCacheConfig` of `KVCacheGroupSpec`s (specs:
`FullAttentionSpec`, `SlidingWindowSpec`, `ChunkedLocalAttentionSpec`,
`MambaSpec`, `CrossAttentionSpec`), a `KVCacheManager` over it, and drive it
with `Request`s (`KVCacheManager` takes the oldest supported release's
arguments; each release's own facade is in its folder under
`hybridcache.releases`): `get_computed_blocks` and `allocate_slots` at admission,
`allocate_slots` every step, `free` at the end. docs/usage.md has a runnable
example and the caller's contract between steps. Under a supported vLLM:
`hybridcache.vllm.install()` or HYBRIDCACHE_ENABLE=1.

`SUPPORTED_VLLM_VERSIONS` are the vLLM releases whose manager this release
replaces; `__version__` is hybridcache's.
"""

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
from hybridcache.releases import SUPPORTED_VLLM_VERSIONS
from hybridcache.request import LoRARequest, Request

__all__ = [
    "SUPPORTED_VLLM_VERSIONS",
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
