"""Decode / prefill context parallelism (`dcp_world_size`, `pcp_world_size`)
against vLLM 0.23.0: a block then holds `block_size * dcp * pcp` tokens of
the group, and every output that shows it (allocation counts, hit lengths,
cached blocks, events' `block_size`, common prefix blocks, usage) must be
vLLM's. Configurations vLLM asserts against are refused with a ValueError."""

from __future__ import annotations

import random

import pytest

from hybridcache import KVCacheManager
from hybridcache.request import Request
from hybridcache_dev import configs
from hybridcache_dev.fuzz_setup import Group, RngChooser, Setup

# Compares against vLLM 0.23.0 (tests/conftest.py: left to that release's venv elsewhere).
pytestmark = pytest.mark.vllm("0.23.0")

pytest.importorskip("vllm.v1.core.kv_cache_manager")

from hybridcache_dev.fuzz import Driver  # noqa: E402

WORLDS = [(2, 1), (1, 2), (2, 2)]


def _setup(dcp: int, pcp: int, caching: bool, eagle: bool, groups: tuple[Group, ...] = (Group("full", 4),),
           seed: int = 0) -> Setup:
    size = groups[0].block_size * dcp * pcp
    return Setup(mix="full", caching=caching, groups=groups, scheduler_block_size=size, hash_block_size=size,
                 num_blocks=14 + 9 * seed, use_eagle=eagle, events=caching, log_stats=True, dcp=dcp, pcp=pcp)


def _drive(setup: Setup, seed: int, ops: int = 1500) -> Driver:
    d = Driver(setup)
    c = RngChooser(random.Random(seed))
    for _ in range(ops):
        d.step_random(c)
    d.drain()
    return d


@pytest.mark.parametrize("dcp,pcp", WORLDS)
@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("eagle", [False, True])
def test_random_operations_match_vllm(dcp: int, pcp: int, caching: bool, eagle: bool) -> None:
    seed = dcp + 2 * pcp + 5 * caching + 7 * eagle
    d = _drive(_setup(dcp, pcp, caching, eagle, seed=seed % 3), seed)
    assert d.f.allocations > 200 and d.f.none_allocations > 0
    if caching:
        assert d.f.hit_tokens > 0 and d.f.events > 0


def test_several_groups_without_caching_match_vllm() -> None:
    # vLLM's no-prefix-cache coordinator builds any groups with scaled blocks.
    groups = (Group("full", 4), Group("sw", 4, 6), Group("chunked", 8, 16))
    setup = _setup(2, 1, False, False, groups)
    setup.scheduler_block_size = setup.hash_block_size = 16
    d = _drive(setup, 3)
    assert d.f.allocations > 200


def _pair(dcp: int, pcp: int) -> tuple[KVCacheManager, object]:
    kw = dict(max_model_len=256, scheduler_block_size=4 * dcp * pcp, hash_block_size=4 * dcp * pcp,
              enable_caching=True, enable_kv_cache_events=True, dcp_world_size=dcp, pcp_world_size=pcp)
    specs = (configs.full(4),)
    hc = configs.hybridcache_manager(configs.hybridcache_kv_cache_config(specs, 12), kw)
    ref = configs.vllm_manager(configs.vllm_kv_cache_config(specs, 12), kw)
    return hc, ref


@pytest.mark.parametrize("dcp,pcp", WORLDS)
def test_the_scaled_block_size_is_what_vllm_shows(dcp: int, pcp: int) -> None:
    size = 4 * dcp * pcp
    hc, ref = _pair(dcp, pcp)
    seen = []
    for m in (hc, ref):
        a = Request("a", list(range(2 * size + 1)), size)
        b = Request("b", list(range(2 * size + 3)), size)
        got = [m.allocate_slots(a, a.num_tokens).get_block_ids()]
        a.num_computed_tokens = a.num_tokens
        hit, n = m.get_computed_blocks(b)
        got.append((hit.get_block_ids(), n))
        got.append(m.allocate_slots(b, b.num_tokens - n, n, hit).get_block_ids())
        got.append([(e.block_size, len(e.block_hashes)) for e in m.take_events()])
        got.append((list(m.get_num_common_prefix_blocks("a")), round(m.usage, 6)))
        seen.append(got)
    assert seen[0] == seen[1]
    # Three blocks of `size` tokens, a two-block hit, events at `size`.
    assert seen[0][0] == ([1, 2, 3],) and seen[0][1] == (([1, 2],), 2 * size)
    assert seen[0][3] == [(size, 2)]


def _groups(*specs: configs.GroupSpec) -> object:
    return configs.hybridcache_kv_cache_config(specs, 16)


def test_what_vllm_asserts_against_is_refused() -> None:
    kw = dict(max_model_len=128, scheduler_block_size=8, hash_block_size=8, dcp_world_size=2)
    with pytest.raises(ValueError, match="dcp_world_size=2, pcp_world_size=1: .*single KV cache group"):
        KVCacheManager(_groups(configs.full(4), configs.sliding_window(8, 4)), **{**kw, "hash_block_size": 4})
    with pytest.raises(ValueError, match="dcp_world_size=2.*full attention"):
        KVCacheManager(_groups(configs.sliding_window(8, 4)), **kw)
    with pytest.raises(ValueError, match="hash_block_size \\(4\\) must equal .*dcp_world_size"):
        KVCacheManager(_groups(configs.full(4)), **{**kw, "hash_block_size": 4})
    with pytest.raises(NotImplementedError, match="Mamba"):
        KVCacheManager(_groups(configs.mamba(block_size=128)), max_model_len=128, scheduler_block_size=128,
                       hash_block_size=128, enable_caching=False, pcp_world_size=2)
    for bad in (0, -1, True, 2.0, "2"):
        with pytest.raises(ValueError, match="pcp_world_size must be a positive int"):
            KVCacheManager(_groups(configs.full(4)), **{**kw, "pcp_world_size": bad})


def test_vllm_asserts_against_them_too() -> None:
    """Pins that the refused configurations are not legal for vLLM 0.23.0."""
    kw = dict(max_model_len=128, scheduler_block_size=8, hash_block_size=4, enable_caching=True, dcp_world_size=2)
    hybrid = configs.vllm_kv_cache_config((configs.full(4), configs.sliding_window(8, 4)), 16)
    with pytest.raises(AssertionError, match="DCP not support hybrid"):
        configs.vllm_manager(hybrid, kw)
    window = configs.vllm_manager(configs.vllm_kv_cache_config((configs.sliding_window(8, 4),), 16),
                                  {**kw, "hash_block_size": 8})
    with pytest.raises(AssertionError, match="DCP not support sliding window"):
        window.get_computed_blocks(Request("a", list(range(20)), 8))
