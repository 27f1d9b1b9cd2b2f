"""vLLM #39271 and its class: Mamba "align" mode with speculative decoding
whose draft count changes every round. Written against hybridcache; every
step is also replayed on vLLM 0.23.0's manager and compared."""

from __future__ import annotations

import random

import pytest

# Compares against vLLM 0.23.0 (tests/conftest.py: left to that release's venv elsewhere).
pytestmark = pytest.mark.vllm("0.23.0")

import hybridcache
from hybridcache import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec, Request

BLOCK = 16


def hybrid_config(num_blocks: int, mamba_mode: str, num_spec: int, extra_full: int = 0):
    groups = [KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=BLOCK))]
    for i in range(1 + extra_full):
        spec = MambaSpec(block_size=BLOCK, shapes=((1, 1),), dtypes=("f32",), mamba_cache_mode=mamba_mode,
                         num_speculative_blocks=num_spec)
        groups.append(KVCacheGroupSpec([f"mamba{i}"], spec))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_groups=groups)


def make_manager(cls, cfg, caching=True):
    return cls(cfg, max_model_len=8192, scheduler_block_size=BLOCK, hash_block_size=BLOCK, enable_caching=caching)


def test_issue_39271_dynamic_draft_tokens():
    """vLLM's own regression test, against hybridcache."""
    manager = make_manager(hybridcache.KVCacheManager, hybrid_config(30, "align", 0))
    tokens = [i for i in range(3) for _ in range(BLOCK)] + [3] * 7
    req = Request("0", tokens, BLOCK)
    computed, n = manager.get_computed_blocks(req)
    assert n == 0
    assert manager.allocate_slots(req, len(tokens), n, computed) is not None
    req.append_output_token_ids([1])
    req.num_computed_tokens = len(tokens)
    # Round 1: 16 drafts, one accepted.
    assert manager.allocate_slots(req, num_new_tokens=16, num_new_computed_tokens=0) is not None
    req.append_output_token_ids([4])
    req.num_computed_tokens += 1
    # Round 2: one draft. vLLM <= 0.22 asserted here and killed the server.
    blocks = manager.allocate_slots(req, num_new_tokens=1, num_new_computed_tokens=0)
    assert blocks is not None and all(len(g) == 0 for g in blocks.get_block_ids())
    manager.check_invariants()
    manager.free(req)
    manager.check_invariants()
    assert manager.block_pool.get_num_free_blocks() == 29


def _vllm_config(cfg):
    torch = pytest.importorskip("torch")
    iface = pytest.importorskip("vllm.v1.kv_cache_interface")
    groups = []
    for g in cfg.kv_cache_groups:
        s = g.kv_cache_spec
        if isinstance(s, MambaSpec):
            spec = iface.MambaSpec(block_size=s.block_size, shapes=((1, 1),), dtypes=(torch.float32,),
                                   mamba_cache_mode=s.mamba_cache_mode, num_speculative_blocks=s.num_speculative_blocks)
        else:
            spec = iface.FullAttentionSpec(block_size=s.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
        groups.append(iface.KVCacheGroupSpec(g.layer_names, spec))
    return iface.KVCacheConfig(num_blocks=cfg.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def _draft_sequences():
    rng = random.Random(7)
    yield "up", [0, 1, 2, 4, 8, 16, 16]
    yield "down", [16, 8, 4, 2, 1, 0, 0]
    yield "zero_and_back", [16, 0, 0, 16, 1, 0, 5]
    yield "random", [rng.choice([0, 1, 2, 3, 5, 8, 16]) for _ in range(30)]


@pytest.mark.parametrize("mode", ["none", "all", "align"])
@pytest.mark.parametrize("num_spec", [0, 2])
@pytest.mark.parametrize("name,drafts", list(_draft_sequences()))
def test_draft_count_sweep_matches_vllm(mode, num_spec, name, drafts):
    """Chunked prefill, then decode rounds whose draft count follows `drafts`
    with random acceptance; every output equals vLLM 0.23.0's."""
    vkm = pytest.importorskip("vllm.v1.core.kv_cache_manager")
    caching = mode != "none"
    cfg = hybrid_config(200, mode, num_spec, extra_full=1)
    ours = make_manager(hybridcache.KVCacheManager, cfg, caching)
    ref = make_manager(vkm.KVCacheManager, _vllm_config(cfg), caching)
    rng = random.Random(hash((mode, num_spec, name)) & 0xFFFF)

    def both(fn):
        a, b = fn(ref), fn(ours)
        na = None if a is None else a.get_block_ids()
        nb = None if b is None else b.get_block_ids()
        assert na == nb, (na, nb)
        assert ref.block_pool.get_num_free_blocks() == ours.block_pool.get_num_free_blocks()
        ours.check_invariants()
        return nb

    for r in range(2):
        prompt = [rng.randrange(50) for _ in range(5 * BLOCK + 3)]
        req = Request(f"r{r}", prompt, BLOCK)
        if caching and r == 1:
            (ha, na), (hb, nb) = ref.get_computed_blocks(req), ours.get_computed_blocks(req)
            assert (ha.get_block_ids(), na) == (hb.get_block_ids(), nb)
        else:
            hb = nb = ha = na = None
        # Chunked prefill in block-aligned chunks (the scheduler's align split).
        first = True
        while req.num_computed_tokens < req.num_tokens:
            left = req.num_tokens - req.num_computed_tokens
            chunk = min(left, 2 * BLOCK) if left > BLOCK else left
            if first and na:
                chunk = min(req.num_tokens - na, 2 * BLOCK)
                both(lambda m: m.allocate_slots(req, chunk, na, ha if m is ref else hb))
                req.num_computed_tokens = na + chunk
            else:
                both(lambda m: m.allocate_slots(req, chunk))
                req.num_computed_tokens += chunk
            first = False
            for m in (ref, ours):
                m.new_step_starts()
        req.append_output_token_ids([1])
        for k in drafts:
            both(lambda m: m.allocate_slots(req, 1 + k))
            accepted = rng.randint(0, k)
            req.append_output_token_ids([rng.randrange(50) for _ in range(accepted + 1)])
            req.num_computed_tokens += 1 + accepted
            for m in (ref, ours):
                m.new_step_starts()
        ref.free(req)
        ours.free(req)
        assert ref.block_pool.get_num_free_blocks() == ours.block_pool.get_num_free_blocks()
        ours.check_invariants()


def test_external_tokens_in_align_mode_never_crash():
    """vLLM 0.23.0 under-counts the block it gives external (connector)
    tokens in a Mamba align group: with exactly that many free blocks it
    passes its capacity check and then raises in the pool. hybridcache counts
    it and answers None (the scheduler waits), state untouched."""
    cfg = KVCacheConfig(num_blocks=7, kv_cache_groups=[
        KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=8)),
        KVCacheGroupSpec(["m"], MambaSpec(block_size=8, mamba_cache_mode="align")),
    ])
    ours = hybridcache.KVCacheManager(cfg, 1024, 8, 8)
    req = Request("x", list(range(40)), 8)
    before = ours.free_queue()
    assert ours.allocate_slots(req, 8, num_external_computed_tokens=32) is None
    assert ours.free_queue() == before and ours.get_block_ids("x") == ([], [])
    ours.check_invariants()
    vkm = pytest.importorskip("vllm.v1.core.kv_cache_manager")
    ref = vkm.KVCacheManager(_vllm_config(cfg), 1024, 8, 8)
    with pytest.raises(ValueError, match="Cannot get 1 free blocks"):
        ref.allocate_slots(req, 8, num_external_computed_tokens=32)
