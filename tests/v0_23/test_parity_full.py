"""Differential replay: hybridcache.KVCacheManager against vLLM 0.23.0's.

Every seeded trace drives both managers with the same request objects and
compares every output (block ids, hits, free blocks, usage, events, stats,
common-prefix blocks, new block ids, block tables) after every call.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

# Compares against vLLM 0.23.0 (tests/conftest.py: left to that release's venv elsewhere).
pytestmark = pytest.mark.vllm("0.23.0")

from liars import FakeBlocks, LiesOnce
from hybridcache.tools.compare import ReplayDivergence
from hybridcache_dev.replay import DEFAULT_CONFIG, ReplayConfig, replay, run_single
from hybridcache_dev.replay import main

SEEDS = range(6)


def _config(caching: bool, events: bool, block_size: int, eagle: bool, seed: int) -> ReplayConfig:
    """Small pools (allocation failures and preemptions are frequent) and
    chunked prefill; the draft limit and stats logging vary with the seed."""
    if block_size == 16:
        shape = dict(num_blocks=40, max_model_len=384, max_prompt_len=300,
                     max_shared_prefix_len=256, max_num_batched_tokens=128)
    else:
        shape = dict(num_blocks=14, max_model_len=768, max_prompt_len=600,
                     max_shared_prefix_len=512, max_num_batched_tokens=256)
    drafts = (4, 16, 7, 1) if eagle else (0, 8, 16, 3)
    return ReplayConfig(
        block_size=block_size,
        enable_caching=caching,
        enable_kv_cache_events=events,
        use_eagle=eagle,
        log_stats=seed != 1,
        max_drafts=drafts[seed % len(drafts)],
        num_requests=80,
        **shape,
    )


@pytest.fixture(scope="module")
def vllm_factory(make_vllm_kv_cache_config):
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    def factory(cfg: ReplayConfig):
        kv_cache_config = make_vllm_kv_cache_config(cfg.num_blocks, cfg.block_size)
        return KVCacheManager(kv_cache_config, **cfg.manager_kwargs())

    return factory


@pytest.fixture(scope="module")
def hybridcache_factory(make_vllm_kv_cache_config):
    import hybridcache

    def factory(cfg: ReplayConfig):
        kv_cache_config = make_vllm_kv_cache_config(cfg.num_blocks, cfg.block_size)
        return hybridcache.KVCacheManager(kv_cache_config, **cfg.manager_kwargs())

    return factory


MATRIX = list(itertools.product((True, False), (True, False), (16, 64), (False, True)))


def _matrix_id(params) -> str:
    caching, events, block_size, eagle = params
    return (
        f"{'cache' if caching else 'nocache'}-{'events' if events else 'noevents'}"
        f"-bs{block_size}-{'eagle' if eagle else 'noeagle'}"
    )


def _check_coverage(summaries, caching: bool) -> None:
    """The traces must actually reach the interesting paths."""
    total = lambda name: sum(getattr(s, name) for s in summaries)  # noqa: E731
    assert total("ops") >= 1000
    assert total("finished") > 0
    assert total("failed_allocations") > 0
    assert total("preemptions") > 0
    assert total("evict_calls") > 0
    assert total("successful_resets") >= len(summaries)  # the final drain reset
    if caching:
        assert total("cache_hit_tokens") > 0


@pytest.mark.parametrize("params", MATRIX, ids=_matrix_id)
def test_parity_with_vllm(params, vllm_factory, hybridcache_factory):
    caching, events, block_size, eagle = params
    summaries = []
    for seed in SEEDS:
        cfg = _config(caching, events, block_size, eagle, seed)
        summaries.append(
            replay(cfg, seed, [vllm_factory, hybridcache_factory], ["vllm", "hybridcache"])
        )
    _check_coverage(summaries, caching)
    if caching and events:
        assert sum(s.events for s in summaries) > 0


@pytest.mark.parametrize("seed", (100, 101))
def test_parity_default_config(seed, vllm_factory, hybridcache_factory):
    """The long CLI trace (DEFAULT_CONFIG) also matches."""
    summary = replay(DEFAULT_CONFIG, seed, [vllm_factory, hybridcache_factory])
    _check_coverage([summary], caching=True)


@pytest.mark.parametrize("params", MATRIX[::3], ids=_matrix_id)
def test_driver_agrees_with_itself(params, vllm_factory):
    """Two vLLM managers never diverge, and a seed always gives the same trace."""
    cfg = _config(*params, seed=0)
    first = replay(cfg, 0, [vllm_factory, vllm_factory])
    again = replay(cfg, 0, [vllm_factory])
    _check_coverage([first], params[0])
    assert _without_time(first) == _without_time(again)
    assert _without_time(first) != _without_time(replay(cfg, 1, [vllm_factory]))


def test_run_single_matches_replay(hybridcache_factory):
    cfg = _config(True, True, 16, True, seed=2)
    single = run_single(cfg, 2, hybridcache_factory)
    assert single.seconds > 0
    assert _without_time(single) == _without_time(replay(cfg, 2, [hybridcache_factory]))


def test_cli_replays_and_compares(capsys, vllm_available):
    assert main(["--seeds", "2", "--requests", "30", "--compare", "vllm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("mix=full@16 ")
    assert len(lines) == 3 and all("'ops'" in line for line in lines[1:])


def _without_time(summary):
    return dataclasses.replace(summary, seconds=0.0)


# --------------------------------------------------------------------------
# The detector itself: a manager that lies once must be caught.
# --------------------------------------------------------------------------


def _shift_first_block(blocks):
    if blocks is None:
        return None
    ids = blocks.get_block_ids()
    if not ids[0]:
        return None
    return FakeBlocks(([ids[0][0] + 1] + list(ids[0][1:]),))


def _drop_first_event(events):
    return events[1:] if events else None


def _bump_hits(stats):
    return None if stats is None else dataclasses.replace(stats, hits=stats.hits + 1)


def _raise(_result):
    raise RuntimeError("boom")


class _FreeCountOffByOne:
    def __init__(self, pool):
        self._pool = pool

    def get_num_free_blocks(self):
        return self._pool.get_num_free_blocks() + 1


LIES = {
    "allocate_slots": ("allocate_slots", _shift_first_block),
    "get_computed_blocks": (
        "get_computed_blocks",
        lambda r: (r[0], r[1] - 1) if r[1] else None,
    ),
    "take_events": ("take_events", _drop_first_event),
    "make_prefix_cache_stats": ("make_prefix_cache_stats", _bump_hits),
    "get_block_ids": ("get_block_ids", lambda ids: (list(ids[0])[:-1],) if ids[0] else None),
    "evict_blocks": ("evict_blocks", _raise),
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_divergence_is_detected(lie, vllm_factory):
    method, corrupt = LIES[lie]
    cfg = _config(True, True, 16, False, seed=0)
    liar = lambda c: LiesOnce(vllm_factory(c), method, corrupt)  # noqa: E731
    with pytest.raises(ReplayDivergence) as info:
        replay(cfg, 0, [vllm_factory, liar], ["vllm", "liar"])
    err = info.value
    assert err.seed == 0 and err.step >= 0
    assert err.op.startswith(method)
    assert err.values[0][1] != err.values[1][1]


class _ReversedFreeQueue:
    def __init__(self, queue):
        self._queue = queue

    def get_all_free_blocks(self):
        return self._queue.get_all_free_blocks()[::-1]


def test_pool_state_divergence_is_detected(vllm_factory):
    """A free queue in another order is caught before it changes any block id."""

    class QueueLiar:
        def __init__(self, inner):
            self._inner = inner
            self.block_pool = _PoolProxy(inner.block_pool)

        def __getattr__(self, name):
            return getattr(self._inner, name)

    class _PoolProxy:
        def __init__(self, pool):
            self._pool = pool
            self.free_block_queue = _ReversedFreeQueue(pool.free_block_queue)

        def __getattr__(self, name):
            return getattr(self._pool, name)

    cfg = _config(True, True, 16, False, seed=0)
    with pytest.raises(ReplayDivergence, match="pool_state") as info:
        replay(cfg, 0, [vllm_factory, lambda c: QueueLiar(vllm_factory(c))])
    assert info.value.step == 0


def test_free_block_divergence_is_detected(vllm_factory):
    class PoolLiar:
        def __init__(self, inner):
            self._inner = inner
            self.block_pool = _FreeCountOffByOne(inner.block_pool)

        def __getattr__(self, name):
            return getattr(self._inner, name)

    cfg = _config(False, False, 64, False, seed=1)
    with pytest.raises(ReplayDivergence, match="get_num_free_blocks"):
        replay(cfg, 1, [vllm_factory, lambda c: PoolLiar(vllm_factory(c))])
