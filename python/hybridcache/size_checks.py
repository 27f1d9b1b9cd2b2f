"""The constructor's checks of the caller's block sizes that vLLM's
scheduler gets right by construction and a new user may not: the
scheduler block size of a model without Mamba layers is the LCM of its
groups' block sizes (vLLM's `resolve_kv_cache_block_sizes`), times the
context-parallel world sizes."""

from __future__ import annotations

from math import lcm
from typing import Any


def check_scheduler_block_size(groups: list[Any], scheduler_block_size: int, cp_scale: int = 1) -> None:
    """ValueError unless `scheduler_block_size` is `cp_scale` times the LCM
    of the groups' block sizes. Mamba groups are left out: their block size
    is not a scheduling unit (`mamba_cache_mode="none"` blocks hold a whole
    sequence), and the core checks the multiples there."""
    sizes = [g.native.block_size for g in groups if g.native.kind != "mamba"]
    if not sizes or len(sizes) != len(groups):
        return
    expected = lcm(*sizes) * cp_scale
    if scheduler_block_size != expected:
        scale = f" times dcp_world_size * pcp_world_size ({cp_scale})" if cp_scale != 1 else ""
        raise ValueError(
            f"scheduler_block_size ({scheduler_block_size}) must be the LCM of the groups' block sizes "
            f"{sorted(set(sizes))}{scale}: {expected}"
        )
