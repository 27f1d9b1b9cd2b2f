"""hybridcache's vLLM 0.33.0 facade (`hybridcache.releases.v0_33.manager`) against vLLM
0.33.0's own `KVCacheManager`, call by call, on the scenarios where 0.33.0's
semantics differ from 0.23.0's (reference §2.3): the free-queue rule,
deferred frees, stats recorded by the scheduler, the watermark, adopt-only
steps, lookahead hashes capping what is cached, reused-hit events, a
sliding window with sparse retention and its shared-prefix junction. The
tests without vLLM check the release split of the native API."""

from __future__ import annotations

from typing import Any

import pytest

from hybridcache import _native
from hybridcache.config import ChunkedLocalAttentionSpec as HcChunkedLocalAttentionSpec
from hybridcache.config import CrossAttentionSpec as HcCrossAttentionSpec
from hybridcache.config import FullAttentionSpec as HcFullAttentionSpec
from hybridcache.config import KVCacheConfig as HcKVCacheConfig
from hybridcache.config import KVCacheGroupSpec as HcKVCacheGroupSpec
from hybridcache.config import MambaSpec as HcMambaSpec
from hybridcache.config import SlidingWindowSpec as HcSlidingWindowSpec
from hybridcache import KVCacheManager
from hybridcache.releases.v0_33.manager import KVCacheManager033
from hybridcache.request import Request as HcRequest

BS = 16
V033 = pytest.mark.vllm("0.33.0")


def _hc_config(num_blocks: int, groups: int = 1) -> HcKVCacheConfig:
    spec = HcFullAttentionSpec(block_size=BS)
    return HcKVCacheConfig(num_blocks=num_blocks, kv_cache_groups=[HcKVCacheGroupSpec([f"l{i}"], spec) for i in range(groups)])


# -- without vLLM: the native API per release ---------------------------------


def test_0_23_manager_takes_only_0_23_arguments() -> None:
    m = KVCacheManager(_hc_config(10), 200, BS, BS)
    req = HcRequest("r", list(range(20)), BS)
    with pytest.raises(TypeError, match="unexpected keyword argument 'has_scheduled_reqs'"):
        m.allocate_slots(req, 20, has_scheduled_reqs=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_cache_hit_length'"):
        m.get_computed_blocks(req, max_cache_hit_length=4)
    assert m.release == "0.23.0" and m.num_free_blocks == 9


def test_0_33_facade_refuses_what_it_does_not_cover() -> None:
    # Several full-attention groups and sliding windows are covered.
    assert KVCacheManager033(_hc_config(10, groups=2), 200, BS, BS).num_kv_cache_groups == 2
    sw = HcKVCacheConfig(num_blocks=10, kv_cache_groups=[
        HcKVCacheGroupSpec(["f"], HcFullAttentionSpec(block_size=BS)),
        HcKVCacheGroupSpec(["s"], HcSlidingWindowSpec(block_size=BS, sliding_window=8))])
    assert KVCacheManager033(sw, 200, BS, BS).num_kv_cache_groups == 2
    chunked = HcKVCacheConfig(num_blocks=10, kv_cache_groups=[
        HcKVCacheGroupSpec(["f"], HcFullAttentionSpec(block_size=BS)),
        HcKVCacheGroupSpec(["c"], HcChunkedLocalAttentionSpec(block_size=BS, attention_chunk_size=32))])
    assert KVCacheManager033(chunked, 200, BS, BS).num_kv_cache_groups == 2
    # Mamba prefix caching: align mode only (0.33.0 asserts it), alone or
    # beside attention groups (tests/v0_33/test_mamba_cache.py).
    cfg = HcKVCacheConfig(num_blocks=10, kv_cache_groups=[
        HcKVCacheGroupSpec(["f"], HcFullAttentionSpec(block_size=BS)), HcKVCacheGroupSpec(["x"], HcMambaSpec(block_size=BS))])
    with pytest.raises(ValueError, match="requires mamba_cache_mode='align'"):
        KVCacheManager033(cfg, 200, BS, BS)
    cfg = HcKVCacheConfig(num_blocks=10, kv_cache_groups=[
        HcKVCacheGroupSpec(["x"], HcMambaSpec(block_size=BS, mamba_cache_mode="align"))])
    assert KVCacheManager033(cfg, 200, BS, BS).enable_caching
    assert KVCacheManager033(cfg, 200, BS, BS, enable_caching=False).num_kv_cache_groups == 1
    # Mamba beside cross attention (no such model): refused by name.
    cross = HcKVCacheConfig(num_blocks=10, kv_cache_groups=[
        HcKVCacheGroupSpec(["x"], HcCrossAttentionSpec(block_size=BS)), HcKVCacheGroupSpec(["m"], HcMambaSpec(block_size=BS))])
    with pytest.raises(NotImplementedError, match="Mamba groups beside cross_attention groups are not supported"):
        KVCacheManager033(cross, 200, BS, BS, enable_caching=False)
    wide = HcKVCacheConfig(num_blocks=10, kv_cache_groups=[
        HcKVCacheGroupSpec(["f"], HcFullAttentionSpec(block_size=BS)),
        HcKVCacheGroupSpec(["g"], HcFullAttentionSpec(block_size=2 * BS))])
    # A full-attention block wider than the hash block caches partial tails
    # (tests/v0_33/test_partial_tail.py).
    assert KVCacheManager033(wide, 200, 2 * BS, BS).num_kv_cache_groups == 2
    assert KVCacheManager033(wide, 200, 2 * BS, BS, enable_caching=False).num_kv_cache_groups == 2
    # 0.33.0's dcp scales every dcp-sharded group (tests/v0_33/test_context_parallel.py).
    two = KVCacheManager033(_hc_config(10, groups=2), 200, 2 * BS, 2 * BS, dcp_world_size=2)
    assert [m.block_size for m in two.coordinator.single_type_managers] == [2 * BS, 2 * BS]
    # Multi-module MTP is covered (tests/v0_33/test_mtp.py).
    assert KVCacheManager033(_hc_config(10), 200, BS, BS, num_prefill_lookahead=2).num_reprefillable_tokens == 1
    with pytest.raises(ValueError, match="watermark must be non-negative"):
        KVCacheManager033(_hc_config(10), 200, BS, BS, watermark=-0.1)
    with pytest.raises(ValueError, match="Multi-module MTP with prefix caching requires"):
        small = HcKVCacheConfig(num_blocks=10, kv_cache_groups=[HcKVCacheGroupSpec(["f"], HcFullAttentionSpec(block_size=4))])
        KVCacheManager033(small, 200, 4, 4, use_eagle=True, num_prefill_lookahead=8)


def test_deferred_free_refuses_blocks_it_did_not_hand_out() -> None:
    m = KVCacheManager033(_hc_config(10), 200, BS, BS)
    a, b = HcRequest("a", list(range(40)), BS), HcRequest("b", list(range(100, 120)), BS)
    m.allocate_slots(a, 40)
    m.allocate_slots(b, 20)
    popped = m.pop_blocks_for_free(a)
    assert [x.block_id for x in popped] == [1, 2, 3] and not m.has_request("a")
    held = m.get_block_ids("b")[0]
    before = (m.free_queue(), m.num_free_blocks)
    with pytest.raises(ValueError, match="not held by a popped request"):
        m.block_pool.free_blocks([popped[0], held[0]])
    with pytest.raises(ValueError, match="not held by a popped request"):
        m.block_pool.free_blocks([popped[0], popped[0]])
    assert (m.free_queue(), m.num_free_blocks) == before
    m.check_invariants()
    m.block_pool.free_blocks(reversed(popped))
    m.check_invariants()
    assert m.num_free_blocks == 7
    with pytest.raises(ValueError):
        m.block_pool.free_blocks(popped)


# -- against vLLM 0.33.0 -------------------------------------------------------


@pytest.fixture(scope="module")
def v33() -> Any:
    import os

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request, RequestStatus

    init_none_hash(sha256)

    class NS:
        pass

    ns = NS()
    ns.Manager = VllmManager
    ns.status = RequestStatus

    def config(num_blocks: int) -> Any:
        spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
        return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])

    def request(rid: str, tokens: list[int], lookahead: int = 0, **kw: Any) -> Any:
        r = Request(request_id=rid, prompt_token_ids=tokens, sampling_params=SamplingParams(max_tokens=8),
                    pooling_params=None, block_hasher=get_request_block_hasher(BS, sha256, lookahead), **kw)
        return r

    ns.config, ns.request = config, request
    return ns


def _ids(blocks: Any) -> Any:
    return None if blocks is None else blocks.get_block_ids()


def _free_queue(m: Any) -> list[int]:
    if isinstance(m, KVCacheManager033):
        return m.free_queue()
    return [b.block_id for b in m.block_pool.free_block_queue.get_all_free_blocks()]


def _events(m: Any) -> list[Any]:
    return [(type(e).__name__, *(getattr(e, f) for f in type(e).__struct_fields__)) for e in m.take_events()]


def _both(v33: Any, num_blocks: int, **kw: Any) -> list[Any]:
    return [v33.Manager(v33.config(num_blocks), 400, BS, BS, **kw), KVCacheManager033(v33.config(num_blocks), 400, BS, BS, **kw)]


def _run(v33: Any, script: Any, num_blocks: int = 10, **kw: Any) -> list[Any]:
    """`script(m, log)` on vLLM's manager and on hybridcache's; the logs
    must be equal entry by entry. Returns the log."""
    logs = []
    for m in _both(v33, num_blocks, **kw):
        log: list[Any] = []
        script(m, log)
        logs.append(log)
    assert len(logs[0]) == len(logs[1])
    for i, (a, b) in enumerate(zip(*logs)):
        assert a == b, f"entry {i}: vLLM {a!r} != hybridcache {b!r}"
    return logs[0]


@V033
@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("events", [False, True])
def test_free_order_hits_stats_and_events(v33: Any, caching: bool, events: bool) -> None:
    def script(m: Any, log: list[Any]) -> None:
        r0 = v33.request("r0", list(range(40)))
        blocks, n, boundary = m.get_computed_blocks(r0)
        log.append((_ids(blocks), n, boundary))
        log.append(_ids(m.allocate_slots(r0, 40, n, blocks)))
        m.record_prefix_cache_stats(r0, n)
        m.free(r0)
        log.append(_free_queue(m))
        r1 = v33.request("r1", list(range(40)))
        blocks, n, boundary = m.get_computed_blocks(r1)
        m.record_prefix_cache_stats(r1, n)
        log.append((_ids(blocks), n, boundary, m.usage))
        log.append(_ids(m.allocate_slots(r1, 40 - n, n, blocks)))
        stats = m.make_prefix_cache_stats()
        log.append((stats.requests, stats.queries, stats.hits, stats.reset))
        log.append((m.take_new_block_ids(), m.get_num_common_prefix_blocks("r1"), _events(m)))
        popped = m.pop_blocks_for_free(r1)
        log.append(([b.block_id for b in popped], _free_queue(m), m.block_pool.get_num_free_blocks()))
        m.block_pool.free_blocks(reversed(popped))
        log.append((_free_queue(m), m.reset_prefix_cache(), _events(m)))
        log.append(m.make_prefix_cache_stats().reset)

    _run(v33, script, enable_caching=caching, enable_kv_cache_events=events, log_stats=True)


@V033
def test_watermark_gates_waiting_requests_only(v33: Any) -> None:
    def script(m: Any, log: list[Any]) -> None:
        run = v33.request("run", list(range(48)))
        log.append(_ids(m.allocate_slots(run, 48)))  # 3 blocks of 9 usable
        run.status = v33.status.RUNNING
        wait = v33.request("wait", list(range(100, 164)))  # 4 blocks, 6 free, watermark 3
        log.append(_ids(m.allocate_slots(wait, 64, has_scheduled_reqs=True)))
        log.append(_ids(m.allocate_slots(wait, 64, has_scheduled_reqs=False)))
        run.num_computed_tokens = 48
        run.append_output_token_ids(7)
        log.append(_ids(m.allocate_slots(run, 1)))

    log = _run(v33, script, num_blocks=10, watermark=0.3)
    assert log[1] is None and log[2] is not None  # the watermark decided


@V033
def test_adopting_hits_without_new_tokens(v33: Any) -> None:
    def script(m: Any, log: list[Any]) -> None:
        a = v33.request("a", list(range(40)))
        m.allocate_slots(a, 40)
        b = v33.request("b", list(range(40)))
        blocks, n, _ = m.get_computed_blocks(b)
        log.append(_ids(m.allocate_slots(b, 0, n, blocks)))
        log.append((m.get_block_ids("b"), m.block_pool.get_num_free_blocks()))
        with pytest.raises(ValueError, match="num_new_tokens must be greater than 0"):
            m.allocate_slots(v33.request("c", list(range(5))), 0)

    _run(v33, script)


@V033
def test_lookahead_hashes_cap_what_is_cached(v33: Any) -> None:
    def script(m: Any, log: list[Any]) -> None:
        r = v33.request("r", list(range(48)), lookahead=1)  # the third block waits for a token
        m.allocate_slots(r, 48)
        probe = v33.request("p", list(range(48)) + [5], lookahead=1)
        log.append(m.get_computed_blocks(probe)[1])
        r.num_computed_tokens = 48
        r.append_output_token_ids(5)
        m.allocate_slots(r, 1)
        # The same id, a new request: its hashes are read afresh.
        probe = v33.request("p", list(range(48)) + [5, 6], lookahead=1)
        log.append(m.get_computed_blocks(probe)[1])
        log.append(_events(m))

    log = _run(v33, script, enable_kv_cache_events=True, num_hash_lookahead_tokens=1)
    assert log[0] < log[1]  # the capped block was cached once its hash came


@V033
def test_reused_hits_are_reported_in_full_mode(v33: Any) -> None:
    def script(m: Any, log: list[Any]) -> None:
        a = v33.request("a", list(range(40)))
        m.allocate_slots(a, 40)
        m.take_events()
        b = v33.request("b", list(range(40)))
        b.kv_cache_report_mode = "full"
        blocks, n, _ = m.get_computed_blocks(b)
        log.append((n, _events(m)))

    log = _run(v33, script, enable_kv_cache_events=True)
    assert log[0][0] == 32 and log[0][1]  # a hit, and its events


@V033
def test_scheduler_views(v33: Any) -> None:
    m = KVCacheManager033(v33.config(10), 400, BS, BS)
    v = v33.Manager(v33.config(10), 400, BS, BS)
    for x in (m, v):
        r = v33.request("a", list(range(40)))
        x.allocate_slots(r, 40)
    for view in (lambda x: x.coordinator.single_type_managers[0].block_size,
                 lambda x: dict(x.coordinator.single_type_managers[0].num_cached_block),
                 lambda x: x.coordinator.enable_partial_hash_hits,
                 lambda x: x.mamba_shared_prefix_checkpoint,
                 lambda x: x.block_pool.hash_block_size,
                 lambda x: x.get_block_ids_for_computed_tokens("a", 17),
                 lambda x: x.estimate_cached_tokens(v33.request("a", list(range(40)))),
                 lambda x: x.take_kv_cache_block_copies(),
                 lambda x: x.take_boundary_state_offloads(),
                 lambda x: x.coordinator.get_num_blocks_to_allocate("z", 64, ((),), 0, 0, 0, 64)):
        assert view(m) == view(v)
    assert _native.NativeManager.profile.__get__(m) == "partial-block-hits"


@V033
@pytest.mark.parametrize("rate", [1.0, 0.3])
def test_metrics_collector_gets_vllm_calls(v33: Any, rate: float) -> None:
    import random

    from hybridcache_dev.block_metrics import observe, recording_collector

    def script(m: Any, log: list[Any]) -> None:
        collector = m.metrics_collector
        random.seed(7)
        reqs = [v33.request(f"r{i}", list(range(i % 2 * 500, i % 2 * 500 + 40 + 16 * i))) for i in range(5)]
        for r in reqs:
            blocks, n, _ = m.get_computed_blocks(r)
            m.allocate_slots(r, r.num_tokens - n, n, blocks)
            log.append(observe(collector))
        for r in reqs[:3]:
            m.free(r)
        m.evict_blocks({1, 2, 9})
        log.append(observe(collector))
        for r in reqs[3:]:
            m.free(r)
        log.append((m.reset_prefix_cache(), observe(collector)))

    logs = []
    for cls in (v33.Manager, KVCacheManager033):
        log: list[Any] = []
        script(cls(v33.config(40), 400, BS, BS, metrics_collector=recording_collector(rate)), log)
        logs.append(log)
    assert logs[0] == logs[1]
    assert any(calls for calls, _, _ in logs[0][:-1])


def test_bad_input_to_the_0_33_calls() -> None:
    """The calls 0.33.0 added refuse bad arguments with a clear error and
    leave the manager as it was."""
    m = KVCacheManager033(_hc_config(10), 200, BS, BS)
    r = HcRequest("a", list(range(40)), BS)
    assert m.pop_blocks_for_free(HcRequest("unknown", [1], BS)) == []
    assert m.estimate_cached_tokens(HcRequest("unknown", [1], BS)) == 0
    with pytest.raises(ValueError, match="max_cache_hit_length must be >= 0"):
        m.get_computed_blocks(r, -1)
    with pytest.raises(TypeError, match="max_cache_hit_length must be an int"):
        m.get_computed_blocks(r, "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="skip_zeroing_group_ids: group 5 out of range"):
        m.allocate_slots(r, 40, skip_zeroing_group_ids=(5,))
    with pytest.raises(TypeError, match="skip_zeroing_group_ids must be an iterable"):
        m.allocate_slots(r, 40, skip_zeroing_group_ids=5)
    with pytest.raises(TypeError, match="has_scheduled_reqs must be a bool"):
        m.allocate_slots(r, 40, has_scheduled_reqs="x")
    assert m.num_free_blocks == 9 and not m.has_request("a")
    assert m.allocate_slots(r, 40).get_block_ids() == ([1, 2, 3],)
    with pytest.raises(TypeError, match="block_id must be an int"):
        m.block_pool.free_blocks([object()])
    with pytest.raises(ValueError, match="block_id must be >= 0"):
        m.block_pool.free_blocks([10**20])
    with pytest.raises(ValueError, match="not a multiple of the block size"):
        m.truncate_computed_blocks(m.get_blocks("a"), 17)
    assert m.get_block_ids("a") == ([1, 2, 3],) and m.num_free_blocks == 6
    m.check_invariants()


@V033
@pytest.mark.parametrize("eagle", ["off", "flagged-groups-off", "on"])
@pytest.mark.parametrize("retention", [None, 0, 32])
def test_sliding_window_mla_retention_and_junction(v33: Any, retention: int | None, eagle: str) -> None:
    """Full attention + SlidingWindowMLASpec (0.33.0's sparse retention: the
    replay boundaries and a shared-prefix junction are kept): hits, the
    junction `get_computed_blocks` reports, window frees, events and the
    free queue, against vLLM; EAGLE off, groups flagged `is_eagle_group`
    with `use_eagle` off (lookahead hashes: nothing dropped), and on."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowMLASpec

    def config() -> Any:
        full = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
        swa = SlidingWindowMLASpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=20)
        flagged = eagle != "off"
        return KVCacheConfig(num_blocks=40, kv_cache_tensors=[], prefix_cache_retention_interval=retention,
                             kv_cache_groups=[KVCacheGroupSpec(["f"], full, is_eagle_group=flagged),
                                              KVCacheGroupSpec(["s"], swa, is_eagle_group=flagged)])

    def script(m: Any, log: list[Any], seen: dict[str, list[int]]) -> None:
        c = m.coordinator
        log.append((type(c).__name__, c.full_attention_group_id, c.group_block_sizes, c.retention_interval))
        shared = list(range(100))
        for i, tail in enumerate((list(range(500, 530)), list(range(600, 650)), list(range(700, 720)))):
            r = v33.request(f"r{i}", shared + tail)
            blocks, n, boundary = m.get_computed_blocks(r)
            r.shared_prefix_boundary = boundary
            seen["hits"].append(n)
            seen["boundaries"].append(boundary)
            log.append((_ids(blocks), n, boundary))
            log.append(_ids(m.allocate_slots(r, len(r.all_token_ids) - n, n, blocks)))
            r.num_computed_tokens = len(r.all_token_ids)
            r.append_output_token_ids(1)
            log.append(_ids(m.allocate_slots(r, 1)))
            ids = m.get_block_ids(r.request_id)
            seen["window_nulls"].append(list(ids[1]).count(0))
            log.append((ids, _events(m), _free_queue(m)))
            m.free(r)
            log.append((_free_queue(m), _events(m)))

    logs, seens = [], []
    kw = dict(enable_kv_cache_events=True, use_eagle=eagle == "on")
    for m in (v33.Manager(config(), 400, BS, BS, **kw), KVCacheManager033(config(), 400, BS, BS, **kw)):
        log: list[Any] = []
        seen: dict[str, list[int]] = {"hits": [], "boundaries": [], "window_nulls": []}
        script(m, log, seen)
        logs.append(log)
        seens.append(seen)
    for i, (a, b) in enumerate(zip(*logs)):
        assert a == b, f"entry {i}: vLLM {a!r} != hybridcache {b!r}"
    assert seens[0] == seens[1]
    # The windows freed blocks; the later requests hit the shared prefix.
    assert all(n > 0 for n in seens[0]["window_nulls"]) and seens[0]["hits"][0] == 0 and seens[0]["hits"][2] > 0, seens[0]
    if retention == 0 and eagle != "on":
        # Only the replay boundary was kept: the second request misses, and
        # the junction it reports (96) is what lets the third one hit.
        assert seens[0]["hits"][1] == 0 and seens[0]["boundaries"][1] == 96, seens[0]


@V033
def test_mixed_precision_cache_records_blocks_for_zeroing(v33: Any) -> None:
    """A float32 full-attention group beside a bfloat16 sliding window:
    0.33.0 records every attention group's new blocks for worker-side
    zeroing (`take_new_block_ids`), skips the groups an async load writes
    (`skip_zeroing_group_ids`) and re-records on `record_blocks_for_zeroing`."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

    def config() -> Any:
        full = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
        swa = SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.bfloat16, sliding_window=20)
        return KVCacheConfig(num_blocks=40, kv_cache_tensors=[],
                             kv_cache_groups=[KVCacheGroupSpec(["f"], full), KVCacheGroupSpec(["s"], swa)])

    def script(m: Any, log: list[Any]) -> None:
        r0 = v33.request("r0", list(range(70)))
        log.append(_ids(m.allocate_slots(r0, 70)))
        log.append(m.take_new_block_ids())
        m.record_blocks_for_zeroing("r0", 2 * BS)
        log.append(m.take_new_block_ids())
        # External tokens loaded asynchronously into group 1 only.
        r1 = v33.request("r1", list(range(100, 164)))
        log.append(_ids(m.allocate_slots(r1, 0, num_external_computed_tokens=48, delay_cache_blocks=True,
                                         skip_zeroing_group_ids=(1,))))
        log.append(m.take_new_block_ids())
        m.record_blocks_for_zeroing("nobody", 0)
        log.append(m.take_new_block_ids())

    assert config().needs_kv_cache_zeroing
    logs = []
    for m in (v33.Manager(config(), 400, BS, BS), KVCacheManager033(config(), 400, BS, BS)):
        log: list[Any] = []
        script(m, log)
        logs.append(log)
    assert logs[0] == logs[1]
    assert logs[0][1] and logs[0][2] and logs[0][4], logs[0]
