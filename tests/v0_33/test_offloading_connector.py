"""vLLM 0.33.0's offloading connector on hybridcache's manager: it bounds
what it loads by the groups it does not offload, through
`isinstance(coordinator, HybridKVCacheCoordinator)` and
`coordinator.find_longest_cache_hit_per_group` (each group's own hit, not
reconciled). The real connector's code runs against both managers here; the
0.33 fuzz compares the per-group hits on every hybrid setup too."""

from __future__ import annotations

import dataclasses
import os
import random
import types

import pytest

pytestmark = pytest.mark.vllm("0.33.0")

from hybridcache_dev.oracle import module_needs_vllm  # noqa: E402

vllm = module_needs_vllm("0.33.0")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # 0.33.0 infers no device on a CPU machine

from hybridcache_dev.drive import drive  # noqa: E402
from hybridcache_dev.release_api import release  # noqa: E402

API = release("0.33.0")


def _managers(mix: str, seed: int) -> tuple[object, object, object]:
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    from hybridcache.releases.v0_33.manager import KVCacheManager033

    s = dataclasses.replace(API.random_setup(random.Random(seed), mix, True), num_blocks=64, use_eagle=False)
    kw, cfg = API.manager_kwargs(s), API.kv_cache_config(s)
    return s, KVCacheManager(kv_cache_config=cfg, **kw), KVCacheManager033(kv_cache_config=cfg, **kw)


def test_the_coordinator_is_vllms_hybrid_coordinator_only_where_vllms_is() -> None:
    from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator

    for mix in ("full", "full_sw", "full_full_sw", "full_chunked"):
        _, ref, hc = _managers(mix, 3)
        assert isinstance(hc.coordinator, HybridKVCacheCoordinator) == isinstance(ref.coordinator, HybridKVCacheCoordinator)
        assert type(hc.coordinator).__name__ == type(ref.coordinator).__name__
    assert not hasattr(_managers("full", 3)[2].coordinator, "find_longest_cache_hit_per_group")


@pytest.mark.parametrize("mix", ["full_sw", "full_full_sw"])
def test_the_connectors_load_bound_matches_vllm(mix: str) -> None:
    """`OffloadingConnector._max_loadable_tokens` (vLLM's own function) with
    the sliding-window group not offloaded: the bound it computes from each
    manager after the same requests ran and were freed (the window group
    keeps less of the prefix than full attention does)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector

    s, ref, hc = _managers(mix, 11)
    window_groups = tuple(i for i, g in enumerate(s.groups) if g.kind == "sw")
    bounds = []
    for m in (ref, hc):
        rng = random.Random(7)
        prompts = [[rng.randrange(50) for _ in range(rng.randint(20, 60))] for _ in range(6)]
        for i, tokens in enumerate(prompts):
            r = API.make_request(s, f"r{i}", tokens)
            assert m.allocate_slots(r, len(tokens)) is not None
            r.num_computed_tokens = len(tokens)
            m.cache_blocks(r, len(tokens))
            m.free(r)
        connector = types.SimpleNamespace(_bounding_group_ids=window_groups, _kv_cache_manager=m)
        seen = []
        for i, tokens in enumerate(prompts):
            probe = API.make_request(s, f"p{i}", tokens + [99, 98, 97])
            hits = m.coordinator.find_longest_cache_hit_per_group(probe.block_hashes, probe.num_tokens - 1)
            seen.append(([[b.block_id for b in g] for g in hits[0]], hits[1],
                         [OffloadingConnector._max_loadable_tokens(connector, probe, n) for n in (0, 8)]))
        bounds.append(seen)
    assert bounds[0] == bounds[1]
    assert any(b[1][0] != b[1][-1] for b in bounds[0]), "no case where the groups' own hits differ"


def test_per_group_hits_match_vllm_under_random_operations() -> None:
    f = drive(API, [API.random_setup(random.Random(seed), mix, True)
                   for seed, mix in enumerate(["full_sw", "full_full_sw", "full_chunked", "full_full"] * 2)], 600)
    assert (f.divergences, f.invariant_violations, f.reference_errors) == (0, 0, 0), f.reports
    assert f.calls["per_group_hit_queries"] > 20
