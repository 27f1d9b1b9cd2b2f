"""Identity: a held request's `request_id` renamed, or swapped with
another held request's, and a second live request with a held id. Each is
refused with a clear ValueError naming the ids, and the manager's state is
exactly as before; the requests go on as before once their ids are put
back."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from hostile_objects import SlotRequest
from hostile_world import BS, FLAVOURS, World, in_child

# Request classes whose fields the hot calls read in different places:
# its `__dict__`, or its slots.
REQUEST_CLASSES: dict[str, Any] = {"dict": None, "slots": SlotRequest}


def _warm(w: World) -> None:
    """One decode of each running request: the hot calls know them by
    their request objects from then on."""
    for r in (w.a, w.b):
        n = w.decode_ready(r, 1)
        assert w.m.allocate_slots(r, n) is not None
        r.num_computed_tokens += n
        w.m.cache_blocks(r, r.num_computed_tokens)
    w.m.take_events()


def _after(w: World, change: str, call: str) -> Callable[[], Any]:
    m, a, b = w.m, w.a, w.b
    if change == "rename":
        a.request_id = "a-renamed"
    else:
        a.request_id, b.request_id = b.request_id, a.request_id
    if call == "decode":
        n = w.decode_ready(a, 3)  # a block is needed: no no-op answer either
        return lambda: m.allocate_slots(a, n)
    if call == "decode_noop":
        n = w.decode_ready(a, 1)
        return lambda: m.allocate_slots(a, n)
    if call == "cache_blocks":
        return lambda: m.cache_blocks(a, a.num_computed_tokens)
    if call == "free":
        return lambda: m.free(a)
    if call == "decode_batch":
        n = w.decode_ready(a, 3)
        return lambda: m.allocate_decode_batch([a], [n])
    raise AssertionError(call)


def case_changed_id(flavour: str, change: str, call: str, kind: str = "dict") -> None:
    w = World(flavour, request_class=REQUEST_CLASSES[kind])
    _warm(w)
    before = w.snap()
    call_it = _after(w, change, call)
    with_ids = (w.a.request_id, w.b.request_id)
    try:
        out = call_it()
    except ValueError as e:
        msg = str(e)
        assert "request_id" in msg and re.search(r"[\"']a[\"']", msg), msg
    else:
        raise AssertionError(f"{call} of a request whose id changed while held ({with_ids}) returned {out!r}")
    assert w.snap() == before, "the refused call changed the state"
    w.m.check_invariants()
    # Put back, the request is served again.
    w.a.request_id, w.b.request_id = "a", "b"
    n = w.a.num_tokens - w.a.num_computed_tokens
    if n:
        assert w.m.allocate_slots(w.a, n) is not None
    w.m.free(w.a)
    assert not any(w.m.get_block_ids("a"))
    w.m.check_invariants()


@pytest.mark.parametrize("kind", sorted(REQUEST_CLASSES))
@pytest.mark.parametrize("call", ["decode", "decode_noop", "cache_blocks", "free", "decode_batch"])
@pytest.mark.parametrize("change", ["rename", "swap"])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_held_request_whose_id_changed_is_refused(flavour: str, change: str, call: str, kind: str) -> None:
    in_child(case_changed_id, flavour, change, call, kind)


def case_second_live_request(flavour: str, warm: bool) -> None:
    w = World(flavour)
    if warm:
        _warm(w)
    before = w.snap()
    twin = w.Request("a", range(700, 709), BS)  # another request, the same id
    try:
        blocks, hit = w.lookup(twin)
    except ValueError as e:
        assert re.search(r"[\"']a[\"']", str(e)), e
        blocks, hit = w.m.empty_kv_cache_blocks, 0
    assert w.snap() == before, "a lookup of a second request with a held id changed the state"
    with pytest.raises(ValueError, match=r"[\"']a[\"']"):
        w.m.allocate_slots(twin, twin.num_tokens - hit, hit, blocks)
    assert w.snap() == before
    w.m.check_invariants()


@pytest.mark.parametrize("warm", [False, True], ids=["admitted", "decoding"])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_second_live_request_with_a_held_id_is_refused(flavour: str, warm: bool) -> None:
    in_child(case_second_live_request, flavour, warm)


def case_same_id_after_free(flavour: str) -> None:
    """Not a mistake: a new request may reuse the id of a freed one."""
    w = World(flavour)
    w.m.free(w.a)
    again = w.admit(w.Request("a", range(700, 709), BS))
    assert len(w.m.get_block_ids("a")[0]) == 3
    n = w.decode_ready(again, 4)
    assert w.m.allocate_slots(again, n) is not None
    w.m.check_invariants()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_an_id_is_free_again_after_free(flavour: str) -> None:
    in_child(case_same_id_after_free, flavour)
