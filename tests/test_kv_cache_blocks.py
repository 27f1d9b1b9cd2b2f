"""`KVCacheBlocks` built as vLLM's dataclass is (`KVCacheBlocks(blocks=...)`:
blocks per group, objects with `block_id` or ids), as a scheduler test or a
connector may build it, beside the positional block ids."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hybridcache.blocks import KVCacheBlocks


def test_built_by_keyword_from_blocks_or_ids() -> None:
    blocks = KVCacheBlocks(blocks=([SimpleNamespace(block_id=3), SimpleNamespace(block_id=5)], [7]))
    assert blocks.get_block_ids() == ([3, 5], [7])
    assert KVCacheBlocks(blocks=((), ())).get_block_ids() == ([], [])
    assert KVCacheBlocks(([1], [2])).get_block_ids() == KVCacheBlocks(block_ids=([1], [2])).get_block_ids()


def test_takes_one_spelling() -> None:
    with pytest.raises(TypeError, match="either block_ids or blocks"):
        KVCacheBlocks(([1],), blocks=([1],))
    with pytest.raises(TypeError, match="either block_ids or blocks"):
        KVCacheBlocks()
    with pytest.raises(AttributeError):
        KVCacheBlocks(blocks=([object()],))
