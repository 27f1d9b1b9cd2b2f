"""The constructor's check of a block size that vLLM's scheduler gets right
by construction and a new user may not: with one KV-cache group (not
Mamba), the scheduler block size is that group's block size (vLLM's
`resolve_kv_cache_block_sizes`), times the context-parallel world sizes.
Hybrid models keep the core's rule (a common multiple of the groups' block
sizes): vLLM's own configurations and tests use larger multiples there."""

from __future__ import annotations

from typing import Any


def check_scheduler_block_size(groups: list[Any], scheduler_block_size: int, cp_scale: int = 1) -> None:
    """ValueError unless `scheduler_block_size` is `cp_scale` times the
    block size of a model's one group (a Mamba group's block size is not a
    scheduling unit: left to the core's check)."""
    if len(groups) != 1 or groups[0].native.kind == "mamba":
        return
    expected = groups[0].native.block_size * cp_scale
    if scheduler_block_size != expected:
        scale = f" times dcp_world_size * pcp_world_size ({cp_scale})" if cp_scale != 1 else ""
        raise ValueError(
            f"scheduler_block_size ({scheduler_block_size}) must be the block size of the model's one "
            f"KV-cache group ({groups[0].native.block_size}){scale}: {expected}"
        )
