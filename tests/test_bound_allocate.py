"""`manager.allocate_slots` is a builtin bound to the manager (vectorcall,
no PyO3 argument matching) that finds requests by their id object: it must
behave exactly as the class's `NativeManager.allocate_slots`, reject bad
calls as Python does, and never confuse requests whose ids are equal,
re-used or rebuilt."""

from __future__ import annotations

import dis
import random
import sys
from typing import Any

import pytest

from hybridcache import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    Request,
)
from hybridcache._native import NativeManager

BS = 4


def _make(num_blocks: int = 40, mamba: bool = False) -> KVCacheManager:
    groups = [KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=BS))]
    if mamba:
        spec = MambaSpec(block_size=BS, mamba_cache_mode="align", num_speculative_blocks=2)
        groups.append(KVCacheGroupSpec(["m"], spec))
    return KVCacheManager(KVCacheConfig(num_blocks, [], groups), 256, BS, BS)


def _state(m: KVCacheManager, rids: list[str]) -> Any:
    return (m.free_queue(), {r: m.get_block_ids(r) for r in rids}, m.usage)


def _ids(blocks: Any) -> Any:
    return None if blocks is None else blocks.get_block_ids()


RAW_FFI = NativeManager._raw_methods(KVCacheManager) is not None
needs_raw = pytest.mark.skipif(not RAW_FFI, reason="the binding is built without raw-ffi")


@needs_raw
def test_is_the_classs_raw_method_next_to_the_native_one() -> None:
    m = _make()
    assert m.allocate_slots.__self__ is m
    assert m.allocate_slots.__name__ == "allocate_slots"
    for name in ("allocate_slots", "cache_blocks"):
        # The class's method, made for exactly the class; not the instance's.
        raw = type(m).__dict__[name]
        assert raw.__objclass__ is type(m) and raw is not getattr(NativeManager, name)
        assert name not in vars(m)


def test_a_subclass_gets_its_own_raw_methods_and_keeps_its_overrides() -> None:
    class Mine(KVCacheManager):
        def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
            raise RuntimeError("mine")

    class Below(Mine):
        pass

    m = Below(KVCacheConfig(8, [], [KVCacheGroupSpec(["a"], FullAttentionSpec(block_size=BS))]), 64, BS, BS)
    r = Request("a", list(range(4)), BS)
    assert _ids(m.allocate_slots(r, 4)) == ([1],)
    if RAW_FFI:
        assert Below.__dict__["allocate_slots"].__objclass__ is Below
    with pytest.raises(RuntimeError, match="mine"):
        m.cache_blocks(r, 4)
    # CPython checks `self` against the descriptor's class.
    with pytest.raises(TypeError):
        KVCacheManager.__dict__.get("allocate_slots", NativeManager.allocate_slots)(object(), r, 4)
    with pytest.raises(TypeError, match="not a NativeManager subclass"):
        NativeManager._raw_methods(int)


@needs_raw
@pytest.mark.skipif(sys.version_info < (3, 11), reason="specialization is CPython 3.11's")
def test_the_schedulers_method_lookups_on_a_manager_specialize() -> None:
    """A manager's instance dict stays within CPython's shared keys (30
    names, the facade's private state in slots) and its hot methods are the
    class's: the scheduler's `manager.allocate_slots(...)` and
    `manager.cache_blocks(...)` lookups specialize (a generic lookup per call
    cost a cold instance-dict probe). So does `blocks.get_block_ids(...)` on
    a result (`KVCacheBlocks` has no instance dict, which CPython 3.11 needs
    present to specialize)."""
    from hybridcache.releases.v0_33.manager import KVCacheManager033

    groups = [KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=BS))]
    for cls in (KVCacheManager, KVCacheManager033):
        m = cls(KVCacheConfig(400, [], groups), 4096, BS, BS)
        assert len(vars(m)) < 30, sorted(vars(m))
        reqs = [Request(f"r{i}", list(range(8)), BS) for i in range(4)]

        def hot(m: Any, r: Any) -> None:
            blocks = m.allocate_slots(r, 1, num_lookahead_tokens=0)
            blocks.get_block_ids(allow_none=True)
            m.cache_blocks(r, r.num_computed_tokens)

        for r in reqs:
            m.allocate_slots(r, 8)
            r.num_computed_tokens = 8
        for _ in range(200):
            for r in reqs:
                hot(m, r)
        ops = [(i.opname, i.argval) for i in dis.get_instructions(hot, adaptive=True)
               if i.argval in ("allocate_slots", "cache_blocks", "get_block_ids")]
        # 3.11: LOAD_METHOD_WITH_DICT / _WITH_VALUES / _NO_DICT; 3.12+:
        # LOAD_ATTR_METHOD_*.
        specialized = [op for op, _ in ops if "METHOD_" in op and not op.endswith("ADAPTIVE")]
        assert len(ops) == 3 and len(specialized) == 3, (cls, ops)


@pytest.mark.parametrize("mamba", [False, True])
def test_same_results_as_the_class_method(mamba: bool) -> None:
    """Two managers fed the same calls, one through the bound builtin, one
    through the class method, with arguments spelled every way."""
    rng = random.Random(7)
    bound, classic = _make(mamba=mamba), _make(mamba=mamba)
    prompts = [[rng.randrange(50) for _ in range(rng.randrange(3, 14))] for _ in range(6)]
    reqs = {name: [Request(f"r{i}", list(p), BS) for i, p in enumerate(prompts)] for name in ("bound", "classic")}
    for step in range(60):
        i = rng.randrange(6)
        n = rng.randrange(1, 6)
        look = rng.choice([None, 0, 2])
        spelling = rng.randrange(3)
        free_after = rng.random() < 0.05
        out = {}
        for name, m in (("bound", bound), ("classic", classic)):
            r = reqs[name][i]
            call = m.allocate_slots if name == "bound" else (lambda *a, _m=m, **k: NativeManager.allocate_slots(_m, *a, **k))
            if spelling == 0:
                res = call(r, n, num_lookahead_tokens=look)
            elif spelling == 1:
                res = call(r, n, 0, None, look)
            else:
                res = call(request=r, num_new_tokens=n, delay_cache_blocks=False, num_encoder_tokens=0)
            out[name] = _ids(res)
            if res is not None:
                r.num_computed_tokens = min(r.num_tokens, r.num_computed_tokens + n)
                if r.num_computed_tokens == r.num_tokens:
                    r.append_output_token_ids([step % 50])
            if free_after:
                m.free(r)
                r.num_computed_tokens = 0
        assert out["bound"] == out["classic"], step
        rids = [r.request_id for r in reqs["bound"]]
        assert _state(bound, rids) == _state(classic, rids), step
    bound.check_invariants()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m, r: m.allocate_slots(), "missing required argument 'request'"),
        (lambda m, r: m.allocate_slots(r), "missing required argument 'num_new_tokens'"),
        (lambda m, r: m.allocate_slots(r, 2, bogus=1), "unexpected keyword argument 'bogus'"),
        (lambda m, r: m.allocate_slots(r, 2, num_new_tokens=2), "multiple values for argument 'num_new_tokens'"),
        (lambda m, r: m.allocate_slots(r, 2, 0, None, 0, 0, False, 0, False, 0, 9), "at most 10 arguments"),
        (lambda m, r: m.allocate_slots(r, 2, delay_cache_blocks=1), "delay_cache_blocks must be a bool"),
        (lambda m, r: m.allocate_slots(r, "2"), "num_new_tokens must be an int"),
        (lambda m, r: m.allocate_slots(r, 2, num_lookahead_tokens=-1), "num_lookahead_tokens must be >= 0"),
    ],
)
def test_bad_calls_raise_and_change_nothing(call: Any, message: str) -> None:
    m = _make()
    r = Request("a", list(range(10)), BS)
    assert m.allocate_slots(r, 10) is not None
    before = _state(m, ["a"])
    with pytest.raises((TypeError, ValueError), match=message):
        call(m, r)
    assert _state(m, ["a"]) == before
    m.check_invariants()


def test_requests_are_found_by_value_whatever_the_id_object() -> None:
    """A request is the same request whichever str object carries its id
    (a rebuilt, equal string); another live Request object with its id is
    refused; and a freed request's id object names nothing once the request
    is gone."""
    m = _make()
    a = Request("".join(["req", "-a"]), list(range(8)), BS)
    assert _ids(m.allocate_slots(a, 8)) == ([1, 2],)
    a.num_computed_tokens = 8
    old_id = a.request_id
    a.request_id = "".join(["req-", "a"])  # an equal id, another str object
    assert a.request_id is not old_id
    assert _ids(m.allocate_slots(a, 4)) == ([3],), "found by value: the request's table grows"
    other = Request("req-a" + "", list(range(8)), BS)  # another live request, the same id
    other.num_computed_tokens = 8
    with pytest.raises(ValueError, match="another live request"):
        m.allocate_slots(other, 4)
    m.free(a)
    assert m.get_block_ids("req-a") == ([],)
    # The old id object now names a new request: nothing of the old one shows.
    b = Request("x", list(range(4)), BS)
    b.request_id = a.request_id
    assert _ids(m.allocate_slots(b, 4)) is not None
    assert len(m.get_block_ids(a.request_id)[0]) == 1
    m.check_invariants()


def test_slot_reuse_never_hands_out_another_requests_blocks() -> None:
    """Requests come and go through the same slots; each call must see its
    own request's table (a cached slot of a freed request is never used)."""
    rng = random.Random(3)
    m = _make(num_blocks=200)
    live: dict[str, Request] = {}
    for step in range(300):
        if live and rng.random() < 0.3:
            rid = rng.choice(sorted(live))
            m.free(live.pop(rid))
            assert m.get_block_ids(rid) == ([],)
            continue
        rid = f"q{rng.randrange(12)}"
        r = live.get(rid) or Request(rid, list(range(rng.randrange(1, 9))), BS)
        n = max(1, r.num_tokens - r.num_computed_tokens)
        before = len(m.get_block_ids(rid)[0])
        if m.allocate_slots(r, n) is None:
            continue
        live[rid] = r
        r.num_computed_tokens = r.num_tokens
        r.append_output_token_ids([step % 7])
        assert len(m.get_block_ids(rid)[0]) >= before
    m.check_invariants()


def test_the_hot_calls_let_go_of_a_freed_request_object() -> None:
    """Decodes find a running request by its object (kept alive while the
    manager holds the request); freeing the request lets go of it."""
    import gc
    import weakref

    m = _make()
    r = Request("a", list(range(8)), BS)
    assert _ids(m.allocate_slots(r, 8)) == ([1, 2],)
    r.num_computed_tokens = 8
    for _ in range(3):  # the scheduler's spelling: the hot path
        assert m.allocate_slots(r, 1, num_lookahead_tokens=0) is not None
        r.num_computed_tokens += 1
    ref = weakref.ref(r)
    m.free(r)
    del r
    gc.collect()
    assert ref() is None


def test_a_request_object_back_in_a_new_slot_is_found_there() -> None:
    """One request object freed and admitted again (vLLM's preemption) takes
    whatever slot is free then; its decodes must reach that slot, and the
    request that took its old slot keeps its own table."""
    bound, classic = _make(num_blocks=60, mamba=True), _make(num_blocks=60, mamba=True)
    out: dict[str, list[Any]] = {"bound": [], "classic": []}
    for name, m in (("bound", bound), ("classic", classic)):
        a, b, c = (Request(x, list(range(6)), BS) for x in "abc")
        call = m.allocate_slots if name == "bound" else (lambda *p, **k: NativeManager.allocate_slots(m, *p, **k))

        def decode(r: Request, n: int) -> None:
            out[name].append(_ids(call(r, n, num_lookahead_tokens=1)))
            r.num_computed_tokens += n
            r.append_output_token_ids([n] * n)

        for r in (a, b):
            out[name].append(_ids(call(r, 6)))
            r.num_computed_tokens = 6
        for step in range(4):
            decode(a, 2)
            decode(b, 1)
        m.free(a)  # preempted: its slot goes to c
        out[name].append(_ids(call(c, 6)))
        c.num_computed_tokens = 6
        a.num_computed_tokens = 0
        out[name].append(_ids(call(a, a.num_tokens)))  # back, in a new slot
        a.num_computed_tokens = a.num_tokens
        for step in range(5):
            decode(a, 2)
            decode(c, 1)
            decode(b, 3)
        out[name].append(_state(m, ["a", "b", "c"]))
        m.check_invariants()
    assert out["bound"] == out["classic"]


@pytest.mark.parametrize("events", [False, True])
def test_a_dropped_manager_is_collected(events: bool) -> None:
    """A manager is in reference cycles (its bound builtin, its pool and
    coordinator views, the event sink, the null block's view) that pass
    through native objects: they tell the garbage collector what they hold,
    so a dropped manager is freed."""
    import gc
    import importlib.util
    import weakref

    # vLLM's event classes imported first: vLLM 0.33.0 keeps the exception of
    # an optional import that fails (`vllm.multimodal.media.audio` without
    # torchcodec, as in the oracle venv) and with it every frame on the stack
    # at its first import, here the manager's constructor.
    if importlib.util.find_spec("vllm") is not None:
        import vllm.distributed.kv_events  # noqa: F401

    groups = [KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=BS))]
    m = KVCacheManager(KVCacheConfig(40, [], groups), 256, BS, BS, log_stats=events, enable_kv_cache_events=events)
    r = Request("a", list(range(8)), BS)
    m.get_computed_blocks(r)
    blocks = m.allocate_slots(r, 8, num_lookahead_tokens=0)
    assert blocks is not None and blocks.blocks[0][0].block_id == 1
    assert m.block_pool.null_block.block_id == 0
    m.take_events()
    ref = weakref.ref(m)
    del m, blocks
    gc.collect()
    assert ref() is None


class _OddRequest:
    """A request-like object whose attributes can be missing or wrong."""

    def __init__(self, base: Request, **over: Any) -> None:
        self._base, self._over = base, over

    def __getattr__(self, name: str) -> Any:
        if name in self._over:
            v = self._over[name]
            if isinstance(v, Exception):
                raise v
            return v
        return getattr(self._base, name)


@pytest.mark.parametrize(
    "odd",
    [
        {"n": 2**70},
        {"n": True},
        {"n": 0},
        {"n": -1},
        {"n": 1.0},
        {"n": 1, "lookahead": None},
        {"n": 1, "lookahead": -2},
        {"n": 1, "lookahead": 2**64},
        {"n": 1, "request": {"request_id": AttributeError("request_id")}},
        {"n": 1, "request": {"request_id": 7}},
        {"n": 1, "request": {"num_computed_tokens": "8"}},
        {"n": 1, "request": {"num_computed_tokens": -1}},
        {"n": 1, "request": {"request_id": "someone-else"}},
    ],
)
def test_scheduler_spelling_with_odd_values_matches_the_class_method(odd: dict[str, Any]) -> None:
    """The bound builtin answers the scheduler's spelling (request, n,
    num_lookahead_tokens=k) on its shortest path; anything odd falls back to
    the full path: same result or same exception as the class method, and
    no exception left behind."""
    outcomes = []
    for use_bound in (True, False):
        m = _make()
        r = Request("a", list(range(8)), BS)
        assert m.allocate_slots(r, 8) is not None
        r.num_computed_tokens = 8
        r.append_output_token_ids([1])
        req = _OddRequest(r, **odd.get("request", {}))
        call = m.allocate_slots if use_bound else (lambda *a, _m=m, **k: NativeManager.allocate_slots(_m, *a, **k))
        kw = {"num_lookahead_tokens": odd["lookahead"]} if "lookahead" in odd else {}
        try:
            outcomes.append(("ok", _ids(call(req, odd["n"], **kw)), _state(m, ["a"])))
        except Exception as e:  # noqa: BLE001 - compared below
            outcomes.append((type(e).__name__, str(e), _state(m, ["a"])))
        m.check_invariants()
    assert outcomes[0] == outcomes[1]


def test_empty_result_get_block_ids_matches_the_class_method() -> None:
    """The shared empty result answers get_block_ids(allow_none=True) on a
    shortcut; every spelling gives what the class's method gives."""
    from hybridcache import KVCacheBlocks, SlidingWindowSpec

    groups = [
        KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=BS)),
        KVCacheGroupSpec(["swa"], SlidingWindowSpec(block_size=BS, sliding_window=8)),
    ]
    m = KVCacheManager(KVCacheConfig(40, [], groups), 256, BS, BS)
    empty = m.empty_kv_cache_blocks
    plain = KVCacheBlocks(((), ()))
    spellings = [((), {}), ((), {"allow_none": True}), ((True,), {}), ((False,), {}),
                 ((), {"allow_none": False, "group_ids": [1]}), ((), {"group_ids": [0]}), ((True, [0]), {})]
    for args, kw in spellings:
        assert empty.get_block_ids(*args, **kw) == KVCacheBlocks.get_block_ids(plain, *args, **kw), (args, kw)
    for args, kw in [((), {"bogus": 1}), ((1,), {}), ((True, None, 3), {})]:
        with pytest.raises(TypeError) as mine:
            empty.get_block_ids(*args, **kw)
        with pytest.raises(TypeError) as theirs:
            KVCacheBlocks.get_block_ids(plain, *args, **kw)
        assert str(mine.value) == str(theirs.value)
    r = Request("a", list(range(2)), BS)
    assert m.allocate_slots(r, 2) is not None
    r.num_computed_tokens = 2
    r.append_output_token_ids([5])
    assert m.allocate_slots(r, 1, num_lookahead_tokens=0) is empty


def test_get_block_ids_answers_every_spelling_as_vllm_defines_it() -> None:
    """KVCacheBlocks.get_block_ids is a raw descriptor for () and
    (allow_none=<bool>); other spellings reach the full method. Values as
    vLLM 0.23.0's KVCacheBlocks.get_block_ids: lists per group, None when
    allow_none and every group is empty; errors as Python's."""
    import inspect

    from hybridcache import KVCacheBlocks

    full, empty = KVCacheBlocks(((3, 4), (), (7,))), KVCacheBlocks(((), ()))
    assert str(inspect.signature(KVCacheBlocks.get_block_ids)) == "(self, /, allow_none=False, group_ids=None)"
    cases = [
        (full, (), {}, ([3, 4], [], [7])),
        (full, (), {"allow_none": True}, ([3, 4], [], [7])),
        (full, (), {"allow_none": False}, ([3, 4], [], [7])),
        (full, (True,), {}, ([3, 4], [], [7])),
        (full, (), {"group_ids": [2, 0]}, ([7], [3, 4])),
        (full, (True, [1]), {}, None),
        (empty, (), {"allow_none": True}, None),
        (empty, (), {"allow_none": False}, ([], [])),
        (empty, (), {}, ([], [])),
    ]
    for blocks, args, kw, expected in cases:
        got = blocks.get_block_ids(*args, **kw)
        assert got == expected, (args, kw)
        assert KVCacheBlocks.get_block_ids(blocks, *args, **kw) == expected
        # Fresh lists each call: a caller may mutate what it got.
        if got is not None:
            assert got[0] is not blocks.get_block_ids(*args, **kw)[0]
    for args, kw, error in [((), {"bogus": 1}, TypeError), ((1,), {}, TypeError),
                            ((), {"allow_none": 1}, TypeError), ((True, None, 3), {}, TypeError),
                            ((), {"group_ids": [5]}, ValueError)]:
        with pytest.raises(error):
            full.get_block_ids(*args, **kw)
    with pytest.raises(TypeError):
        KVCacheBlocks.get_block_ids(object())
