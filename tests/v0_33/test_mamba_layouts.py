"""Two Mamba align layouts of vLLM 0.33.0 on hybridcache's 0.33.0 facade,
call by call against vLLM 0.33.0's own `KVCacheManager`:

- a Mamba block wider than the hash block beside a group 0.33.0 looks up
  at block granularity only (a sliding window whose block is not the hash
  block): partial hash hits are off, so hits land on scheduler blocks, yet
  the prompt's boundary state is still keyed inside its Mamba block (under
  EAGLE the cacheable count is not rounded) and copied on write;
- Mamba beside a circular buffer (out of prefix caching, so partial hits
  stay on): a hit inside a Mamba block beside the ring.

Then a fuzz slice of each (`full_coarse_mamba`, `full_mamba_circ`)."""

from __future__ import annotations

from typing import Any

import pytest

from hybridcache_dev import oracle

pytestmark = pytest.mark.vllm("0.33.0")
oracle.module_needs_vllm("0.33.0")

from hybridcache_dev import fuzz  # noqa: E402
from hybridcache.tools.compare import norm_allocated, norm_blocks  # noqa: E402
from hybridcache_dev.fuzz_setup import Group, Setup  # noqa: E402
from hybridcache_dev.pair import ManagerPair  # noqa: E402


def Pair(s: Setup) -> ManagerPair:
    """vLLM 0.33.0's manager and the facade; after every call the pool,
    the events and the tables compared too."""
    return ManagerPair(s, strict=True)


def _setup(groups: tuple[Group, ...], sbs: int, hbs: int, use_eagle: bool = False) -> Setup:
    return Setup(mix="test", caching=True, groups=groups, scheduler_block_size=sbs, hash_block_size=hbs,
                 num_blocks=40, use_eagle=use_eagle, events=True, log_stats=False, max_model_len=1024,
                 release="0.33.0")


def _tokens(n: int, base: int = 1000) -> list[int]:
    return [base + i for i in range(n)]


def test_block_granular_group_turns_hits_off_but_states_are_keyed_inside_blocks() -> None:
    """Full attention of 4, a sliding window of 8, Mamba of 16 over hash
    blocks of 4, EAGLE: 0.33.0 turns partial hits off (the window's block is
    not the hash block). A's chunks of 16 and 8 tokens cache Mamba's state
    at 16 (a whole block) and at its prompt boundary 24 (30 tokens, EAGLE
    drops a hash block) inside Mamba block 1; A's next allocation copies
    the latter and moves its key. B, a longer prompt, hits on scheduler
    blocks only: 16 tokens, not 24."""
    p = Pair(_setup((Group("full", 4), Group("sw", 8, 8), Group("mamba", 16, mode="align")), 16, 4,
                    use_eagle=True))
    assert p.ours.coordinator.enable_partial_hash_hits is False
    assert p.ref.coordinator.enable_partial_hash_hits is False
    p.request("a", _tokens(30))
    p.allocate("a", 16)
    p.new_step()
    p.allocate("a", 8)
    p.new_step()
    p.allocate("a", 6)
    pairs = p.copies()
    assert len(pairs) == 1 and pairs[0][0] == p.ref.get_block_ids("a")[2][1]
    offloads = p.both(lambda m, side: m.take_boundary_state_offloads())
    assert (2, pairs[0][1], 24) in offloads["a"]
    p.new_step()
    p.request("b", _tokens(30) + _tokens(10, 5000))
    hit = p.lookup("b")
    assert hit[2] == 16
    p.allocate("b", 40 - hit[2], hit)
    p.copies()
    for rid in ("a", "b"):
        p.both(lambda m, side, rid=rid: m.free(p.req(rid, side)))


def test_mamba_beside_a_circular_buffer_keeps_partial_hits() -> None:
    """Full attention of 4, Mamba of 16, a ring of 8 (not prefix-cacheable,
    so it does not turn partial hits off): A caches its boundary 28 inside
    Mamba block 1 and copies it on its next step; B, the same prompt and
    more, hits 28 tokens inside that block and copies its tail; each
    request holds its own ring block."""
    p = Pair(_setup((Group("full", 4), Group("mamba", 16, mode="align"), Group("circ", 8)), 16, 4))
    assert p.ours.coordinator.enable_partial_hash_hits is True
    p.request("a", _tokens(30))
    p.allocate("a", 28)
    p.new_step()
    p.allocate("a", 2)
    assert len(p.copies()) == 1
    p.new_step()
    p.request("b", _tokens(30) + _tokens(6, 5000))
    hit = p.lookup("b")
    assert hit[2] == 28
    p.allocate("b", 36 - 28, hit)
    pairs = p.copies()
    assert len(pairs) == 1
    ring = [p.ref.get_block_ids(rid)[2] for rid in ("a", "b")]
    assert len(ring[0]) == len(ring[1]) == 1 and ring[0] != ring[1]
    for rid in ("a", "b"):
        p.both(lambda m, side, rid=rid: m.free(p.req(rid, side)))


def test_connector_hit_with_mamba_lagging_inside_its_block() -> None:
    """The connector's per-group lookup keeps each group's own hit: full
    attention 28 tokens, Mamba 24 (A's copied boundary state, keyed inside
    Mamba block 1). With external tokens behind it the scheduler admits
    that hit as it is; the Mamba block keyed below the hit is A's state,
    not a fabricated one."""
    p = Pair(_setup((Group("full", 4), Group("mamba", 16, mode="align"), Group("circ", 8)), 16, 4))
    p.request("a", _tokens(26))
    p.allocate("a", 24)
    p.new_step()
    p.allocate("a", 2)
    p.copies()
    for _ in range(8):
        for side in (0, 1):
            p.reqs["a"][side].append_output_token_ids([7])
        p.allocate("a", 1)
        p.new_step()
    p.request("b", _tokens(26) + [7] * 4 + _tokens(8, 5000))
    a, n, _, diverged = p.ref.get_computed_blocks_for_connector(p.reqs["b"][0])
    b, n2, _, diverged2 = p.ours.get_computed_blocks_for_connector(p.reqs["b"][1])
    assert (norm_blocks(b), n2, diverged2) == (norm_blocks(a), n, diverged)
    assert (n, diverged) == (28, True) and len(a.blocks[1]) == 2

    def admit(m: Any, side: int) -> Any:
        r = p.reqs["b"][side]
        out = m.allocate_slots(r, 4, num_new_computed_tokens=28, new_computed_blocks=(a, b)[side],
                               num_external_computed_tokens=4)
        r.num_computed_tokens = 36
        return out

    assert p.both(admit, norm_allocated) is not None
    p.copies()


@pytest.mark.parametrize("mix", ["full_coarse_mamba", "full_mamba_circ"])
def test_fuzz_slice(mix: str) -> None:
    f = fuzz.run_fuzz(ops=6000, seed=7, mixes=(mix,), ops_per_setup=1000, release_name="0.33.0",
                      candidate="hybridcache")
    assert f.reports == []
    assert (f.divergences, f.invariant_violations, f.reference_errors) == (0, 0, 0)
    assert f.setups >= 6 and f.calls.get("unsupported_setups", 0) == 0
    assert f.allocations > 1000 and f.hit_tokens > 0
