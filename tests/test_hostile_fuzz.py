"""The hostile-input fuzz (`python -m hybridcache_dev.hostile_fuzz`) in CI: a
slice over every manager shape, each batch in a subprocess; and the fuzz's
own checks (an abort is charged to its call, a state change under an
exception is caught)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from hybridcache_dev import hostile_fuzz as hf


def test_hostile_slice_finds_nothing() -> None:
    t = hf.run(batches=2 * len(hf.CONFIGS), calls=120, seed=15)
    assert not t.failures, "\n".join(t.failures[:20])
    assert t.calls > 0.9 * 2 * len(hf.CONFIGS) * 120  # a few are skipped: refused while built
    # The calls reach both outcomes.
    assert t.raised > 300 and t.accepted > 100


def test_an_abort_is_charged_to_its_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYBRIDCACHE_HOSTILE_ABORT_AT", "7")
    t = hf.run_in_subprocess("full", seed=3, calls=20)
    assert len(t.failures) == 1
    assert "process died" in t.failures[0] and "in call 7 " in t.failures[0], t.failures
    monkeypatch.delenv("HYBRIDCACHE_HOSTILE_ABORT_AT")
    assert hf.run_in_subprocess("full", seed=3, calls=20).failures == []


def test_a_state_change_under_an_exception_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    def calls(self: hf.World) -> list[tuple[str, Any]]:
        def mutate_then_raise() -> None:
            r = self.new_request()
            self.m.allocate_slots(r, r.num_tokens)
            raise ValueError("bad")

        return [("mutate then raise", mutate_then_raise)]

    monkeypatch.setattr(hf.World, "calls", calls)
    t = hf.run_batch("full", seed=1, calls=3)
    assert t.failures and all("changed the state" in f for f in t.failures)


def test_snapshot_sees_every_kind_of_change() -> None:
    w = hf.World("hybrid", random.Random(5))
    rids = w.rids()
    before = hf.snapshot(w.m, rids)
    w.finish()
    assert hf.snapshot(w.m, rids) != before


def test_objects_that_fight_back_are_drawn_and_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the hostile objects' calls (`hostile_kinds`): every kind is met
    (re-entrant, raising, renamed, swapped) and none breaks its contract."""
    every_call = hf.World.calls
    monkeypatch.setattr(hf.World, "calls", lambda self: every_call(self)[-1:])
    seen: list[str] = []
    t = hf.run_batch("hybrid", seed=2, calls=200, announce=seen.append)
    assert not t.failures, "\n".join(t.failures[:10])
    for kind in ("re-entrant", "Error from", "KeyboardInterrupt from", "rename ", "swap "):
        assert any(kind in s for s in seen), kind
    assert t.raised > 20 and t.accepted > 20
