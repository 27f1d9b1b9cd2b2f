"""The read-only queries the 0.33.0 fuzz driver (`fuzz_driver.SchedulerDriver`)
compares between vLLM's manager and the candidate: what vLLM 0.33.0's
scheduler, engine and connectors ask of the manager besides allocating and
freeing (stats, block tables, cached-token estimates, the offloading
connector's per-group hits)."""

from __future__ import annotations

from typing import Any

from hybridcache import releases
from hybridcache.tools.compare import norm_blocks
from hybridcache_dev.fuzz_setup import Divergence
from hybridcache_dev.release_api import norm_block_list


class SchedulerQueries:
    """The query operations of `SchedulerDriver` (a mixin: `both`, `pick`, `rids`,
    `ref`, `connector` are the driver's)."""

    def op_common_prefix(self: Any, c: Any) -> None:
        q = self.pick(c, "running")
        rid = q.req.request_id if q is not None else "nobody"
        if not releases.require(self.api.name, "the fuzz").common_prefix_blocks:
            # Gone (0.34.0): gone from the candidate too.
            assert not hasattr(self.ref, "get_num_common_prefix_blocks")
            if hasattr(self.hc, "get_num_common_prefix_blocks"):
                raise Divergence("the candidate has get_num_common_prefix_blocks, which this release removed")
            return
        self.both(f"get_num_common_prefix_blocks({rid})", lambda m: list(m.get_num_common_prefix_blocks(rid)))

    def op_queries(self: Any, c: Any) -> None:
        self.both("make_prefix_cache_stats", lambda m: m.make_prefix_cache_stats(), self.api.norm_stats)
        rid = c.choice(self.rids() + ["nobody"])
        self.both(f"get_blocks({rid})", lambda m: m.get_blocks(rid), norm_blocks)
        q = self.pick(c, "running")
        if q is not None:
            r: Any = q.req
            self.both(f"estimate_cached_tokens({r.request_id})", lambda m: m.estimate_cached_tokens(r))
            n = c.randint(0, r.num_computed_tokens)
            self.both(f"get_block_ids_for_computed_tokens({r.request_id}, {n})",
                      lambda m: m.get_block_ids_for_computed_tokens(request_id=r.request_id, num_computed_tokens=n),
                      lambda x: tuple(map(tuple, x)))
        if releases.require(self.api.name, "the fuzz").cached_tokens_probe:
            # Cache-aware admission's probe, of a waiting or a running request.
            q = self.pick(c, c.choice(("waiting", "running")))
            if q is not None:
                p: Any = q.req
                self.both(f"get_num_cached_tokens({p.request_id})", lambda m: m.get_num_cached_tokens(p))

    def op_per_group_hits(self: Any, c: Any) -> None:
        """The offloading connector's bound (`_max_loadable_tokens`): each
        group's own hit, behind `isinstance(coordinator, HybridKVCacheCoordinator)`."""
        from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator

        # Connectors only: vLLM 0.33.0 hashes without lookahead with one
        # (its per-group sliding-window lookup indexes past lookahead hashes).
        if not self.connector or not isinstance(self.ref.coordinator, HybridKVCacheCoordinator):
            return
        q = self.pick(c)
        if q is None:
            return
        r = q.req
        n = c.randint(0, r.num_tokens - 1)
        self.both(
            f"coordinator.find_longest_cache_hit_per_group({r.request_id}, {n})",
            lambda m: (isinstance(m.coordinator, HybridKVCacheCoordinator),
                       m.coordinator.find_longest_cache_hit_per_group(r.block_hashes, n)),
            lambda x: (x[0], tuple(norm_block_list(g) for g in x[1][0]), tuple(x[1][1])),
        )
        self.f.count("per_group_hit_queries")
