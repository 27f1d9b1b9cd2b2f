"""A read of the caller's object raises (ValueError, MemoryError, even
KeyboardInterrupt), on its first read only or on every read: the call
raises that very exception, and the manager's state is exactly as before
the call (read, then decide, then change; no fallback that swallows it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hostile_objects import Hooked, Raiser
from hostile_world import BS, FLAVOURS, World, in_child

EXCEPTIONS = {"ValueError": ValueError, "MemoryError": MemoryError, "KeyboardInterrupt": KeyboardInterrupt}


def _call(w: World, where: str) -> tuple[Any, str, Callable[[], Any]]:
    """(request, attribute, call) of `where`: the call reads the attribute."""
    m, a = w.m, w.a
    if where in ("decode_noop", "decode_new_block"):
        n = w.decode_ready(a, 1 if where == "decode_noop" else 3)
        return a, "num_computed_tokens", lambda: m.allocate_slots(a, n)
    if where == "decode_hashes":
        n = w.decode_ready(a, 3)
        return a, "block_hashes", lambda: m.allocate_slots(a, n)
    if where == "decode_batch":
        n = w.decode_ready(a, 3)
        return a, "num_computed_tokens", lambda: m.allocate_decode_batch([w.b, a], [1, n])
    if where in ("arrays_tokens", "arrays_salt"):
        # The array step fills a block of `a`: its event reads the request.
        n = w.decode_ready(a, 3)
        args = ([m.request_handle("a")], [n], [a.num_computed_tokens], [a.num_tokens], 0, [a])
        attr = "all_token_ids" if where == "arrays_tokens" else "cache_salt"
        return a, attr, lambda: m.allocate_decode_arrays(*args)
    if where in ("admit_tokens", "admit_salt", "admit_id"):
        r = w.Request("w2", [*range(8), 50, 51, 52, 53], BS)
        blocks, hit = w.lookup(r)
        assert hit == 8
        attr = {"admit_tokens": "_all_token_ids", "admit_salt": "cache_salt", "admit_id": "request_id"}[where]
        return r, attr, lambda: w.m.allocate_slots(r, r.num_tokens - hit, hit, blocks)
    if where == "lookup":
        r = w.Request("w2", [*range(8), 50, 51, 52, 53], BS)
        return r, "block_hashes", lambda: m.get_computed_blocks(r)
    if where == "cache_delayed":
        r = w.Request("w2", [*range(8), 50, 51, 52, 53], BS)
        blocks, hit = w.lookup(r)
        assert m.allocate_slots(r, r.num_tokens - hit, hit, blocks, delay_cache_blocks=True) is not None
        r.num_computed_tokens = r.num_tokens
        m.take_events()
        return r, "request_id", lambda: m.cache_blocks(r, r.num_tokens)
    if where == "free":
        return a, "request_id", lambda: m.free(a)
    raise AssertionError(where)


WHERE = ["decode_noop", "decode_new_block", "decode_hashes", "decode_batch", "arrays_tokens", "arrays_salt",
         "admit_tokens", "admit_salt", "admit_id", "lookup", "cache_delayed", "free"]


def case_raising_read(flavour: str, where: str, exc_name: str, times: int) -> None:
    w = World(flavour, request_class=Hooked)
    request, attr, call = _call(w, where)
    raiser = Raiser(EXCEPTIONS[exc_name])
    before = w.snap()
    request.hook(attr, raiser, times)
    try:
        result = call()
    except BaseException as e:
        request.disarm()
        assert raiser.raised, f"the call raised {type(e).__name__}: {e} before reading {attr}"
        assert e is raiser.raised[0], f"{type(e).__name__}: {e} raised in place of the caller's {exc_name}"
    else:
        request.disarm()
        assert not raiser.raised, (f"the caller's {exc_name} from {attr} was swallowed: the call returned "
                                   f"{result!r}")
        pytest.fail(f"{attr} was never read: the case tests nothing")
    after = w.snap()
    w.m.check_invariants()
    assert before == after, f"the state changed behind the exception: {_diff(before, after)}"


def _diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    return "; ".join(f"{k}: {a[k]!r} -> {b[k]!r}" for k in a if a[k] != b[k])


@pytest.mark.parametrize("times", [1, -1], ids=["first-read", "every-read"])
@pytest.mark.parametrize("exc_name", sorted(EXCEPTIONS))
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_raising_read_propagates_and_changes_nothing(flavour: str, where: str, exc_name: str, times: int) -> None:
    in_child(case_raising_read, flavour, where, exc_name, times)
