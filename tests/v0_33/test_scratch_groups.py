"""vLLM 0.33.0's groups outside the classic attention types on hybridcache's
0.33.0 facade, call by call against vLLM 0.33.0's own `KVCacheManager`:
circular buffers (one ring block per request, never cached), groups out of
prefix caching (a bounded-replay sliding window: no hits, no caching, frees
as a sliding window), R-SWA (full attention freeing the decode gap after the
prompt, given `num_prompt_tokens`) and sliding windows' extra retained
tokens; then a fuzz slice of the mixes (`hybridcache_dev/scratch_groups.py`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hybridcache_dev import oracle

pytestmark = pytest.mark.vllm("0.33.0")
oracle.module_needs_vllm("0.33.0")

from hybridcache_dev import fuzz  # noqa: E402
from hybridcache.releases.v0_33.manager import KVCacheManager033  # noqa: E402
from hybridcache_dev import scratch_groups  # noqa: E402
from hybridcache.tools.compare import norm_allocated, norm_blocks, pool_state  # noqa: E402
from hybridcache_dev.fuzz_setup import Group, Setup  # noqa: E402
from hybridcache_dev.release_api import release  # noqa: E402

API = release("0.33.0")


def _setup(groups: tuple[Group, ...], sbs: int, hbs: int, num_blocks: int = 24, caching: bool = True,
           events: bool = True) -> Setup:
    return Setup(mix="test", caching=caching, groups=groups, scheduler_block_size=sbs, hash_block_size=hbs,
                 num_blocks=num_blocks, use_eagle=False, events=events, log_stats=False, max_model_len=1024,
                 release="0.33.0")


class Pair:
    """vLLM 0.33.0's manager and the facade on one setup, the same requests."""

    def __init__(self, s: Setup) -> None:
        self.s = s
        self.ref = API.build_reference(s)
        self.ours = API.build_facade(s)
        assert isinstance(self.ours, KVCacheManager033)
        self.reqs: dict[str, tuple[Any, Any]] = {}

    def request(self, rid: str, tokens: list[int]) -> None:
        self.reqs[rid] = (API.make_request(self.s, rid, tokens), API.make_request(self.s, rid, tokens))

    def both(self, fn: Callable[[Any, Any], Any], norm: Callable[[Any], Any] = lambda x: x) -> Any:
        """`fn(manager, its request objects)` on both; equal results and state."""
        a = norm(fn(self.ref, 0))
        b = norm(fn(self.ours, 1))
        assert a == b
        assert pool_state(self.ref) == pool_state(self.ours)
        ev_a = [API.norm_event(e) for e in self.ref.take_events()]
        assert ev_a == [API.norm_event(e) for e in self.ours.take_events()]
        for rid in self.reqs:
            assert self.ref.get_block_ids(rid) == self.ours.get_block_ids(rid)
        return a

    def r(self, rid: str, side: int) -> Any:
        return self.reqs[rid][side]

    def lookup(self, rid: str) -> tuple[Any, ...]:
        """Both managers' hits (their own block objects) and the hit length."""
        a, n, _ = self.ref.get_computed_blocks(self.r(rid, 0))
        b, n2, _ = self.ours.get_computed_blocks(self.r(rid, 1))
        assert (norm_blocks(a), n) == (norm_blocks(b), n2)
        return a, b, n

    def allocate(self, rid: str, new: int, hit: tuple[Any, ...] | None = None, **kw: Any) -> Any:
        def call(m: Any, side: int) -> Any:
            r = self.r(rid, side)
            if hit is not None:
                kw.update(num_new_computed_tokens=hit[2], new_computed_blocks=hit[side])
            out = m.allocate_slots(r, new, **kw)
            if out is not None:
                r.num_computed_tokens += new + kw.get("num_new_computed_tokens", 0) + kw.get(
                    "num_external_computed_tokens", 0)
            return out

        out = self.both(call, norm_allocated)
        return out

    def decode(self, rid: str, steps: int) -> None:
        for _ in range(steps):
            for side in (0, 1):
                self.r(rid, side).append_output_token_ids([7])
            self.allocate(rid, 1)


def _tokens(n: int, base: int = 0) -> list[int]:
    return [base + i for i in range(n)]


# -- circular buffers ----------------------------------------------------------


def test_ring_block_claimed_once_never_cached_never_hit() -> None:
    p = Pair(_setup((Group("full", 4), Group("circ", 8)), 8, 4))
    p.request("a", _tokens(20))
    first = p.allocate("a", 20)
    assert len(first[0][1]) == 1  # the ring, with the first chunk's blocks
    p.decode("a", 9)
    # Decodes add full-attention blocks only; the ring stays.
    assert len(p.ours.get_block_ids("a")[1]) == 1
    # A later request hits full attention only: its ring slot stays empty.
    p.request("b", _tokens(20))
    hit = p.lookup("b")
    assert hit[2] == 16 and norm_blocks(hit[1])[1] == ()
    p.allocate("b", 4, hit)
    assert p.both(lambda m, side: m.estimate_cached_tokens(p.r("b", side))) == 16
    ring = p.ours.get_block_ids("b")[1][0]
    for rid in ("a", "b"):
        p.both(lambda m, side, rid=rid: m.free(p.r(rid, side)))
    # Freed last and unhashed: b's ring is the next block handed out.
    assert p.ours.block_pool.free_block_queue.get_all_free_blocks()[0].block_id == ring


def test_ring_claimed_by_external_tokens_and_not_zeroed() -> None:
    p = Pair(_setup((Group("full", 4), Group("circ", 4, half=True)), 4, 4))
    assert p.ours.coordinator.single_type_managers[1].block_size == 4
    p.request("a", _tokens(30))
    p.allocate("a", 6, num_external_computed_tokens=8)
    assert len(p.ours.get_block_ids("a")[1]) == 1
    # Mixed precision: zeroing records the full-attention blocks, never the ring.
    ids = p.both(lambda m, side: list(m.take_new_block_ids()))
    assert p.ours.get_block_ids("a")[1][0] not in ids and ids
    p.both(lambda m, side: m.pop_blocks_for_free(p.r("a", side)),
           lambda bs: tuple(b.block_id for b in bs))


def test_ring_with_no_room_and_truncated_lookups() -> None:
    p = Pair(_setup((Group("full", 4), Group("circ", 8)), 8, 4, num_blocks=6))
    p.request("a", _tokens(16))
    p.allocate("a", 16)
    p.decode("a", 2)
    p.request("b", _tokens(40, 100))
    assert p.allocate("b", 40) is None  # 10 + 1 blocks needed, 0 free
    p.both(lambda m, side: m.free(p.r("a", side)))
    p.request("c", _tokens(16))
    a, b, n = p.lookup("c")
    assert n == 8
    cut = p.both(lambda m, side: m.truncate_computed_blocks((a, b)[side], 8), norm_blocks)
    assert cut == ((a.get_block_ids()[0][0], a.get_block_ids()[0][1]), ())


# -- groups out of prefix caching ------------------------------------------------


def test_bounded_replay_window_is_never_cached_nor_hit() -> None:
    p = Pair(_setup((Group("full", 4), Group("swbr", 4, 6)), 8, 4))
    assert not p.ours.coordinator.single_type_managers[1].kv_cache_spec.prefix_cacheable
    p.request("a", _tokens(33))
    p.allocate("a", 33)
    p.decode("a", 6)
    # Frees as a sliding window: leading nulls in group 1.
    ids = p.ours.get_block_ids("a")
    assert ids[1][0] == 0 and 0 not in ids[0]
    # Cached in full attention only: the hit is full attention's, group 1 empty.
    p.request("b", _tokens(33))
    a, b, n = p.lookup("b")
    assert n == 32 and norm_blocks(b)[1] == ()
    p.allocate("b", 1, (a, b, n))
    assert p.both(lambda m, side: m.estimate_cached_tokens(p.r("b", side))) == 32


# -- R-SWA ---------------------------------------------------------------------------


def test_rswa_frees_the_gap_between_prompt_and_window() -> None:
    p = Pair(_setup((Group("rswa", 4, 6),), 4, 4))
    p.request("a", _tokens(10))
    p.allocate("a", 10)
    p.decode("a", 14)  # 24 computed: the window starts at 18, the gap is block 3
    ids = p.ours.get_block_ids("a")[0]
    assert ids[:3] != [0, 0, 0] and 0 not in ids[:3] and ids[3] == 0
    p.decode("a", 8)  # 32 computed, freed at 31 processed: the window starts at 25
    ids = p.ours.get_block_ids("a")[0]
    assert ids[3:6] == [0, 0, 0] and 0 not in ids[:3] + ids[6:]
    # Without the prompt length nothing leaves (full attention's rule).
    p.both(lambda m, side: m.remove_skipped_blocks("a", 40, None))
    # Given it, the gap up to the window of 40 tokens goes (tail first);
    # the coordinator's call is the manager's.
    p.both(lambda m, side: m.coordinator.remove_skipped_blocks("a", 40, 10))
    assert p.ours.get_block_ids("a")[0][3:8] == [0] * 5
    p.both(lambda m, side: m.remove_skipped_blocks("nobody", 40, 10))
    p.both(lambda m, side: m.free(p.r("a", side)))


def test_rswa_with_sliding_window_and_hits() -> None:
    p = Pair(_setup((Group("rswa", 4, 4), Group("sw", 4, 5)), 8, 4))
    p.request("a", _tokens(17))
    p.allocate("a", 17)
    p.decode("a", 12)
    p.request("b", _tokens(17))
    a, b, n = p.lookup("b")
    assert n == 16
    p.allocate("b", 1, (a, b, n))
    p.decode("b", 12)
    for rid in ("a", "b"):
        p.both(lambda m, side, rid=rid: m.free(p.r(rid, side)))


# -- extra retained tokens ---------------------------------------------------------------


def test_extra_retained_tokens_delay_window_frees() -> None:
    p = Pair(_setup((Group("full", 4), Group("swx", 4, 4, num_spec=5)), 8, 4))
    p.request("a", _tokens(12))
    p.allocate("a", 12)
    # 12 computed: a plain window of 4 frees blocks 0..1; 5 more retained keep block 1.
    p.allocate("a", 1)
    assert p.ours.get_block_ids("a")[1][:2] == [0, p.ours.get_block_ids("a")[1][1]]
    assert p.ours.get_block_ids("a")[1][1] != 0


# -- the fuzz ---------------------------------------------------------------------------


@pytest.mark.parametrize("mix", scratch_groups.MIXES)
def test_fuzz_slice(mix: str) -> None:
    f = fuzz.run_fuzz(ops=6000, seed=33, mixes=(mix,), ops_per_setup=1000, release_name="0.33.0",
                      candidate="hybridcache")
    assert [r for r in f.reports] == []
    assert (f.divergences, f.invariant_violations, f.reference_errors) == (0, 0, 0)
    assert f.setups >= 6 and f.calls.get("unsupported_setups", 0) == 0
    assert f.allocations > 1000 and f.none_allocations > 0 and f.hit_tokens > 0


def test_layouts_with_no_prefix_cacheable_group() -> None:
    """Several groups, caching on, none prefix-cacheable: vLLM 0.33.0's hybrid
    coordinator asserts; the facade refuses at construction. Caching off (or
    one such group) builds, as vLLM's does."""
    s = _setup((Group("circ", 4), Group("swbr", 4, 6)), 4, 4)
    with pytest.raises(AssertionError, match="at least one cacheable group"):
        API.build_reference(s)
    with pytest.raises(ValueError, match="at least one prefix-cacheable group"):
        API.build_facade(s)
    for s in (_setup((Group("circ", 4), Group("swbr", 4, 6)), 4, 4, caching=False),
              _setup((Group("swbr", 4, 6),), 4, 4)):
        p = Pair(s)
        p.request("a", _tokens(20))
        p.allocate("a", 20)
        p.decode("a", 8)
        p.request("b", _tokens(20))
        assert p.lookup("b")[2] == 0
