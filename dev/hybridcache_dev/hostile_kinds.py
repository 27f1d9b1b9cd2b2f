"""Callers whose objects fight back, for the hostile-input fuzz
(`hybridcache_dev.hostile_fuzz`): a request whose attribute read calls back
into the manager (re-entrant), raises (ValueError, MemoryError,
KeyboardInterrupt), or a held request whose id is renamed or swapped with
another's. Each kind is one call that checks its own contract:

- re-entrant: the call back is refused with a RuntimeError naming the call
  in progress, and the outer call completes;
- raising: the caller's very exception propagates; the call then raises a
  ValueError saying so, for the fuzz to check that nothing changed;
- renamed or swapped: the call is refused with a ValueError, and the ids
  are put back.

A broken contract raises `HostileContractBroken` (an AssertionError: the
fuzz reports it as a failure).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from hybridcache.request import Request

KINDS = ("reenter", "raise", "rename", "swap")
RAISED = (ValueError, MemoryError, KeyboardInterrupt)


class HostileContractBroken(AssertionError):
    """The manager broke the contract with a hostile caller."""


class Hookable(Request):
    """`hybridcache.Request` whose read of a named attribute can first run a
    hook (armed with `hook` for one read; `disarm` takes it off)."""

    def hook(self, name: str, fn: Callable[[], Any]) -> None:
        """Runs `fn` at the next read of attribute `name` (once)."""
        self.__dict__["_hook"] = (name, fn)

    def disarm(self) -> None:
        """Takes the hook off, if it did not run."""
        self.__dict__.pop("_hook", None)

    def __getattribute__(self, name: str) -> Any:
        hook = object.__getattribute__(self, "__dict__").get("_hook")
        if hook is not None and hook[0] == name:
            object.__getattribute__(self, "__dict__").pop("_hook")
            hook[1]()
        return object.__getattribute__(self, name)


class _OwnError(ValueError):
    """The caller's own exception came back unchanged (the fuzz then checks
    that the state is as before, as for any refused call)."""


def _decode_call(m: Any, request: Any) -> Callable[[], Any]:
    """A running request's decode step, as vLLM schedules it."""
    request.append_output_token_ids(7)
    n = request.num_tokens - request.num_computed_tokens

    def call() -> Any:
        out = m.allocate_slots(request, n)
        if out is not None:
            request.num_computed_tokens += n
        return out

    return call


def hostile_call(rng: random.Random, m: Any, running: list[Any], fresh: Callable[[], Any],
                 max_len: int) -> tuple[str, Callable[[], Any]]:
    """(description, call) of one hostile object's call on `m`, whose
    `running` requests are `Hookable`; `fresh()` makes a new request."""
    ok = [r for r in running if r.num_tokens + 3 < max_len]
    kind = rng.choice(KINDS)
    if not ok or (kind == "swap" and len(ok) < 2):
        kind = "raise"
        target = fresh()
    else:
        target = rng.choice(ok)
    attr = rng.choice(["num_computed_tokens", "block_hashes", "request_id", "num_tokens"])
    if kind == "reenter":
        return f"re-entrant {attr} of {target.request_id}", lambda: _reenter(rng, m, target, attr, ok, fresh)
    if kind == "raise":
        exc = rng.choice(RAISED)
        return f"{exc.__name__} from {attr} of {target.request_id}", lambda: _raise(m, target, attr, exc)
    other = rng.choice([r for r in ok if r is not target]) if kind == "swap" else None
    what = rng.choice(["decode", "free", "cache_blocks"])
    return f"{kind} {target.request_id} then {what}", lambda: _changed_id(m, target, other, what)


def _inner(rng: random.Random, m: Any, running: list[Any], fresh: Callable[[], Any]) -> Callable[[], Any]:
    pick = rng.random()
    if pick < 0.4 and running:
        victim = rng.choice(running)
        return lambda: m.free(victim)
    if pick < 0.7:
        r = fresh()
        return lambda: m.allocate_slots(r, r.num_tokens)
    return lambda: m.reset_prefix_cache()


def _reenter(rng: random.Random, m: Any, target: Hookable, attr: str, running: list[Any],
             fresh: Callable[[], Any]) -> Any:
    inner = _inner(rng, m, running, fresh)
    seen: list[BaseException | None] = []

    def hook() -> None:
        try:
            inner()
        except BaseException as e:
            seen.append(e)
        else:
            seen.append(None)

    call = _decode_call(m, target)
    target.hook(attr, hook)
    try:
        out = call()
    finally:
        target.disarm()
    if seen:
        e = seen[0]
        if not isinstance(e, RuntimeError) or "allocate_slots" not in str(e) or "panicked" in str(e):
            raise HostileContractBroken(f"a call back during allocate_slots got {type(e).__name__}: {e}")
    return out


def _raise(m: Any, target: Hookable, attr: str, exc: type[BaseException]) -> Any:
    raised: list[BaseException] = []

    def hook() -> None:
        e = exc("hostile read")
        raised.append(e)
        raise e

    request_known = target.num_computed_tokens > 0
    call = _decode_call(m, target) if request_known else (lambda: m.allocate_slots(target, target.num_tokens))
    target.hook(attr, hook)
    try:
        out = call()
    except BaseException as e:
        if raised and e is raised[0]:
            raise _OwnError(f"the caller's {exc.__name__} from {attr} came back") from None
        if raised:
            raise HostileContractBroken(f"{type(e).__name__}: {e} in place of the caller's {exc.__name__}") from e
        raise
    finally:
        target.disarm()
    if raised:
        raise HostileContractBroken(f"the caller's {exc.__name__} from {attr} was swallowed (returned {out!r})")
    if not request_known and out is not None:
        m.free(target)  # a new request the fuzz does not track
    return out


def _changed_id(m: Any, target: Any, other: Any, what: str) -> Any:
    ids = (target.request_id, other.request_id if other is not None else None)
    if other is None:
        target.request_id = ids[0] + "-renamed"
    else:
        target.request_id, other.request_id = ids[1], ids[0]
    try:
        if what == "decode":
            call = _decode_call(m, target)
        elif what == "free":
            call = lambda: m.free(target)  # noqa: E731
        else:
            call = lambda: m.cache_blocks(target, target.num_computed_tokens)  # noqa: E731
        out = call()
    except ValueError:
        raise
    except BaseException as e:
        raise HostileContractBroken(f"{what} after the id changed ({ids}) raised {type(e).__name__}: {e}") from e
    finally:
        target.request_id = ids[0]
        if other is not None:
            other.request_id = ids[1]
    raise HostileContractBroken(f"{what} after the id changed ({ids}) was served: {out!r}")
