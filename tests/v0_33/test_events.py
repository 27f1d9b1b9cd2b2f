"""KV events in vLLM 0.33.0's shape (`EventBuilder(..., release="0.33.0")`),
field by field identical to the events vLLM 0.33.0's own KVCacheManager /
BlockPool produce for the same operations: full attention, prefix caching
on, LoRA / cache salt / multimodal extra keys (published untagged), the
request's session id, lookahead tokens, a partial block's span; and a
msgspec round trip of both. Needs vLLM 0.33.0 (the 0.33 venv)."""

from __future__ import annotations

import random
from typing import Any

import pytest

vllm = pytest.importorskip("vllm", reason="needs vLLM 0.33.0 (the 0.33 venv)")
from hybridcache_dev.oracle import module_needs_vllm  # noqa: E402

module_needs_vllm("0.33.0")
torch = pytest.importorskip("torch")
msgspec = pytest.importorskip("msgspec")

from vllm.distributed import kv_events as ev  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402
from vllm.v1.core.block_pool import BlockPool  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from hybridcache import events as hc_events  # noqa: E402
from hybridcache.events import EventBuilder  # noqa: E402
from hybridcache_dev import configs  # noqa: E402

BS = 4
KIND = ("full_attention", None)


def _request(rid: str, tokens: list[int], rng: random.Random, hasher: Any, *, lora: bool, salt: str | None,
             mm: bool) -> Request:
    features = None
    if mm:
        features, pos = [], rng.randrange(0, 3)
        while pos < len(tokens) - 2 and len(features) < 3:
            length = rng.choice([1, 3, 6, 9])
            features.append(MultiModalFeatureSpec(data=None, modality="image", identifier=f"img-{pos}",
                                                  mm_position=PlaceholderRange(offset=pos, length=length)))
            pos += length + rng.choice([0, 2, 5])
    return Request(request_id=rid, prompt_token_ids=tokens, sampling_params=SamplingParams(max_tokens=64),
                   pooling_params=None, arrival_time=0.0, cache_salt=salt, mm_features=features,
                   lora_request=LoRARequest("adapter-a", 3, "/tmp/a") if lora else None,
                   session_id=f"session-{rid}" if rng.random() < 0.7 else None, block_hasher=hasher)


def _fields(e: Any) -> list[tuple[str, Any]]:
    return [(f, getattr(e, f)) for f in type(e).__struct_fields__]


def _assert_same(ours: list[Any], theirs: list[Any]) -> None:
    assert [type(e) for e in ours] == [type(e) for e in theirs]
    for a, b in zip(ours, theirs):
        assert _fields(a) == _fields(b)


def _round_trip(ours: list[Any], theirs: list[Any]) -> None:
    """The same bytes on the wire as vLLM's, and back: the same events
    (nested key tuples come back as lists, as msgspec decodes `Any`)."""
    data = msgspec.msgpack.encode(ev.KVEventBatch(ts=1.0, events=ours))
    assert data == msgspec.msgpack.encode(ev.KVEventBatch(ts=1.0, events=theirs))
    back = msgspec.msgpack.decode(data, type=ev.KVEventBatch)
    assert [type(e) for e in back.events] == [type(e) for e in ours]
    assert msgspec.msgpack.encode(back) == data
    # 0.33.0 dropped array_like: each event is a map tagged with its type.
    for e in ours:
        raw = msgspec.msgpack.decode(msgspec.msgpack.encode(e))
        assert isinstance(raw, dict) and raw["type"] == type(e).__name__


def _managers(num_blocks: int) -> tuple[Any, Any]:
    groups = (configs.full(BS),)
    theirs = VllmManager(configs.vllm_kv_cache_config(groups, num_blocks), max_model_len=4096,
                         scheduler_block_size=BS, hash_block_size=BS, enable_caching=True,
                         enable_kv_cache_events=True)
    ours = configs.hybridcache_manager(configs.hybridcache_kv_cache_config(groups, num_blocks),
                                       dict(max_model_len=4096, scheduler_block_size=BS, hash_block_size=BS,
                                            enable_caching=True, enable_kv_cache_events=True))
    # What the 0.33 facade builds: the events in 0.33.0's shape.
    ours._event_builder = EventBuilder([KIND], release="0.33.0")
    return ours, theirs


@pytest.mark.parametrize("seed", range(6))
def test_manager_events_identical_to_vllm_033(seed: int) -> None:
    rng = random.Random(seed)
    kv_cache_utils.init_none_hash(sha256)
    hasher = kv_cache_utils.get_request_block_hasher(BS, sha256)
    ours, theirs = _managers(num_blocks=40)
    prefixes = [[rng.randrange(1000) for _ in range(BS * rng.randint(1, 4))] for _ in range(3)]
    seen: list[Any] = []
    for i in range(14):
        # Prompt + decodes end on a block boundary, so every block freed is
        # cached (both releases then append it to the free queue's tail).
        n_decode = rng.randint(1, 6)
        prompt = list(rng.choice(prefixes)) + [rng.randrange(1000) for _ in range(rng.randint(1, 12))]
        prompt += [7] * ((-(len(prompt) + n_decode)) % BS)
        req = _request(f"r{i}", prompt, rng, hasher, lora=rng.random() < 0.3,
                       salt=rng.choice([None, None, "s1"]), mm=rng.random() < 0.4)
        blocks_t, hit_t, _ = theirs.get_computed_blocks(req)
        blocks_o, hit_o = ours.get_computed_blocks(req)
        assert hit_o == hit_t
        n_new = req.num_tokens - hit_t
        got_t = theirs.allocate_slots(req, n_new, hit_t, blocks_t)
        got_o = ours.allocate_slots(req, n_new, hit_o, blocks_o)
        if got_t is None:
            assert got_o is None
            continue
        req.num_computed_tokens = req.num_tokens
        for _ in range(n_decode):
            req.append_output_token_ids(rng.randrange(1000))
            assert (ours.allocate_slots(req, 1) is None) == (theirs.allocate_slots(req, 1) is None)
            req.num_computed_tokens += 1
        t_events, o_events = theirs.take_events(), ours.take_events()
        _assert_same(o_events, t_events)
        seen += t_events
        _round_trip(o_events, t_events)
        theirs.free(req)
        ours.free(req)
    assert theirs.reset_prefix_cache() and ours.reset_prefix_cache()
    t_events, o_events = theirs.take_events(), ours.take_events()
    _assert_same(o_events, t_events)
    assert isinstance(t_events[-1], ev.AllBlocksCleared)
    _round_trip(o_events, t_events)
    # The run covered what the 0.33 shape adds or changes.
    stored = [e for e in seen if isinstance(e, ev.BlockStored)]
    assert any(isinstance(e, ev.BlockRemoved) for e in seen)
    assert any(e.session_id for e in stored) and any(e.lora_name for e in stored)
    assert any(k is not None for e in stored for k in (e.extra_keys or []))


def _pool_case(lookahead: int, seed: int) -> tuple[list[Any], list[Any]]:
    """vLLM 0.33.0's BlockPool caching one request's full blocks in two
    calls (with lookahead hashes), then evicting them; the builder on the
    same raw data the core hands over for those calls."""
    rng = random.Random(seed)
    kv_cache_utils.init_none_hash(sha256)
    hasher = kv_cache_utils.get_request_block_hasher(BS, sha256, lookahead)
    tokens = [rng.randrange(1000) for _ in range(BS * 6 + lookahead + rng.randrange(BS))]
    req = _request("r", tokens, rng, hasher, lora=True, salt="salt", mm=True)
    pool = BlockPool(12, True, BS, enable_kv_cache_events=True, num_hash_lookahead_tokens=lookahead)
    blocks = pool.get_new_blocks(7)
    full = len(req.block_hashes)
    cut = full // 2
    builder = EventBuilder([KIND, KIND], release="0.33.0", num_hash_lookahead_tokens=lookahead)
    raw: list[tuple] = []
    for lo, hi in ((0, cut), (cut, full)):
        if hi > lo:
            pool.cache_full_blocks(req, blocks, lo, hi, BS, 1)
            parent = req.block_hashes[lo - 1] if lo else None
            raw.append(("stored", list(req.block_hashes[lo:hi]), parent, lo * BS, hi * BS, BS, 1,
                        list(range(lo, hi))))
    pool.free_blocks(blocks)
    pool.get_new_blocks(11)  # evicts every cached block
    by_external = {kv_cache_utils.maybe_convert_block_hash(h): h for h in req.block_hashes}
    theirs = pool.take_events()
    for e in theirs:  # the manager's take_events annotates the group's spec
        if isinstance(e, ev.BlockStored):
            e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window = KIND
        else:
            raw.append(("removed", by_external[e.block_hashes[0]], 1))
    return builder.build(raw, req), theirs


@pytest.mark.parametrize("lookahead", [0, 1, 3])
@pytest.mark.parametrize("seed", range(4))
def test_pool_events_with_lookahead_identical_to_vllm_033(lookahead: int, seed: int) -> None:
    ours, theirs = _pool_case(lookahead, seed)
    assert any(isinstance(e, ev.BlockRemoved) for e in theirs)
    stored = [e for e in theirs if isinstance(e, ev.BlockStored)]
    assert stored and all((e.lookahead_token_ids is None) == (lookahead == 0) for e in stored)
    _assert_same(ours, theirs)
    _round_trip(ours, theirs)


@pytest.mark.parametrize("lookahead", [0, 2])
def test_reused_hit_event_as_vllm_033_reports_it(lookahead: int) -> None:
    """kv_cache_report_mode="full": a hit's blocks reported again
    (`emit_cached_block_events`): the raw tuple of blocks 0..n, no parent."""
    rng = random.Random(5)
    kv_cache_utils.init_none_hash(sha256)
    hasher = kv_cache_utils.get_request_block_hasher(BS, sha256, lookahead)
    req = _request("h", [rng.randrange(1000) for _ in range(BS * 5 + lookahead)], rng, hasher, lora=True,
                   salt="s", mm=True)
    pool = BlockPool(8, True, BS, enable_kv_cache_events=True, num_hash_lookahead_tokens=lookahead)
    pool.emit_cached_block_events(req, 4, BS, 0)
    theirs = pool.take_events()
    for e in theirs:
        e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window = KIND
    raw = [("stored", list(req.block_hashes[:4]), None, 0, 4 * BS, BS, 0, [0, 1, 2, 3])]
    ours = EventBuilder([KIND], release="0.33.0", num_hash_lookahead_tokens=lookahead).build(raw, req)
    _assert_same(ours, theirs)
    _round_trip(ours, theirs)


def test_partial_block_event_reports_its_span() -> None:
    """0.33.0's cache_partial_block: one hash-block of a larger block, its
    `block_size` the partial span, its parent the hash before it."""
    rng = random.Random(1)
    kv_cache_utils.init_none_hash(sha256)
    hasher = kv_cache_utils.get_request_block_hasher(BS, sha256)
    req = _request("p", [rng.randrange(1000) for _ in range(BS * 5)], rng, hasher, lora=True, salt="s", mm=True)
    pool = BlockPool(8, True, BS, enable_kv_cache_events=True)
    block = pool.get_new_blocks(1)[0]
    pool.cache_partial_block(req, block, 3 * BS, 0, 4 * BS)
    theirs = pool.take_events()
    for e in theirs:
        e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window = KIND
    raw = [("stored", [req.block_hashes[2]], req.block_hashes[1], 2 * BS, 3 * BS, BS, 0, [2])]
    ours = EventBuilder([KIND], release="0.33.0").build(raw, req)
    _assert_same(ours, theirs)
    _round_trip(ours, theirs)


def test_lookalike_classes_have_033s_fields_in_order() -> None:
    import dataclasses

    assert [f.name for f in dataclasses.fields(hc_events.BlockStoredExtras)] == list(ev.BlockStored.__struct_fields__)
    assert [f.name for f in dataclasses.fields(hc_events.BlockRemovedExtras)] == list(ev.BlockRemoved.__struct_fields__)
    assert len(ev.BlockStored.__struct_fields__) == 15
    # With vLLM 0.33.0 installed the builder makes vLLM's own classes.
    assert hc_events.event_classes("0.33.0") == (ev.BlockStored, ev.BlockRemoved, ev.AllBlocksCleared)


def test_builder_rejects_what_a_release_cannot_report() -> None:
    with pytest.raises(ValueError, match="no KV-event shape"):
        EventBuilder([KIND], release="0.30.0")
    with pytest.raises(ValueError, match="0.23.0's events"):
        EventBuilder([KIND], release="0.23.0", num_hash_lookahead_tokens=1)
    with pytest.raises(ValueError, match="num_hash_lookahead_tokens"):
        EventBuilder([KIND], release="0.33.0", num_hash_lookahead_tokens=-1)


def test_a_later_release_row_with_the_same_shape_gets_vllms_own_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A vLLM the table lists with `event_extras` (as a later release that
    keeps 0.33.0's event shape would be) gets vLLM's own event classes; one
    the table does not list gets the look-alikes."""
    import dataclasses

    from hybridcache import releases

    later = dataclasses.replace(releases.of_folder("v0_33"), version="0.99.0", folder="v0_99")
    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    assert hc_events.event_classes("0.33.0")[0] is hc_events.BlockStoredExtras
    monkeypatch.setattr(releases, "RELEASES", releases.RELEASES + (later,))
    assert hc_events.event_classes("0.33.0") == (ev.BlockStored, ev.BlockRemoved, ev.AllBlocksCleared)
