"""The batched decode APIs give exactly what per-request `allocate_slots`
calls give, in order: same new blocks, same Nones, same pool state; bad
input to a batch changes nothing."""

from __future__ import annotations

import random
from array import array

import pytest

from hybridcache import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)

BS = 16


def _config(mix: str, num_blocks: int) -> KVCacheConfig:
    groups = [KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=BS))]
    if mix == "swa":
        groups.append(KVCacheGroupSpec(["swa"], SlidingWindowSpec(block_size=BS, sliding_window=64)))
    if mix == "mamba":
        for i in range(3):
            spec = MambaSpec(block_size=BS, mamba_cache_mode="align", num_speculative_blocks=2)
            groups.append(KVCacheGroupSpec([f"m{i}"], spec))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_groups=groups)


def _state(m: KVCacheManager, reqs: list[Request]):
    return (m.free_queue(), [m.get_block_ids(r.request_id) for r in reqs], m.take_new_block_ids())


def _arrays_call(m: KVCacheManager, reqs: list[Request], counts: list[int], step: int):
    """`allocate_decode_arrays` as a serving loop holding arrays calls it
    (bytes on even steps, lists on odd ones), unpacked to lists."""
    handles = [m.request_handle(r.request_id) for r in reqs]
    computed = [r.num_computed_tokens for r in reqs]
    totals = [r.num_tokens for r in reqs]
    if step % 2 == 0:
        args = (array("Q", handles).tobytes(), *(array("I", a).tobytes() for a in (counts, computed, totals)))
    else:
        args = (handles, counts, computed, totals)
    ok, offsets, ids = m.allocate_decode_arrays(*args, 2, reqs)
    assert len(ok) == len(reqs)
    return [b != 0 for b in ok], array("I", offsets).tolist(), array("I", ids).tolist()


@pytest.mark.parametrize("mix", ["full", "swa", "mamba"])
@pytest.mark.parametrize("events", [False, True])
@pytest.mark.parametrize("api", ["batch", "arrays"])
def test_batch_equals_per_request_calls(mix: str, events: bool, api: str) -> None:
    rng = random.Random(mix)
    cfg = _config(mix, num_blocks={"full": 60, "swa": 110, "mamba": 170}[mix])
    single = KVCacheManager(cfg, 4096, BS, BS, enable_kv_cache_events=events)
    batched = KVCacheManager(cfg, 4096, BS, BS, enable_kv_cache_events=events)
    reqs_s, reqs_b = [], []
    for i in range(12):
        prompt = [rng.randrange(30) for _ in range(rng.randrange(20, 50))]
        for m, reqs in ((single, reqs_s), (batched, reqs_b)):
            r = Request(f"r{i}", prompt, BS)
            assert m.allocate_slots(r, r.num_tokens) is not None
            r.num_computed_tokens = r.num_tokens
            r.append_output_token_ids([1])
            reqs.append(r)
    saw_none = False
    for step in range(60):
        drafts = [rng.choice([0, 0, 1, 4, 16]) for _ in reqs_s]
        expected = [single.allocate_slots(r, 1 + d, num_lookahead_tokens=2) for r, d in zip(reqs_s, drafts)]
        if api == "arrays":
            ok, offsets, ids = _arrays_call(batched, reqs_b, [1 + d for d in drafts], step)
        elif step % 2:
            ok, offsets, ids = batched.allocate_decode_batch(reqs_b, [1 + d for d in drafts], 2)
        else:  # counts passed as arrays: the request attributes are not read
            computed = [r.num_computed_tokens for r in reqs_b]
            totals = [r.num_tokens for r in reqs_b]
            ok, offsets, ids = batched.allocate_decode_batch(reqs_b, [1 + d for d in drafts], 2, computed, totals)
        g = single.num_kv_cache_groups
        for i, exp in enumerate(expected):
            assert ok[i] == (exp is not None)
            got = tuple(list(ids[offsets[i * g + k] : offsets[i * g + k + 1]]) for k in range(g))
            if exp is not None:
                assert got == exp.get_block_ids()
            saw_none |= exp is None
        assert _state(single, reqs_s) == _state(batched, reqs_b)
        assert single.take_events() == batched.take_events()
        for rs, rb, d, o in zip(reqs_s, reqs_b, drafts, ok):
            if not o:
                continue
            accepted = rng.randint(0, d)
            toks = [rng.randrange(30) for _ in range(accepted + 1)]
            for r in (rs, rb):
                r.num_computed_tokens += 1 + accepted
                r.append_output_token_ids(toks)
        for m in (single, batched):
            m.new_step_starts()
        batched.check_invariants()
    assert saw_none, "the pool never ran out: the None path went untested"


def test_batch_rejects_mismatched_lengths() -> None:
    m = KVCacheManager(_config("full", 10), 256, BS, BS)
    with pytest.raises(ValueError, match="2 entries for 1 requests"):
        m.allocate_decode_batch([Request("a", range(5), BS)], [1, 1])
    with pytest.raises(ValueError, match="num_tokens has 0 entries for 1 requests"):
        m.allocate_decode_batch([Request("a", range(5), BS)], [1], 0, [0], [])


def _running(m: KVCacheManager, n: int) -> list[Request]:
    reqs = []
    for i in range(n):
        r = Request(f"r{i}", range(i, i + 15), BS)
        assert m.allocate_slots(r, r.num_tokens) is not None
        r.num_computed_tokens = r.num_tokens
        r.append_output_token_ids([1])
        reqs.append(r)
    return reqs


def test_arrays_bad_input_changes_nothing() -> None:
    m = KVCacheManager(_config("full", 40), 256, BS, BS)
    reqs = _running(m, 3)
    handles = [m.request_handle(r.request_id) for r in reqs]
    computed = [r.num_computed_tokens for r in reqs]
    totals = [r.num_tokens for r in reqs]

    def call(h=handles, new=(2, 2, 2), c=computed, t=totals, r=reqs):
        return m.allocate_decode_arrays(h, list(new), c, t, 0, r)

    gone = Request("gone", range(5), BS)
    m.allocate_slots(gone, 5)
    stale = m.request_handle("gone")
    m.free(gone)
    m.take_new_block_ids()
    before = _state(m, reqs)
    # Each error is raised before any request of the batch is allocated:
    # request 0 would get a block here (2 tokens cross a block boundary).
    with pytest.raises(KeyError, match="names no request"):
        call(h=[handles[0], handles[1], stale])
    with pytest.raises(ValueError, match="appears twice"):
        call(h=[handles[0], handles[1], handles[0]])
    with pytest.raises(ValueError, match="num_new_tokens must be greater than 0"):
        call(new=(2, 2, 0))
    with pytest.raises(ValueError, match="num_computed_tokens has 2 entries for 3 handles"):
        call(c=computed[:2])
    with pytest.raises(ValueError, match="not a whole number of 8-byte ints"):
        call(h=b"\x00" * 7)
    with pytest.raises(ValueError, match=r"num_tokens\[1\] must be >= 0"):
        call(t=[totals[0], -1, totals[2]])
    with pytest.raises(TypeError, match=r"handles must be a list of ints or bytes"):
        call(h=tuple(handles))
    # A block fills (16 computed + 1): its hashes are needed, and requests= was not given.
    with pytest.raises(ValueError, match="pass requests="):
        m.allocate_decode_arrays(handles, [1, 1, 1], [16, 16, 16], [17, 17, 17], 0, None)
    assert _state(m, reqs) == before
    m.check_invariants()
    # The same arrays, well formed, work.
    ok, _, _ = call()
    assert ok == b"\x01\x01\x01"


def test_request_handle_names_one_request_until_freed() -> None:
    m = KVCacheManager(_config("full", 20), 256, BS, BS)
    with pytest.raises(KeyError, match="holds no state"):
        m.request_handle("r0")
    (r,) = _running(m, 1)
    h = m.request_handle("r0")
    assert m.request_handle("r0") == h
    m.free(r)
    (r2,) = _running(m, 1)  # same id, new tenancy
    assert m.request_handle("r0") != h
