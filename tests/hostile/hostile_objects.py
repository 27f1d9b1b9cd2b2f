"""Caller objects that fight back, for the hostile-caller tests: a request
whose attribute reads run a hook (re-enter the manager, raise, change the
request), a list whose `__len__` does, an int-like whose `__index__` does,
and a request whose finalizer calls the manager."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridcache import Request


class Hooked(Request):
    """`hybridcache.Request` whose read of a named attribute first runs a
    hook (armed with `hook`, for a number of reads; -1: every read)."""

    def hook(self, name: str, fn: Callable[[], Any], times: int = 1) -> None:
        self.__dict__.setdefault("_hooks", {})[name] = [fn, times]

    def disarm(self) -> None:
        self.__dict__.pop("_hooks", None)

    def __getattribute__(self, name: str) -> Any:
        hooks = object.__getattribute__(self, "__dict__").get("_hooks")
        if hooks and name in hooks:
            h = hooks[name]
            if h[1] != 0:
                h[1] -= 1
                h[0]()
        return object.__getattribute__(self, name)


class SlotRequest(Request):
    """`hybridcache.Request` keeping `request_id` and `num_computed_tokens`
    in slots (member descriptors), as a `__slots__` request class does."""

    __slots__ = ("request_id", "num_computed_tokens")


class HookedList(list):
    """A list whose `__len__` runs a hook once."""

    def __init__(self, items: Any, fn: Callable[[], Any]) -> None:
        super().__init__(items)
        self.fn: Callable[[], Any] | None = fn

    def __len__(self) -> int:
        fn, self.fn = self.fn, None
        if fn is not None:
            fn()
        return super().__len__()

    def __iter__(self) -> Any:
        len(self)
        return super().__iter__()


class HookedIndex:
    """An int-like (`__index__`) that runs a hook once when read."""

    def __init__(self, value: int, fn: Callable[[], Any]) -> None:
        self.value = value
        self.fn: Callable[[], Any] | None = fn

    def __index__(self) -> int:
        fn, self.fn = self.fn, None
        if fn is not None:
            fn()
        return self.value

    def __int__(self) -> int:
        return self.__index__()


class Reentry:
    """A call back into a manager made from inside another call: what it
    raised (or returned) is kept for the test to judge."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.call = call
        self.error: BaseException | None = None
        self.result: Any = None
        self.ran = False

    def __call__(self) -> None:
        self.ran = True
        try:
            self.result = self.call()
        except BaseException as e:  # judged by the test
            self.error = e


class Raiser:
    """A hook that raises `exc` (a fresh instance each time, kept)."""

    def __init__(self, exc: type[BaseException]) -> None:
        self.exc = exc
        self.raised: list[BaseException] = []

    def __call__(self) -> None:
        e = self.exc("hostile read")
        self.raised.append(e)
        raise e
