"""The batched decode API gives exactly what per-request `allocate_slots`
calls give, in order: same new blocks, same Nones, same pool state."""

from __future__ import annotations

import random

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


@pytest.mark.parametrize("mix", ["full", "swa", "mamba"])
@pytest.mark.parametrize("events", [False, True])
def test_batch_equals_per_request_calls(mix: str, events: bool) -> None:
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
        if step % 2:
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
