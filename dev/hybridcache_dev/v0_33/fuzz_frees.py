"""How the 0.33.0 fuzz driver (`fuzz_driver.SchedulerDriver`) frees, as vLLM
0.33.0's scheduler does: `free(request)`, or deferred frees
(`pop_blocks_for_free`, then `block_pool.free_blocks` with each manager's
own `KVCacheBlock`s a step later), preemption, finishing (a connector's
`remove_skipped_blocks` first), and frees of requests that never held blocks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridcache_dev.fuzz_driver import Seq
from hybridcache_dev.release_api import norm_block_list


@dataclass
class Deferred:
    """Blocks popped by `pop_blocks_for_free` (or CoW retentions), per manager."""

    what: str
    blocks: tuple[list[Any], list[Any]] = field(default_factory=lambda: ([], []))


class SchedulerFrees:
    """The free operations of `SchedulerDriver` (a mixin: `both`, `own`, `pick`,
    `status`, `deferred`, `seqs` and the setup are the driver's)."""

    def _free_blocks(self: Any, q: Seq, c: Any = None) -> None:
        r: Any = q.req
        if c is not None and self.s.deferred_frees and c.chance(0.7):
            # An in-flight step may still write them (scheduler L3084-3093).
            popped = self.both(f"pop_blocks_for_free({r.request_id})", lambda m: m.pop_blocks_for_free(r),
                               norm_block_list)
            self.f.count("pop_blocks_for_free")
            if popped[0]:
                # Each manager's own KVCacheBlock objects, freed later.
                self.deferred.append(Deferred(f"request {r.request_id}", (list(popped[0]), list(popped[1]))))
        else:
            self.both(f"free({r.request_id})", lambda m: m.free(r))

    def _preempt(self: Any, q: Any, c: Any = None) -> None:
        self._free_blocks(q, c)
        r: Any = q.req
        q.state = "waiting"
        r.status = self.status("PREEMPTED")
        r.num_computed_tokens = 0
        r.spec_token_ids = []
        r.num_output_placeholders = 0
        for step in q.pending:
            step[3] = True  # in flight still, its output now stale
        r.num_preemptions += 1
        self.f.preemptions += 1

    def _finish(self: Any, q: Any, c: Any = None) -> None:
        r: Any = q.req
        if c is not None and q.state == "running" and c.chance(0.2):
            # A KV connector's finish (scheduler L3369) frees the skipped blocks first.
            n = max(0, r.num_computed_tokens - r.num_in_flight_tokens)
            self.both(f"remove_skipped_blocks({r.request_id}, {n}, {r.num_prompt_tokens})",
                      lambda m: m.remove_skipped_blocks(request_id=r.request_id, processed_computed_tokens=n,
                                                        num_prompt_tokens=r.num_prompt_tokens))
        r.status = self.status("FINISHED_STOPPED")
        if c is None:
            self.both(f"free({r.request_id})", lambda m: m.free(r))
        else:
            self._free_blocks(q, c)
        self.seqs.remove(q)
        self.finished_ids.append(r.request_id)
        self.note(f"finish {r.request_id}")

    def op_preempt(self: Any, c: Any) -> None:
        running = [q for q in self.seqs if q.state == "running"]
        if not running:
            return
        storm = c.chance(0.3)
        for q in reversed(running):
            self.note(f"preempt {q.req.request_id}")
            self._preempt(q, c)
            if not storm:
                break

    def op_finish(self: Any, c: Any) -> None:
        q = self.pick(c)
        if q is not None:
            self._finish(q, c)

    def op_free_unknown(self: Any, c: Any) -> None:
        # An aborted request that never got blocks.
        ghost = self.api.make_request(self.s, f"ghost{c.randint(0, 3)}", [1, 2, 3])
        self.both("free(<no blocks>)", lambda m: m.free(ghost))

    def op_drain_deferred(self: Any, c: Any) -> None:
        """A step's output is processed: the oldest deferred frees go back."""
        for _ in range(c.randint(1, max(1, len(self.deferred)))):
            if not self.deferred:
                break
            d = self.deferred.pop(0)
            self.f.count("deferred_free_blocks")
            self.note(f"free_blocks({d.what})")
            self.both(f"block_pool.free_blocks(<{d.what}>)",
                      lambda m: m.block_pool.free_blocks(reversed(self.own(m, d.blocks))))
