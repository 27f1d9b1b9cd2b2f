"""Mistakes a new user makes with hybridcache's own classes, from the
documentation alone: requests hashed at another block size than the manager's,
a scheduler block size that is not the groups' LCM, and a loop that never
calls `new_step_starts()`. Each gets a clear error, never a wrong answer."""

from __future__ import annotations

from typing import Any

import pytest
from hostile_world import FLAVOURS, in_child, lookup, manager_class


def _manager(flavour: str, block: int, num_blocks: int = 64, groups: Any = None, **kw: Any) -> Any:
    from hybridcache import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    groups = groups or [KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=block))]
    return manager_class(flavour)(KVCacheConfig(num_blocks, [], groups), 1024, block, block, **kw)


def case_hash_size_mismatch(flavour: str, manager_block: int, request_block: int) -> None:
    """A request hashed at `request_block` tokens against a manager hashing
    at `manager_block`: refused (ValueError naming hash_block_size), or a
    hit no longer than the tokens really shared."""
    from hybridcache import Request

    m = _manager(flavour, manager_block)
    shared = 3 * max(manager_block, request_block)
    first = Request("first", range(4 * shared), request_block)
    try:
        blocks, hit = lookup(m, first)
        assert m.allocate_slots(first, first.num_tokens - hit, hit, blocks) is not None
        first.num_computed_tokens = first.num_tokens
        m.free(first)
        second = Request("second", [*range(shared), *range(5000, 5000 + 3 * shared)], request_block)
        blocks, hit = lookup(m, second)
    except ValueError as e:
        assert "hash_block_size" in str(e), e
        m.check_invariants()
        return
    assert hit <= shared, f"a {hit}-token hit where {shared} tokens are shared"


@pytest.mark.parametrize(("manager_block", "request_block"), [(16, 8), (16, 32), (64, 16)])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_hashes_of_another_block_size_never_hit(flavour: str, manager_block: int, request_block: int) -> None:
    in_child(case_hash_size_mismatch, flavour, manager_block, request_block)


def case_scheduler_block_size_not_lcm(flavour: str) -> None:
    from hybridcache import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    config = KVCacheConfig(64, [], [KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=16))])
    with pytest.raises(ValueError, match="scheduler_block_size"):
        manager_class(flavour)(config, 1024, 32, 16)
    # The LCM is accepted.
    manager_class(flavour)(config, 1024, 16, 16).check_invariants()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_constructor_checks_scheduler_block_size(flavour: str) -> None:
    in_child(case_scheduler_block_size_not_lcm, flavour)


def _mamba_manager(flavour: str) -> Any:
    from hybridcache import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec

    groups = [KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=16)),
              KVCacheGroupSpec(["mamba"], MambaSpec(block_size=16, mamba_cache_mode="align"))]
    kw = {"enable_caching": True}
    if flavour == "0.33.0":
        kw["num_hash_lookahead_tokens"] = 0
    return manager_class(flavour)(KVCacheConfig(64, [], groups), 1024, 16, 16, **kw)


def case_missing_new_step_starts(flavour: str) -> str:
    """A loop that never calls `new_step_starts()` admits a request whose
    hit is a Mamba state cached "this step": vLLM's managers say None (the
    request waits a step) and the facades of vLLM releases keep that;
    hybridcache's own manager says what is wrong."""
    from hybridcache import Request

    m = _mamba_manager(flavour)
    a = Request("a", range(80), 16)
    blocks, hit = lookup(m, a)
    assert m.allocate_slots(a, 64, hit, blocks) is not None
    a.num_computed_tokens = 64
    assert m.allocate_slots(a, 16) is not None
    a.num_computed_tokens = 80
    c = Request("c", range(80), 16)
    blocks, hit = lookup(m, c)
    assert hit == 64
    free = m.block_pool.get_num_free_blocks()
    try:
        out = m.allocate_slots(c, 80 - hit, hit, blocks)
    except RuntimeError as e:
        assert flavour == "plain", f"the {flavour} facade must answer as vLLM does (None): {e}"
        assert "new_step_starts" in str(e), e
        assert m.block_pool.get_num_free_blocks() == free
        return "refused"
    assert flavour != "plain", f"hybridcache's own manager answered {out!r} with {free} blocks free"
    assert out is None
    return "none"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_loop_without_new_step_starts(flavour: str) -> None:
    in_child(case_missing_new_step_starts, flavour)
