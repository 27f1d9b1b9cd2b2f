"""`metrics_collector` against vLLM 0.23.0: each manager gets its own vLLM
`KVCacheMetricsCollector(sample_rate)` under the same `random.seed`; the
calls it receives ((method, block_id), in order), the blocks it samples
(`block_metrics` keys) after every operation and the eviction events it
drains must be vLLM's, on every path (admission with hits and external
tokens, the bound decode, the batch APIs, evict_blocks, reset_prefix_cache)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from hybridcache.blocks import BlockView
from hybridcache.request import Request
from hybridcache_dev import configs

# Compares against vLLM 0.23.0 (tests/conftest.py: left to that release's venv elsewhere).
pytestmark = pytest.mark.vllm("0.23.0")

pytest.importorskip("vllm.v1.core.kv_cache_manager")

from hybridcache_dev.fuzz import MIXES, Driver, RngChooser, random_setup  # noqa: E402
from hybridcache_dev.block_metrics import observe, recording_collector  # noqa: E402

RATES = [1.0, 0.3]


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("mix", MIXES)
def test_random_operations_tell_the_collector_what_vllm_tells_it(mix: str, rate: float) -> None:
    rng = random.Random(f"{mix}{rate}")
    random.seed(11)
    for caching in (True, False):
        setup = random_setup(rng, mix, caching)
        setup.metrics_sample_rate = rate
        d = Driver(setup)  # compares `observe(collector)` after every operation
        c = RngChooser(rng)
        for _ in range(500):
            d.step_random(c)
        d.drain()
        assert d.f.allocations > 50


def _managers(rate: float, caching: bool = True, num_blocks: int = 20) -> list[Any]:
    kw = dict(max_model_len=256, scheduler_block_size=4, hash_block_size=4, enable_caching=caching)
    specs = (configs.full(4),)
    out = []
    for build, cfg in ((configs.vllm_manager, configs.vllm_kv_cache_config),
                       (configs.hybridcache_manager, configs.hybridcache_kv_cache_config)):
        out.append(build(cfg(specs, num_blocks), {**kw, "metrics_collector": recording_collector(rate)}))
    return out


def _script(m: Any) -> list[Any]:
    """A fixed sequence of manager calls; what the collector saw after each."""
    seen = []
    reqs = [Request(f"r{i}", [i % 2] * 9 + list(range(10 + i)) + list(range(100, 100 + 10 * (i > 2))), 4)
            for i in range(5)]

    def note() -> None:
        seen.append(observe(m.metrics_collector))

    for r in reqs[:3]:
        hit, n = m.get_computed_blocks(r)
        m.allocate_slots(r, r.num_tokens - n, n, hit)
        r.num_computed_tokens = r.num_tokens
        note()
    for _ in range(6):  # decodes in the scheduler's spelling (the bound fast path)
        for r in reqs[:3]:
            r.append_output_token_ids([7])
            m.allocate_slots(r, 1, num_lookahead_tokens=2)
            r.num_computed_tokens += 1
        note()
    m.free(reqs[0])
    m.free(reqs[1])
    note()
    r = reqs[3]  # a hit on freed cached blocks, then external tokens
    hit, n = m.get_computed_blocks(r)
    m.allocate_slots(r, 2, n, hit, num_external_computed_tokens=3)
    note()
    m.evict_blocks({b for b in range(20) if b % 3 == 0})
    note()
    r = reqs[4]  # pops cached free blocks: evicted, then allocated
    hit, n = m.get_computed_blocks(r)
    m.allocate_slots(r, r.num_tokens - n, n, hit)
    note()
    for q in (reqs[2], reqs[3], reqs[4]):
        m.free(q)
    assert m.reset_prefix_cache()
    note()
    return seen


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("caching", [True, False])
def test_a_scripted_sequence_matches_vllm(rate: float, caching: bool) -> None:
    runs = []
    for m in _managers(rate, caching):
        random.seed(5)
        runs.append(_script(m))
    assert runs[0] == runs[1]
    calls = [name for step in runs[0] for name, _ in step[0]]
    assert calls.count("on_block_allocated") > 10
    if caching:
        assert {"on_block_accessed", "on_block_evicted", "reset"} <= set(calls)
        if rate == 1.0:
            assert sum(step[2] for step in runs[0]) > 0, "some sampled block was evicted"
    else:
        # No hits; evict_blocks tells the collector even without caching.
        assert "on_block_accessed" not in calls and "on_block_evicted" in calls


@pytest.mark.parametrize("api", ["batch", "arrays"])
def test_the_batch_apis_tell_the_collector_as_per_request_calls_do(api: str) -> None:
    ref, hc = _managers(1.0, num_blocks=14)
    random.seed(3)
    rng = random.Random(1)
    reqs = {id(m): [Request(f"r{i}", list(range(i, i + 7)), 4) for i in range(4)] for m in (ref, hc)}
    for m in (ref, hc):
        for r in reqs[id(m)]:
            m.allocate_slots(r, r.num_tokens)
            r.num_computed_tokens = r.num_tokens
    assert observe(ref.metrics_collector) == observe(hc.metrics_collector)
    for step in range(12):
        drafts = [rng.choice([0, 1, 4]) for _ in range(4)]
        for r in (*reqs[id(ref)], *reqs[id(hc)]):
            r.append_output_token_ids([1])
        state = random.getstate()
        for r, k in zip(reqs[id(ref)], drafts):
            ref.allocate_slots(r, 1 + k, num_lookahead_tokens=1)
        random.setstate(state)
        rs = reqs[id(hc)]
        if api == "batch":
            hc.allocate_decode_batch(rs, [1 + k for k in drafts], 1)
        else:
            hc.allocate_decode_arrays([hc.request_handle(r.request_id) for r in rs], [1 + k for k in drafts],
                                      [r.num_computed_tokens for r in rs], [r.num_tokens for r in rs], 1, rs)
        for r in (*reqs[id(ref)], *reqs[id(hc)]):
            r.num_computed_tokens += 1
        assert observe(ref.metrics_collector) == observe(hc.metrics_collector), f"step {step}"


def test_the_collector_gets_block_views() -> None:
    got: list[Any] = []

    class Collector:
        def on_block_allocated(self, block: Any) -> None:
            got.append(block)

        def on_block_accessed(self, block: Any) -> None:
            got.append(block)

        def on_block_evicted(self, block: Any) -> None:
            got.append(block)

        def reset(self) -> None:
            got.append("reset")

    collector = Collector()
    hc = configs.hybridcache_manager(configs.hybridcache_kv_cache_config((configs.full(4),), 6),
                                     dict(max_model_len=64, scheduler_block_size=4, hash_block_size=4,
                                          metrics_collector=collector))
    assert hc.metrics_collector is collector
    hc.allocate_slots(Request("a", list(range(6)), 4), 6)
    assert [type(b) for b in got] == [BlockView] * 4
    assert [b.block_id for b in got] == [1, 1, 2, 2]
    assert got[1].ref_cnt == 1
