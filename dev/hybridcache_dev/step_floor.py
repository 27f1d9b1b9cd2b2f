"""The drop-in floor of the step bench: a KV-cache manager that does no work.

`RecordingManager` wraps vLLM's own manager in an untimed stock run and writes
down, per method, every answer the scheduler got. `FloorManager` then answers
the same calls of an identical run from that recording, each in O(1): no block
accounting, no hashing, no allocation. Whatever a step costs with the floor
manager is vLLM's scheduler itself, so no drop-in manager can make the step
cheaper than that (except by taking work off the scheduler, such as hashing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Scheduler-facing methods that answer something; the rest return None.
# Both releases' (a method a release lacks is never called there).
ANSWERING = ("allocate_slots", "get_computed_blocks", "get_blocks", "get_block_ids",
             "get_num_common_prefix_blocks", "take_events", "make_prefix_cache_stats",
             "take_new_block_ids", "evict_blocks", "reset_prefix_cache", "usage",
             # with partial-block hits
             "get_computed_blocks_for_connector", "truncate_computed_blocks", "pop_blocks_for_free",
             "take_kv_cache_block_copies", "take_boundary_state_offloads", "estimate_cached_tokens",
             "get_block_ids_for_computed_tokens", "finalize_partial_tail_offloads",
             # vLLM 0.34.0
             "get_num_cached_tokens")
SILENT = ("free", "cache_blocks", "new_step_starts", "remove_skipped_blocks",
          "record_prefix_cache_stats", "record_blocks_for_zeroing")


class FloorBlocks:
    """A recorded `KVCacheBlocks`: its two `get_block_ids` answers, frozen at the
    time the stock manager handed it out."""

    __slots__ = ("blocks", "_ids", "_ids_or_none")

    def __init__(self, blocks: Any) -> None:
        self.blocks = blocks.blocks
        self._ids = blocks.get_block_ids()
        self._ids_or_none = blocks.get_block_ids(allow_none=True)

    def get_block_ids(self, allow_none: bool = False) -> Any:
        return self._ids_or_none if allow_none else self._ids


def _freeze(value: Any) -> Any:
    if hasattr(value, "get_block_ids") and hasattr(value, "blocks"):
        return FloorBlocks(value)
    if isinstance(value, tuple) and value and hasattr(value[0], "get_block_ids"):
        return (FloorBlocks(value[0]),) + value[1:]
    return value


class RecordingManager:
    """Forwards every call to vLLM's manager and records the answers per method."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.answers: dict[str, list[Any]] = {name: [] for name in ANSWERING}

    @property
    def usage(self) -> Any:
        value = self._inner.usage
        self.answers["usage"].append(value)
        return value

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in ANSWERING or not callable(attr):
            return attr
        log = self.answers[name]

        def call(*args: Any, **kwargs: Any) -> Any:
            value = attr(*args, **kwargs)
            log.append(_freeze(value))
            return value

        return call


class FloorManager:
    """Answers each scheduler call with the next recorded answer of that method.

    The methods are the class's (made below), not the instance's, and the
    instance holds a few attributes: CPython specializes the scheduler's
    method lookups on it, as on vLLM's own manager, so dispatch costs the
    floor no more than it costs any well-built drop-in."""

    def __init__(self, recording: RecordingManager) -> None:
        inner = recording._inner
        self.empty_kv_cache_blocks = FloorBlocks(inner.empty_kv_cache_blocks)
        self.kv_cache_config = inner.kv_cache_config
        self.num_kv_cache_groups = inner.num_kv_cache_groups
        # Read once at construction (with a connector); deferred
        # frees return blocks through it, which costs the floor nothing.
        self.block_pool = _FloorPool(inner.block_pool)
        self.coordinator = inner.coordinator
        self.mamba_shared_prefix_checkpoint = getattr(inner, "mamba_shared_prefix_checkpoint", False)
        # Per method of ANSWERING, in its order: the next recorded answer.
        self._next = [iter(recording.answers[name]).__next__ for name in ANSWERING]

    @property
    def usage(self) -> Any:
        return self._next[_USAGE]()


_USAGE = ANSWERING.index("usage")


def _answering(i: int, name: str) -> Callable[..., Any]:
    def method(self: FloorManager, *args: Any, **kwargs: Any) -> Any:
        return self._next[i]()

    method.__name__ = method.__qualname__ = name
    return method


def _none(*args: Any, **kwargs: Any) -> None:
    return None


for _i, _name in enumerate(ANSWERING):
    if _name != "usage":
        setattr(FloorManager, _name, _answering(_i, _name))
for _name in SILENT:
    setattr(FloorManager, _name, _none)


class _FloorPool:
    """The recorded manager's pool for reads; `free_blocks` does nothing."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self.free_blocks = _none

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)
