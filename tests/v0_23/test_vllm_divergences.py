"""Sequences that vLLM 0.23.0 accepts but mishandles, where hybridcache
deliberately differs (docs/compatibility.md: "Where vLLM fails and hybridcache stays correct").
Each test shows vLLM's fault and hybridcache's sound answer."""

from __future__ import annotations

import pytest

# Compares against vLLM 0.23.0 (tests/conftest.py: left to that release's venv elsewhere).
pytestmark = pytest.mark.vllm("0.23.0")

from hybridcache import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheManager, Request, SlidingWindowSpec


def _config() -> KVCacheConfig:
    return KVCacheConfig(num_blocks=9, kv_cache_groups=[
        KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=4)),
        KVCacheGroupSpec(["swa"], SlidingWindowSpec(block_size=4, sliding_window=4)),
    ])


def _vllm_config():
    torch = pytest.importorskip("torch")
    iface = pytest.importorskip("vllm.v1.kv_cache_interface")
    attn = dict(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32)
    return iface.KVCacheConfig(num_blocks=9, kv_cache_tensors=[], kv_cache_groups=[
        iface.KVCacheGroupSpec(["attn"], iface.FullAttentionSpec(**attn)),
        iface.KVCacheGroupSpec(["swa"], iface.SlidingWindowSpec(**attn, sliding_window=4)),
    ])


def _scenario(m) -> tuple:
    """A request whose sliding-window hit block is free (cached) and whose
    external tokens need fresh blocks in every group."""
    a = Request("a", range(16), 4)
    m.allocate_slots(a, 16)
    a.num_computed_tokens = 16
    m.remove_skipped_blocks("a", 16)  # a's out-of-window blocks go back, still cached
    b = Request("b", [*range(12), *[99] * 5], 4)
    hit, n = m.get_computed_blocks(b)
    assert (hit.get_block_ids(), n) == (([1, 2, 3], [0, 0, 7]), 12)
    m.allocate_slots(b, 1, n, hit, num_external_computed_tokens=1)
    return m.get_block_ids("b")


def test_external_tokens_never_put_a_block_in_two_groups() -> None:
    ours = KVCacheManager(_config(), 64, 4, 4)
    full, swa = _scenario(ours)
    assert full[:3] == [1, 2, 3] and swa[:3] == [0, 0, 7]
    assert not set(full) & (set(swa) - {0}), (full, swa)
    ours.check_invariants()
    vkm = pytest.importorskip("vllm.v1.core.kv_cache_manager")
    ref = vkm.KVCacheManager(_vllm_config(), 64, 4, 4)
    # vLLM 0.23.0: the full-attention group's external block pops the free
    # sliding-window hit (block 7), which the sliding-window group then takes too.
    assert _scenario(ref) == ([1, 2, 3, 7], [0, 0, 7, 6])
