"""`KVCacheBlocks`, the allocation result handed to the scheduler, and the
lazily built block views behind its `blocks` attribute."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def make_block_hash_with_group_id(block_hash: bytes, group_id: int) -> bytes:
    """vLLM's `BlockHashWithGroupId`: hash bytes + 4-byte big-endian group."""
    return block_hash + group_id.to_bytes(4, "big", signed=False)


class BlockView:
    """A read-only, live view of one block (vLLM's `KVCacheBlock` fields)."""

    __slots__ = ("_native", "block_id")

    def __init__(self, native: Any, block_id: int) -> None:
        self._native = native
        self.block_id = block_id

    @property
    def ref_cnt(self) -> int:
        return self._native.ref_cnt(self.block_id)

    @property
    def block_hash(self) -> bytes | None:
        h = self._native.block_hash(self.block_id)
        return None if h is None else make_block_hash_with_group_id(h[0], h[1])

    @property
    def is_null(self) -> bool:
        return self.block_id == 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockView):
            return NotImplemented
        return self._native is other._native and self.block_id == other.block_id

    def __hash__(self) -> int:
        return hash(self.block_id)

    def __repr__(self) -> str:
        return f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


class KVCacheBlocks:
    """Block ids per KV-cache group; `blocks` builds block views on demand."""

    __slots__ = ("_ids", "_native")

    def __init__(self, block_ids: tuple[Sequence[int], ...], native: Any = None) -> None:
        self._ids = block_ids
        self._native = native

    @property
    def blocks(self) -> tuple[Sequence[BlockView], ...]:
        if self._native is None:
            raise ValueError("these KVCacheBlocks are not bound to a manager")
        native = self._native
        return tuple([BlockView(native, b) for b in group] for group in self._ids)

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        if not isinstance(other, KVCacheBlocks):
            return NotImplemented
        return KVCacheBlocks(
            tuple([*a, *b] for a, b in zip(self._ids, other._ids)), self._native or other._native
        )

    def get_block_ids(
        self, allow_none: bool = False, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None:
        groups = self._ids if group_ids is None else tuple(self._ids[g] for g in group_ids)
        if allow_none and all(len(g) == 0 for g in groups):
            return None
        return tuple(list(g) for g in groups)

    def get_unhashed_block_ids(self) -> list[int]:
        if len(self._ids) != 1:
            raise ValueError("get_unhashed_block_ids supports only one KV cache group")
        return self._unhashed(skip_null=False)[0]

    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        """Unhashed block ids per group, null (padding) blocks left out."""
        return self._unhashed(skip_null=True)

    def _unhashed(self, skip_null: bool) -> list[list[int]]:
        out = []
        for group in self._ids:
            ids = [b for b in group if not (skip_null and b == 0)]
            flags = self._native.unhashed(ids) if self._native is not None else [True] * len(ids)
            out.append([b for b, unhashed in zip(ids, flags) if unhashed])
        return out

    def new_empty(self) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(() for _ in self._ids), self._native)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KVCacheBlocks):
            return NotImplemented
        return self.get_block_ids() == other.get_block_ids()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"KVCacheBlocks({self.get_block_ids()!r})"
