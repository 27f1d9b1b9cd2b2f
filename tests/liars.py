"""Managers that lie on purpose, to prove the differential drivers notice."""

from __future__ import annotations


class FakeBlocks:
    """A KVCacheBlocks stand-in carrying doctored block ids."""

    def __init__(self, block_ids):
        self._block_ids = block_ids

    def get_block_ids(self):
        return self._block_ids

    def get_unhashed_block_ids_all_groups(self):
        return [list(g) for g in self._block_ids]


class LiesOnce:
    """Delegates to a real manager; the n-th non-trivial answer of `method`
    is corrupted (`corrupt` returns None for answers it leaves alone)."""

    def __init__(self, inner, method: str, corrupt, nth: int = 5):
        self._inner, self._method, self._corrupt, self._left = inner, method, corrupt, nth

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if name != self._method:
            return value

        def wrapped(*args, **kwargs):
            result = value(*args, **kwargs)
            corrupted = self._corrupt(result)
            if corrupted is not None:
                self._left -= 1
                if self._left == 0:
                    return corrupted
            return result

        return wrapped
