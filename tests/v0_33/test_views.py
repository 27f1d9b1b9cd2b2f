"""What vLLM 0.33.0's own tests read or assign on the manager's internals,
through hybridcache's views, against vLLM 0.33.0 on the same calls:
`coordinator.retention_interval` assigned right after construction (vLLM's
coordinator reads it at every call; hybridcache builds its core anew while
nothing has happened yet), Mamba's `_checkpoints`, the hit alignments, one
block object per block (`is`), and `req_to_blocks[req]` lists that stay live
across allocations."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.vllm("0.33.0")

vllm = pytest.importorskip("vllm", reason="needs vLLM 0.33.0 (the 0.33 venv)")
from hybridcache_dev.oracle import module_needs_vllm  # noqa: E402

module_needs_vllm("0.33.0")

from hybridcache_dev.fuzz_setup import Group, Setup  # noqa: E402
from hybridcache_dev.release_api import release  # noqa: E402

API = release("0.33.0")
PROMPT = list(range(2000, 2150))  # 150 tokens: several Mamba blocks of 32


def _setup(eagle: bool = False) -> Setup:
    # Mamba align of 32 over hash blocks of 16 beside full attention of 16:
    # partial hash hits, prefill checkpoints at 16-token alignment.
    return Setup(mix="full_mamba_wide", caching=True,
                 groups=(Group("full", 16), Group("mamba", 32, mode="align", checkpoint=16)),
                 scheduler_block_size=32, hash_block_size=16, num_blocks=60, use_eagle=eagle,
                 events=True, log_stats=False, release="0.33.0", max_model_len=512)


def _state(m: Any, rids: list[str]) -> Any:
    """Everything the test compares after each call."""
    mamba = m.coordinator.single_type_managers[1]
    return (m.block_pool.get_num_free_blocks(),
            [b.block_id for b in m.block_pool.free_block_queue.get_all_free_blocks()],
            {r: m.get_blocks(r).get_block_ids() for r in rids if r in mamba.req_to_blocks},
            dict(mamba._checkpoints))


def _run(m: Any, s: Setup, retention: Any) -> list[Any]:
    """Assigns the interval, then two requests over one prompt in chunks of
    64 tokens; what each step shows."""
    m.coordinator.retention_interval = retention
    seen = [m.coordinator.retention_interval]
    reqs = {rid: API.make_request(s, rid, PROMPT) for rid in ("a", "b")}
    for rid, r in reqs.items():
        blocks, hit, boundary = m.get_computed_blocks(r)
        r.shared_prefix_boundary = boundary
        seen.append((rid, hit, boundary))
        computed = hit
        while computed < r.num_tokens:
            n = min(64, r.num_tokens - computed)
            out = m.allocate_slots(r, n, hit, blocks) if computed == hit else m.allocate_slots(r, n)
            assert out is not None
            r.num_computed_tokens = computed = computed + n
            m.new_step_starts()
            copies, kept = m.take_kv_cache_block_copies()
            m.block_pool.free_blocks(kept)
            seen.append((rid, computed, [(c.src_block_id, c.dst_block_id) for c in copies],
                         m.take_boundary_state_offloads(), _state(m, list(reqs))))
        seen.append([API.norm_event(e) for e in m.take_events()])
    return seen


@pytest.mark.parametrize("retention", [None, 0, 32, 64])
@pytest.mark.parametrize("eagle", [False, True])
def test_retention_interval_assigned_after_construction_as_vllm(retention: Any, eagle: bool) -> None:
    s = _setup(eagle)
    assert _run(API.build_facade(s), s, retention) == _run(API.build_reference(s), s, retention)


def test_retention_interval_assignment_refused_once_the_manager_served_a_request() -> None:
    s = _setup()
    m = API.build_facade(s)
    r = API.make_request(s, "a", PROMPT)
    assert m.allocate_slots(r, 64) is not None
    before = _state(m, ["a"])
    with pytest.raises(ValueError, match="only before the manager's first request"):
        m.coordinator.retention_interval = 0
    with pytest.raises(TypeError, match="must be None or an int"):
        m.coordinator.retention_interval = "0"
    with pytest.raises(ValueError, match=">= 0"):
        m.coordinator.retention_interval = -32
    assert _state(m, ["a"]) == before and m.coordinator.retention_interval is None
    # Freed and uncached again is not enough: the free queue's order moved.
    m.free(r)
    with pytest.raises(ValueError, match="only before the manager's first request"):
        m.coordinator.retention_interval = 0


def test_hit_alignments_as_vllm() -> None:
    s = _setup()
    ours, theirs = API.build_facade(s), API.build_reference(s)
    assert ours.coordinator._cache_hit_alignment_tokens == theirs.coordinator._cache_hit_alignment_tokens == 16
    assert ours.coordinator.scheduler_block_size == theirs.coordinator.scheduler_block_size
    assert [m.cache_hit_alignment_tokens for m in ours.coordinator.single_type_managers] == \
        [m.cache_hit_alignment_tokens for m in theirs.coordinator.single_type_managers]
    with pytest.raises(AttributeError, match="_checkpoints"):
        ours.coordinator.single_type_managers[0]._checkpoints  # noqa: B018  # full attention has none


def _identities(m: Any, s: Setup) -> list[bool]:
    """Which reads of the same block give the same object."""
    r = API.make_request(s, "a", PROMPT)
    assert m.allocate_slots(r, 96) is not None
    held = m.coordinator.single_type_managers[0].req_to_blocks["a"]
    first = held[0]
    result = m.get_blocks("a").blocks[0]
    cached = m.block_pool.get_cached_block(r.block_hashes[0], [0])
    out = [result[0] is first, cached is not None and cached[0] is first,
           m.block_pool.blocks[first.block_id] is first, len(held)]
    r.num_computed_tokens = 96
    assert m.allocate_slots(r, 40) is not None
    # The list handed out before is vLLM's live one: it grew in place.
    out += [len(held), held[-1].block_id == m.get_blocks("a").get_block_ids()[0][-1]]
    ids = [b.block_id for b in held]
    unread = m.coordinator.single_type_managers[0].req_to_blocks["a"]
    m.free(r)
    # After the free a held list keeps what the request held (read or not).
    out += [[b.block_id for b in held] == ids, [b.block_id for b in unread] == ids]
    return out


def test_one_object_per_block_and_live_req_to_blocks_as_vllm() -> None:
    s = _setup()
    got = _identities(API.build_facade(s), s)
    assert got == _identities(API.build_reference(s), s)
    assert got[:3] == [True, True, True] and got[3] < got[4]
