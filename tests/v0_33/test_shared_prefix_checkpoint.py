"""vLLM 0.33.0's `enable_mamba_shared_prefix_checkpoint`, hybridcache's
0.33.0 facade against vLLM 0.33.0's own manager on the same calls. With
EAGLE, partial hash hits and no multi-module MTP, a Mamba align group also
keys its running state at the request's shared-prefix junction (the third
value of `get_computed_blocks`, where the scheduler then ends the chunk),
while the prompt chunk reaching it is computed; a sibling then resumes
there instead of a whole Mamba block lower."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

pytestmark = pytest.mark.vllm("0.33.0")

vllm = pytest.importorskip("vllm", reason="needs vLLM 0.33.0 (the 0.33 venv)")
from hybridcache_dev.oracle import module_needs_vllm  # noqa: E402

module_needs_vllm("0.33.0")

from hybridcache_dev.fuzz_setup import Group, Setup  # noqa: E402
from hybridcache_dev.release_api import release  # noqa: E402

API = release("0.33.0")
STEM = list(range(300, 400))


def _setup(**kw: Any) -> Setup:
    s = Setup(mix="mamba_junction", caching=True, groups=(Group("full", 16), Group("mamba", 64, mode="align")),
              scheduler_block_size=64, hash_block_size=16, num_blocks=40, use_eagle=True, events=True,
              log_stats=False, release="0.33.0", spec_tokens=1, prefill_lookahead=1, shared_prefix_checkpoint=True)
    return replace(s, **kw)


class Pair:
    """vLLM 0.33.0's manager and the facade, a request object each, every
    answer, event and free count compared."""

    def __init__(self, s: Setup) -> None:
        self.s = s
        self.theirs, self.ours = API.build_reference(s), API.build_facade(s)
        self.reqs: dict[str, tuple[Any, Any]] = {}

    def request(self, rid: str, tokens: list[int]) -> None:
        self.reqs[rid] = (API.make_request(self.s, rid, tokens), API.make_request(self.s, rid, tokens))

    def both(self, call: Any, rid: str) -> Any:
        (t_req, o_req) = self.reqs[rid]
        t, o = call(self.theirs, t_req), call(self.ours, o_req)
        ids = (lambda x: x.get_block_ids() if hasattr(x, "get_block_ids") else x)
        assert ids(o) == ids(t)
        ev_t, ev_o = self.theirs.take_events(), self.ours.take_events()
        assert [API.norm_event(e) for e in ev_o] == [API.norm_event(e) for e in ev_t]
        assert self.ours.block_pool.get_num_free_blocks() == self.theirs.block_pool.get_num_free_blocks()
        return t

    def lookup(self, rid: str) -> tuple[int, int]:
        """The scheduler's lookup: the junction stored on the request."""
        t_req, o_req = self.reqs[rid]
        (t_blocks, hit, junction), (o_blocks, o_hit, o_junction) = (self.theirs.get_computed_blocks(t_req),
                                                                    self.ours.get_computed_blocks(o_req))
        assert (o_hit, o_junction, o_blocks.get_block_ids()) == (hit, junction, t_blocks.get_block_ids())
        t_req.shared_prefix_boundary = o_req.shared_prefix_boundary = junction
        self._hit = (t_blocks, o_blocks)
        return hit, junction

    def allocate(self, rid: str, n: int, hit: int = 0) -> Any:
        t_req, o_req = self.reqs[rid]
        blocks = dict(zip((id(t_req), id(o_req)), self._hit)) if hit else {}
        out = self.both(lambda m, r: m.allocate_slots(r, n, hit, blocks.get(id(r)), num_lookahead_tokens=1), rid)
        for r in (t_req, o_req):
            r.num_computed_tokens += hit + n
        return out

    def copies(self) -> list[tuple[int, int]]:
        (t_copies, t_kept), (o_copies, o_kept) = (self.theirs.take_kv_cache_block_copies(),
                                                  self.ours.take_kv_cache_block_copies())
        pairs = [(c.src_block_id, c.dst_block_id) for c in t_copies]
        assert [(c.src_block_id, c.dst_block_id) for c in o_copies] == pairs
        self.theirs.block_pool.free_blocks(t_kept)
        self.ours.block_pool.free_blocks(o_kept)
        return pairs

    def new_step(self) -> None:
        for m in (self.theirs, self.ours):
            m.new_step_starts()


@pytest.mark.parametrize(("enable", "kw"), [
    (True, {}),
    (False, {}),
    (True, {"use_eagle": False, "spec_tokens": 0, "prefill_lookahead": 0}),  # no EAGLE groups
    (True, {"prefill_lookahead": 2, "spec_tokens": 2}),  # multi-module MTP re-prefills tokens
    # No partial hash hits: the Mamba block is the hash block.
    (True, {"hash_block_size": 64, "groups": (Group("full", 64), Group("mamba", 64, mode="align"))}),
    (True, {"caching": False, "hash_block_size": 64}),
])
def test_the_flag_is_narrowed_as_vllm_narrows_it(enable: bool, kw: dict[str, Any]) -> None:
    """The manager attribute the scheduler reads to end chunks at junctions."""
    s = _setup(shared_prefix_checkpoint=enable, **kw)
    want = API.build_reference(s).mamba_shared_prefix_checkpoint
    assert API.build_facade(s).mamba_shared_prefix_checkpoint == want
    assert want == (enable and not kw)


def _producer_and_sibling(p: Pair) -> None:
    """`a` caches 96 tokens of the stem; `c` shares 56 of them: full
    attention hits 32 tokens, Mamba nothing, so the hit is 0 and the
    junction 32."""
    p.request("a", STEM[:96] + [1] * 3)
    p.lookup("a")
    p.allocate("a", 99)
    p.request("c", STEM[:56] + [7] * 30)
    assert p.lookup("c") == (0, 32)


def test_a_sibling_resumes_at_the_junction_the_chunk_ended_at() -> None:
    p = Pair(_setup())
    _producer_and_sibling(p)
    # The chunk ends at the junction: Mamba keys its running state there
    # (inside its 64-token block: a producer tail).
    c_state = p.allocate("c", 32).get_block_ids()[1][0]
    p.new_step()
    p.request("d", STEM[:56] + [8] * 30)
    hit, _ = p.lookup("d")
    assert hit == 32 and p.ours.get_computed_blocks(p.reqs["d"][1])[0].get_block_ids()[1] == [c_state]
    # c's next allocation copies its tail away before overwriting it.
    p.allocate("c", 16)
    assert [src for src, _ in p.copies()] == [c_state]


def test_no_key_at_a_junction_the_request_has_computed_past() -> None:
    """Past the junction the running state no longer holds the junction's
    state: a later `cache_blocks` there keys nothing (vLLM bounds it to the
    prompt chunk being computed)."""
    p = Pair(_setup())
    _producer_and_sibling(p)
    p.allocate("c", 48)
    p.both(lambda m, r: m.cache_blocks(r, 32), "c")
    p.new_step()
    p.request("d", STEM[:56] + [8] * 30)
    assert p.lookup("d")[0] == 0


def test_fuzz_slice_junctions() -> None:
    """The 0.33 differential fuzz's junction mix: EAGLE with partial hash
    hits and the flag on, siblings diverging inside Mamba blocks, chunks the
    scheduler's own split ends at junctions, against vLLM 0.33.0."""
    from hybridcache_dev import fuzz

    f = fuzz.run_fuzz(ops=10_000, seed=341, mixes=("mamba_junction",), caching=(True,), ops_per_setup=1000,
                      release_name="0.33.0", candidate="hybridcache")
    assert f.reports == [], "\n\n".join(f.reports)
    assert (f.divergences, f.invariant_violations, f.reference_errors) == (0, 0, 0)
    assert f.calls.get("unsupported_setups", 0) == 0, f.summary()
    assert f.calls.get("shared_prefix_checkpoint_setups", 0) > 0, f.summary()
    assert f.calls.get("chunks_ending_at_junctions", 0) > 0, f.summary()
    assert f.calls.get("cache_blocks_at_computed_junctions", 0) > 0, f.summary()


def _count_junction_reads(req: Any) -> list[int]:
    """Makes `req.shared_prefix_boundary` a property that counts its reads
    (a subclass of the request's class; the value is kept)."""
    reads = [0]
    value = req.__dict__.pop("shared_prefix_boundary", 0)

    class Counting(type(req)):  # type: ignore[misc]
        @property
        def shared_prefix_boundary(self) -> int:
            reads[0] += 1
            return int(self.__dict__["_junction"])

        @shared_prefix_boundary.setter
        def shared_prefix_boundary(self, v: int) -> None:
            self.__dict__["_junction"] = v

    req.__class__ = Counting
    req.shared_prefix_boundary = value
    return reads


@pytest.mark.parametrize("enable", [True, False])
def test_the_junction_is_read_only_where_a_rule_uses_it(enable: bool) -> None:
    """The facade reads `request.shared_prefix_boundary` only where a rule
    uses its value: this checkpoint (and a prefill checkpoint's reuse,
    sparse retention's replay tails). Without one, no allocation or
    `cache_blocks` call reads it (vLLM 0.33.0 reads it whenever it caches a
    full block, and uses it only under sparse retention); the answers are
    vLLM's either way (`Pair.both`)."""
    p = Pair(_setup(shared_prefix_checkpoint=enable))
    p.request("a", STEM[:60])
    theirs, ours = (_count_junction_reads(r) for r in p.reqs["a"])
    p.lookup("a")
    p.allocate("a", 32)
    p.allocate("a", 28)
    for tok in range(50):
        for r in p.reqs["a"]:
            r.append_output_token_ids(tok)
        p.allocate("a", 1)
        p.both(lambda m, r: m.cache_blocks(r, r.num_computed_tokens), "a")
        p.new_step()
    assert theirs[0] > 0
    assert (ours[0] > 0) == enable, ours
