"""What the differential checks compare, and how: every output of every
manager call normalized to implementation-neutral values (block ids, hits,
events, stats, usage, pool state), and `Fanout`, which applies one operation to
several managers and raises `ReplayDivergence` on the first difference."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any


class ReplayDivergence(AssertionError):
    """Two managers answered the same operation differently."""

    def __init__(self, seed: int, step: int, op: str, values: Sequence[tuple[str, Any]]):
        self.seed, self.step, self.op, self.values = seed, step, op, list(values)
        shown = "\n".join(f"  {name}: {value!r}" for name, value in self.values)
        ref = self.values[0][1]
        odd = next((v for _, v in self.values[1:] if v != ref), ref)
        where = _first_difference(ref, odd)
        super().__init__(f"divergence at seed={seed} step={step} op={op}{where}\n{shown}")


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    """Locates the first differing element of two nested tuples, for big values."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
        if len(a) != len(b):
            return f" (lengths differ at {path or 'top'}: {len(a)} != {len(b)})"
    if not path:
        return ""
    return f" (first difference at {path}: {a!r} != {b!r})"


# --------------------------------------------------------------------------
# Output normalization: implementation-neutral, comparable values.
# --------------------------------------------------------------------------

_STATS_FIELDS = ("reset", "requests", "queries", "hits", "preempted_requests", "preempted_queries", "preempted_hits")


def freeze(value: Any) -> Any:
    """Lists and tuples compare alike (msgspec encodes both as arrays)."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def norm_blocks(blocks: Any) -> tuple[tuple[int, ...], ...] | None:
    if blocks is None:
        return None
    return tuple(tuple(group) for group in blocks.get_block_ids())


def norm_allocated(blocks: Any) -> Any:
    """Block ids, plus which of them are still unhashed (not yet cached)."""
    if blocks is None:
        return None
    return norm_blocks(blocks), freeze(blocks.get_unhashed_block_ids_all_groups())


def norm_computed(result: tuple[Any, int]) -> tuple[Any, int]:
    blocks, num_hit_tokens = result
    return norm_blocks(blocks), num_hit_tokens


def _event_field_names(event: Any) -> Sequence[str]:
    names = getattr(type(event), "__struct_fields__", None)  # msgspec.Struct
    if names is not None:
        return names
    return [f.name for f in dataclasses.fields(event)]  # hybridcache's own events


def norm_event(event: Any) -> tuple[str, tuple[tuple[str, Any], ...]]:
    names = _event_field_names(event)
    return type(event).__name__, tuple((n, freeze(getattr(event, n))) for n in names)


def norm_stats(stats: Any) -> tuple[tuple[str, Any], ...] | None:
    if stats is None:
        return None
    return tuple((name, getattr(stats, name)) for name in _STATS_FIELDS)


def pool_state(manager: Any) -> tuple[Any, ...]:
    """(ref_cnt, block_hash) of every block and the free queue's order."""
    pool = manager.block_pool
    blocks = tuple((b.ref_cnt, b.block_hash) for b in pool.blocks)
    free_order = tuple(b.block_id for b in pool.free_block_queue.get_all_free_blocks())
    return blocks, free_order


def norm_usage(usage: float) -> float:
    # Tolerate float formulas that are equal in exact arithmetic.
    return round(float(usage), 9)


def norm_drained(value: Any) -> tuple[Any, ...]:
    """A per-step drain's result (the scheduler's calls after scheduling): new block ids;
    (copy-on-write copies, their retained blocks); boundary-state offloads."""
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, tuple) and len(value) == 2:
        copies, kept = value
        return (tuple((c.src_block_id, c.dst_block_id) for c in copies), tuple(b.block_id for b in kept))
    return tuple(value)


def same(value: Any) -> Any:
    return value


# --------------------------------------------------------------------------
# Fan-out: one operation, every manager, compared.
# --------------------------------------------------------------------------


class Fanout:
    """Applies an operation to every manager and checks they agree.

    Manager 0 is the reference: if it raises, the trace itself is illegal and
    the exception propagates unchanged (a generator bug, not a divergence).
    """

    def __init__(self, managers: Sequence[Any], names: Sequence[str], seed: int):
        self.managers, self.names, self.seed = list(managers), list(names), seed
        self.step = self.ops = 0

    def call(self, op: str, fn: Callable[[Any, int], Any], norm: Callable[[Any], Any] = same) -> list[Any]:
        self.ops += 1
        results: list[Any] = []
        normalized: list[Any] = []
        for i, mgr in enumerate(self.managers):
            try:
                result = fn(mgr, i)
                value = norm(result)
            except Exception as exc:
                if i == 0:
                    # An illegal trace (a generator bug): say where it went wrong.
                    note = f"reference {self.names[0]} raised at seed={self.seed} step={self.step} op={op}"
                    if hasattr(exc, "add_note"):  # Python 3.11+
                        exc.add_note(note)
                    raise
                result, value = exc, ("raised", type(exc).__name__, str(exc))
            results.append(result)
            normalized.append(value)
        if any(v != normalized[0] for v in normalized[1:]):
            raise ReplayDivergence(self.seed, self.step, op, list(zip(self.names, normalized)))
        return results


def same_ids(a: Any, b: Any) -> bool:
    """Block-id tables equal up to list/tuple spelling."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_ids(x, y) for x, y in zip(a, b))
    return a == b
