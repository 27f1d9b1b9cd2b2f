"""Encoder-decoder models (Whisper) under vLLM 0.33.0: a cross-attention
group beside full attention, prefix caching off (vLLM's cross-attention hit
search raises, so encoder-decoder models run without it). The encoder's
states get one static allocation per request, sized by its encoder tokens.
Random admissions, decodes, preemptions and frees against vLLM 0.33.0's
manager, every result and the pool compared after each call; vLLM's own
scheduler tests of it run in the peer suite (test_scheduler.py
`test_*cross_attn*`)."""

from __future__ import annotations

import dataclasses
import os
import random

import pytest

pytestmark = pytest.mark.vllm("0.33.0")

from hybridcache_dev.oracle import module_needs_vllm  # noqa: E402

vllm = module_needs_vllm("0.33.0")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # 0.33.0 infers no device on a CPU machine

from hybridcache.tools.compare import norm_blocks, pool_state  # noqa: E402
from hybridcache_dev.release_api import release  # noqa: E402

API = release("0.33.0")


def _config(num_blocks: int, block_size: int, zeroing: bool) -> object:
    import torch
    from vllm.v1 import kv_cache_interface as iface

    attn = dict(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    # A bfloat16 cross-attention cache mixes precisions: new blocks are
    # recorded for worker-side zeroing (take_new_block_ids).
    cross = dict(attn, dtype=torch.bfloat16) if zeroing else attn
    groups = [iface.KVCacheGroupSpec(["dec"], iface.FullAttentionSpec(**attn)),
              iface.KVCacheGroupSpec(["cross"], iface.CrossAttentionSpec(**cross))]
    return iface.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


@pytest.mark.parametrize("seed", range(4))
def test_random_operations_match_vllm(seed: int) -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    from hybridcache.releases.v0_33.manager import KVCacheManager033

    rng = random.Random(seed)
    bs = rng.choice((4, 8, 16))
    s = dataclasses.replace(API.random_setup(random.Random(seed), "full", False), scheduler_block_size=bs,
                            hash_block_size=bs)
    kw = {**API.manager_kwargs(s), "enable_caching": False, "use_eagle": False, "num_hash_lookahead_tokens": 0,
          "num_prefill_lookahead": 0, "enable_kv_cache_events": False}
    cfg = _config(rng.randint(12, 40), bs, zeroing=seed % 2 == 1)
    ref, hc = KVCacheManager(kv_cache_config=cfg, **kw), KVCacheManager033(kv_cache_config=cfg, **kw)
    assert type(hc.coordinator).__name__ == type(ref.coordinator).__name__
    managers = (ref, hc)
    running: dict[str, tuple[object, object]] = {}
    allocations = 0
    for step in range(400):
        op = rng.random()
        if op < 0.35 and len(running) < 6:
            rid = f"r{step}"
            tokens = [rng.randrange(100) for _ in range(rng.randint(1, 60))]
            enc = rng.choice((0, 1, bs - 1, bs, bs + 1, rng.randint(1, 5 * bs)))
            reqs = tuple(API.make_request(s, rid, tokens) for _ in managers)
            got = [m.allocate_slots(r, len(tokens), num_encoder_tokens=enc) for m, r in zip(managers, reqs)]
            assert norm_blocks(got[0]) == norm_blocks(got[1]), (step, rid, enc)
            if got[0] is not None:
                running[rid] = reqs
                for r in reqs:
                    r.num_computed_tokens = len(tokens)
                allocations += 1
        elif op < 0.8 and running:
            rid = rng.choice(sorted(running))
            got = []
            for m, r in zip(managers, running[rid]):
                r.append_output_token_ids(rng.randrange(100))
                got.append(m.allocate_slots(r, 1))
                r.num_computed_tokens += 1
            assert norm_blocks(got[0]) == norm_blocks(got[1]), (step, rid)
            allocations += 1
        elif running:
            rid = rng.choice(sorted(running))
            for m, r in zip(managers, running.pop(rid)):
                m.free(r)
        assert [m.block_pool.get_num_free_blocks() for m in managers] == [ref.block_pool.get_num_free_blocks()] * 2
        assert pool_state(ref) == pool_state(hc), step
        assert ref.take_new_block_ids() == hc.take_new_block_ids(), step
        for rid in running:
            assert ref.get_block_ids(rid) == hc.get_block_ids(rid), (step, rid)
    assert allocations > 100


def test_prefix_caching_with_cross_attention_is_refused() -> None:
    """vLLM 0.33.0 builds the manager, then raises on the first lookup
    (CrossAttentionManager.find_longest_cache_hit); hybridcache refuses the
    layout at construction, naming it."""
    from hybridcache.releases.v0_33.manager import KVCacheManager033

    s = dataclasses.replace(API.random_setup(random.Random(0), "full", True), scheduler_block_size=8, hash_block_size=8,
                            dcp=1, pcp=1)
    with pytest.raises(NotImplementedError, match="cross-attention"):
        KVCacheManager033(kv_cache_config=_config(20, 8, False), **{**API.manager_kwargs(s), "enable_caching": True})
