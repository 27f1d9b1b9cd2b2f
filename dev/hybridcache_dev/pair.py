"""A vLLM release's own manager beside hybridcache's facade for it, on one
setup, driven call by call: the tests' harness for scenarios written by
hand (the fuzz drives the same pair at random).

Each request has one request object per side (the managers write to them);
`both` makes a call on each side and compares the answers, then the pool:
its free count, or, `strict`, every block's count and hash, the free
queue's order, every table and the events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridcache.tools.compare import norm_allocated, norm_blocks, pool_state
from hybridcache_dev.fuzz_setup import Setup
from hybridcache_dev.release_api import release
from hybridcache_dev.drive import build_reference

REF, OURS = 0, 1  # the sides, as `both` passes them


def block_ids_of(x: Any) -> Any:
    """A lookup's or allocation's block ids; other answers as they are."""
    return x.get_block_ids() if hasattr(x, "get_block_ids") else x


class ManagerPair:
    """vLLM's manager (`ref`) and hybridcache's facade (`ours`) for
    `setup.release`, built from `setup`, every answer compared."""

    def __init__(self, setup: Setup, strict: bool = False) -> None:
        self.s = setup
        # The release's API, which builds vLLM's own requests.
        self.api: Any = release(setup.release)
        if not hasattr(self.api, "make_request"):
            raise ValueError(f"ManagerPair: release {setup.release} builds no vLLM requests here")
        self.ref = build_reference(self.api, setup)
        self.ours = self.api.build_facade(setup)
        self.strict = strict
        self.reqs: dict[str, tuple[Any, Any]] = {}

    def request(self, rid: str, tokens: list[int]) -> None:
        self.reqs[rid] = (self.api.make_request(self.s, rid, tokens), self.api.make_request(self.s, rid, tokens))

    def req(self, rid: str, side: int) -> Any:
        """The request object of `rid` on one side."""
        return self.reqs[rid][side]

    def both(self, call: Callable[[Any, int], Any], norm: Callable[[Any], Any] = block_ids_of) -> Any:
        """`call(manager, side)` on each side, the answers compared after
        `norm`; the reference's answer."""
        theirs, ours = call(self.ref, REF), call(self.ours, OURS)
        assert norm(ours) == norm(theirs)
        self.check_pool()
        return theirs

    def check_pool(self) -> None:
        if not self.strict:
            assert self.ours.block_pool.get_num_free_blocks() == self.ref.block_pool.get_num_free_blocks()
            return
        assert pool_state(self.ours) == pool_state(self.ref)
        self.events()
        for rid in self.reqs:
            assert self.ours.get_block_ids(rid) == self.ref.get_block_ids(rid)

    def events(self) -> list[Any]:
        """The events since the last take, compared; the reference's."""
        theirs, ours = self.ref.take_events(), self.ours.take_events()
        assert [self.api.norm_event(e) for e in ours] == [self.api.norm_event(e) for e in theirs]
        return theirs

    def lookup(self, rid: str) -> tuple[Any, Any, int]:
        """`get_computed_blocks` on each side: (reference blocks, ours, hit tokens)."""
        theirs, hit, _ = self.ref.get_computed_blocks(self.req(rid, REF))
        ours, our_hit, _ = self.ours.get_computed_blocks(self.req(rid, OURS))
        assert (norm_blocks(ours), our_hit) == (norm_blocks(theirs), hit)
        return theirs, ours, hit

    def allocate(self, rid: str, new: int, hit: tuple[Any, Any, int] | None = None) -> Any:
        """`allocate_slots(request, new)`, with a lookup's hit if given; the
        requests' computed counts advanced."""
        def call(m: Any, side: int) -> Any:
            r = self.req(rid, side)
            kw = {} if hit is None else dict(num_new_computed_tokens=hit[2], new_computed_blocks=hit[side])
            out = m.allocate_slots(r, new, **kw)
            assert out is not None
            r.num_computed_tokens += new + (hit[2] if hit else 0)
            return out

        return self.both(call, norm_allocated)

    def admit(self, rid: str, num_new: int | None = None) -> int:
        """A lookup, then the allocation of the rest of the prompt (or
        `num_new` tokens) after the hit; the hit tokens."""
        hit = self.lookup(rid)
        n = self.req(rid, REF).num_tokens - hit[2] if num_new is None else num_new
        self.allocate(rid, n, hit)
        return hit[2]

    def step(self, rid: str, n: int) -> None:
        """A decode of `n` tokens."""
        self.allocate(rid, n)

    def copies(self) -> list[tuple[int, int]]:
        """The step's copy-on-write pairs, compared, then given back as the
        scheduler does (both ends were retained)."""
        (t_copies, t_kept), (o_copies, o_kept) = (self.ref.take_kv_cache_block_copies(),
                                                  self.ours.take_kv_cache_block_copies())
        pairs = [(c.src_block_id, c.dst_block_id) for c in t_copies]
        assert [(c.src_block_id, c.dst_block_id) for c in o_copies] == pairs
        assert all(type(c).__name__ == "KVCacheBlockCopy" for c in o_copies)
        assert [b.block_id for b in o_kept] == [b.block_id for b in t_kept] == [b for p in pairs for b in p]
        self.check_pool()
        self.ref.block_pool.free_blocks(t_kept)
        self.ours.block_pool.free_blocks(o_kept)
        self.check_pool()
        return pairs

    def new_step(self) -> None:
        self.both(lambda m, side: m.new_step_starts())


__all__ = ["ManagerPair", "REF", "OURS", "block_ids_of"]
