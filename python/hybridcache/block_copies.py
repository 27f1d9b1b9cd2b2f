"""Copy-on-write drains, for a release with partial hash hits: a hit that
ends inside a block gets its tail block copied to a private block; the
scheduler drains the queued copies every step (`take_kv_cache_block_copies`)
and frees both ends of each after the step."""

from __future__ import annotations

from typing import Any, NamedTuple

from hybridcache.blocks import BlockView, block_view
from hybridcache.loaded_vllm import loaded_vllm


class KVCacheBlockCopy(NamedTuple):
    """One copy-on-write copy (vLLM's `KVCacheBlockCopy`, same fields)."""

    src_block_id: int
    dst_block_id: int


def kv_cache_block_copy_class(profile: str) -> Any:
    """vLLM's `KVCacheBlockCopy` when a release running `profile` has loaded
    it, else this module's NamedTuple of the same fields."""
    return loaded_vllm(profile, "vllm.v1.core.kv_cache_utils", "KVCacheBlockCopy") or KVCacheBlockCopy


class BlockCopies:
    """Mixin for a release's facade (over `KVCacheManagerBase`)."""

    __slots__ = ()

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[BlockView]]:
        """Copy-on-write copies of partial hash hits queued since the last
        call, drained: `(copies, retained)`, the copies as vLLM's
        `KVCacheBlockCopy(src_block_id, dst_block_id)` and both ends of each
        (source, copy, in pair order), which hold an extra reference until
        the caller hands them to `block_pool.free_blocks` after the step."""
        native: Any = self
        pairs = native._take_kv_cache_block_copies()
        if not pairs:
            # Most steps (the scheduler asks every step).
            return [], []
        copy_cls = kv_cache_block_copy_class(native._profile)
        copies = [copy_cls(src_block_id=src, dst_block_id=dst) for src, dst in pairs]
        retained = [block_view(native, b) for pair in pairs for b in pair]
        return copies, retained


__all__ = ["BlockCopies", "KVCacheBlockCopy", "kv_cache_block_copy_class"]
