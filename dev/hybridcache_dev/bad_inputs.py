"""Bad inputs for the fuzz (hybridcache only): bad counts, unknown ids,
foreign KVCacheBlocks, wrong hash types, out-of-range eviction ids, ... Each
must raise a clear ValueError / TypeError / KeyError / NotImplementedError
(never a PanicException or RuntimeError) and leave the state exactly as it was
(free queue, ref counts, block hashes, every request's block ids, known
hashes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridcache.request import Request
from hybridcache_dev.fuzz_setup import ACCEPTED_ERRORS, BadInputFailure, Figures, Setup


class BadInputs:
    """The driver's bad-input operation (a mixin of `fuzz_driver.Driver`)."""

    hc: Any
    other: Any
    s: Setup
    f: Figures
    ghosts: set[str]

    def rids(self) -> list[str]:
        raise NotImplementedError

    def pick(self, c: Any, state: str | None = None) -> Any:
        raise NotImplementedError

    def note(self, text: str) -> None:
        raise NotImplementedError

    # -- bad inputs (hybridcache only) ----------------------------------------------

    def snapshot(self) -> Any:
        n = self.hc._native
        nb = self.s.num_blocks
        rids = self.rids() + sorted(self.ghosts) + ["nobody"]
        return (
            tuple(n.free_queue()),
            tuple(n.ref_cnt(b) for b in range(nb)),
            tuple(n.block_hash(b) for b in range(nb)),
            tuple(tuple(map(tuple, n.get_block_ids(r))) for r in rids),
            tuple(n.num_known_hashes(r) for r in rids),
            tuple(n.align_state(r, g) for r in rids for g in range(len(self.s.groups))),
            n.num_requests,
            n.num_free_blocks,
        )

    def _bad_cases(self, c: Any) -> list[tuple[str, Callable[[], Any]]]:
        hc, s = self.hc, self.s
        q = self.pick(c)
        running = self.pick(c, "running")
        r = q.req if q is not None else Request("solo", list(range(9)), s.hash_block_size)
        fresh = Request(f"fresh{c.randint(0, 9)}", list(range(c.randint(1, 30))), s.hash_block_size)
        ngroups = len(s.groups)
        from hybridcache import KVCacheBlocks

        def clone(req: Request, **changes: Any) -> Request:
            x = Request(req.request_id, req.all_token_ids[: req.num_prompt_tokens], s.hash_block_size)
            x._all_token_ids = list(req.all_token_ids)
            x.block_hashes = list(req.block_hashes)
            x.num_computed_tokens = req.num_computed_tokens
            for k, v in changes.items():
                setattr(x, k, v)
            return x

        big = c.choice((2**63, 2**64, 10**30))
        neg = -c.randint(1, 2**40)
        cases: list[tuple[str, Callable[[], Any]]] = [
            ("negative num_new_tokens", lambda: hc.allocate_slots(r, neg)),
            ("zero new tokens, no external", lambda: hc.allocate_slots(r, 0)),
            ("negative lookahead", lambda: hc.allocate_slots(r, 1, num_lookahead_tokens=-1)),
            ("negative external", lambda: hc.allocate_slots(fresh, 1, num_external_computed_tokens=neg)),
            ("negative reserved", lambda: hc.allocate_slots(r, 1, reserved_blocks=-2)),
            ("negative encoder tokens", lambda: hc.allocate_slots(r, 1, num_encoder_tokens=-3)),
            ("huge num_new_tokens", lambda: hc.allocate_slots(r, big)),
            ("huge lookahead", lambda: hc.allocate_slots(r, 1, num_lookahead_tokens=big)),
            ("float count", lambda: hc.allocate_slots(r, 2.0)),
            ("str count", lambda: hc.allocate_slots(r, "3")),
            ("None count", lambda: hc.allocate_slots(r, None)),
            ("negative num_computed_tokens", lambda: hc.allocate_slots(clone(r, num_computed_tokens=-1), 1)),
            ("out-of-range evict id", lambda: hc.evict_blocks([1, s.num_blocks + c.randint(0, 5)])),
            ("negative evict id", lambda: hc.evict_blocks([neg])),
            ("huge evict id", lambda: hc.evict_blocks([big])),
            ("str evict id", lambda: hc.evict_blocks(["1"])),
            ("negative remove_skipped total", lambda: hc.remove_skipped_blocks(r.request_id, neg)),
            ("negative cache_blocks count", lambda: hc.cache_blocks(r, neg)),
            ("non-str request id", lambda: hc.allocate_slots(clone(r, request_id=7), 1)),
            ("new_computed_blocks of wrong type", lambda: hc.allocate_slots(fresh, 1, 0, ([1],) * ngroups)),
            ("new_computed_blocks with wrong group count", lambda: hc.allocate_slots(fresh, 1, 0, KVCacheBlocks(([1],) * (ngroups + 1), hc))),
            ("new_computed_blocks id out of range", lambda: hc.allocate_slots(fresh, 1, 0, KVCacheBlocks(([s.num_blocks + 3],) + ([],) * (ngroups - 1), hc))),
            ("new_computed_blocks negative id", lambda: hc.allocate_slots(fresh, 1, 0, KVCacheBlocks(([-5],) + ([],) * (ngroups - 1), hc))),
            ("foreign KVCacheBlocks", lambda: hc.allocate_slots(fresh, 1, 0, KVCacheBlocks(([1],) + ([],) * (ngroups - 1), self.other))),
        ]
        if s.caching:  # without prefix caching hashes and lookups are not read
            # Hashes are read only where a full block is cached or looked up.
            fresh = Request(fresh.request_id, list(range(2 * s.hash_block_size + c.randint(0, 20))), s.hash_block_size)
            cases += [
                ("str block hashes", lambda: hc.allocate_slots(clone(fresh, block_hashes=["x"] * (fresh.num_tokens // s.hash_block_size + 1)), fresh.num_tokens)),
                ("int block hashes", lambda: hc.get_computed_blocks(clone(fresh, block_hashes=[1, 2, 3]))),
                ("list block hashes", lambda: hc.allocate_slots(clone(fresh, block_hashes=[[0, 1]] * 4), fresh.num_tokens)),
                ("get_computed_blocks with no tokens", lambda: hc.get_computed_blocks(clone(fresh, _all_token_ids=[], block_hashes=[]))),
                ("cache_blocks of unknown request", lambda: hc.cache_blocks(Request("unknown-req", list(range(16)), s.hash_block_size), 8)),
            ]
        if running is not None and s.caching:
            run_req, own = running.req, hc.get_blocks(running.req.request_id)
            if any(own.get_block_ids()):
                cases.append(("new_computed_blocks for a running request", lambda: hc.allocate_slots(run_req, 1, 0, own)))
        if s.caching and fresh.num_tokens >= 2 * s.hash_block_size:
            short = clone(fresh, block_hashes=fresh.block_hashes[:1])
            cases.append(("caching beyond known hashes", lambda: hc.allocate_slots(short, fresh.num_tokens)))
        if running is not None and s.caching:
            bs = s.groups[0].block_size * s.dcp * s.pcp  # a block's tokens, as the manager sizes it
            too_far = (len(hc.get_block_ids(running.req.request_id)[0]) + 1) * bs
            cases.append(("cache_blocks beyond allocated blocks", lambda: hc.cache_blocks(running.req, too_far)))
        return cases

    def op_bad_input(self, c: Any) -> None:
        cases = self._bad_cases(c)
        name, call = c.choice(cases)
        before = self.snapshot()
        self.f.bad_inputs += 1
        try:
            result = call()
        except ACCEPTED_ERRORS as e:
            if type(e).__name__ == "PanicException":
                raise BadInputFailure(f"bad input {name!r}: PanicException {e}") from e
            err: Exception | None = e
        except BaseException as e:  # PanicException derives from BaseException
            raise BadInputFailure(f"bad input {name!r} raised {type(e).__name__}: {e}") from e
        else:
            err = None
        after = self.snapshot()
        if err is None and result is None and after == before and "hashes" in name:
            # Hashes are read only where caching may need them: a call that
            # fails for lack of blocks first never reads them (nor does vLLM).
            self.f.bad_inputs_unread += 1
            return
        if err is None:
            raise BadInputFailure(f"bad input {name!r} was accepted (returned {result!r})")
        if after != before:
            raise BadInputFailure(f"bad input {name!r} ({type(err).__name__}: {err}) changed the state")
        self.note(f"bad input {name}: {type(err).__name__}")

