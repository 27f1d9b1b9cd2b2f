"""`KVCacheBlocks`, the allocation result handed to the scheduler, and the
block views behind its `blocks` attribute (one per block and manager,
`block_view`). Both are native classes (see
rust/python/src/blocks.rs): results and their `get_block_ids()` stay off the
Python interpreter's hot path."""

from __future__ import annotations

from hybridcache._native import BlockView, KVCacheBlocks, block_view


def make_block_hash_with_group_id(block_hash: bytes, group_id: int) -> bytes:
    """vLLM's `BlockHashWithGroupId`: hash bytes + 4-byte big-endian group."""
    return block_hash + group_id.to_bytes(4, "big", signed=False)


__all__ = ["BlockView", "KVCacheBlocks", "block_view", "make_block_hash_with_group_id"]
