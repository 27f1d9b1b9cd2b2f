"""The partial-block-hits fuzz's mixes with vLLM's groups outside the classic
attention types: circular buffers (`CircularBufferSpec`, one ring block per
request), bounded-replay sliding windows (`SlidingWindowMLASpec(
bounded_replay=True)`: not prefix-cacheable), R-SWA (`RSWASpec`: full
attention freeing the decode gap after the prompt) and sliding windows with
`extra_retained_tokens` (multi-module MTP's lag). `release_api.PartialBlockHits` draws
their groups here and builds their vLLM config here; the driver is the same.

Group kinds (`fuzz_setup.Group.kind`) added here: "circ" (block size = the
ring), "swbr" (param: the window), "rswa" (param: `rswa_window`), "swx"
(param: the window, `num_spec`: the extra retained tokens).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from . import configs
from .fuzz_setup import Group, Setup, group_specs

MIXES = ("full_circ", "full_swbr", "rswa", "rswa_sw", "full_swx")

# Kinds a retention interval may be drawn for (sliding windows).
SPARSE_KINDS = ("swbr", "swx")

# Each kind built as the classic kind it extends, then its spec replaced.
_BASE_KIND = {"circ": "full", "swbr": "sw", "rswa": "full", "swx": "sw"}


def random_groups(rng: Any, mix: str, caching: bool) -> dict[str, Any]:
    """The groups, scheduler and hash block sizes of `mix` (a dict for
    `dataclasses.replace` of the setup)."""
    hbs = 4 if caching else 8
    if mix == "full_circ":
        # The ring's capacity need not be the hash block: it hashes nothing.
        ring = rng.choice((2, 4, 8))
        return dict(groups=(Group("full", 4), Group("circ", ring)), scheduler_block_size=8, hash_block_size=hbs)
    if mix == "full_swbr":
        sw = Group("swbr", rng.choice((4, 8)), rng.randint(3, 14))
        return dict(groups=(Group("full", 4), sw), scheduler_block_size=8, hash_block_size=hbs)
    if mix == "rswa":
        bs = rng.choice((4, 8))
        return dict(groups=(Group("rswa", bs, rng.randint(0, 20)),), scheduler_block_size=bs, hash_block_size=bs)
    if mix == "rswa_sw":
        sw = Group("sw", rng.choice((4, 8)), rng.randint(3, 14))
        return dict(groups=(Group("rswa", 4, rng.randint(0, 20)), sw), scheduler_block_size=8, hash_block_size=hbs)
    if mix == "full_swx":
        sw = Group("swx", rng.choice((4, 8)), rng.randint(3, 14), num_spec=rng.randint(1, 6))
        return dict(groups=(Group("full", 4), sw), scheduler_block_size=8, hash_block_size=hbs)
    raise ValueError(f"unknown mix {mix!r}; choose from {', '.join(MIXES)}")


def covers(s: Setup) -> bool:
    """Whether `s` has a group of this module's kinds."""
    return any(g.kind in _BASE_KIND for g in s.groups)


def _spec(g: Group, base: Any) -> Any:
    """vLLM's spec of `g`, on the layout of `base` (its classic spec)."""
    from vllm.v1 import kv_cache_interface as iface

    attn = dict(block_size=base.block_size, num_kv_heads=base.num_kv_heads, head_size=base.head_size,
                dtype=base.dtype)
    if g.kind == "circ":
        return iface.CircularBufferSpec(**attn)
    if g.kind == "swbr":
        return iface.SlidingWindowMLASpec(**attn, sliding_window=g.param, bounded_replay=True)
    if g.kind == "rswa":
        return iface.RSWASpec(**attn, rswa_window=g.param)
    return iface.SlidingWindowSpec(**attn, sliding_window=g.param, extra_retained_tokens=g.num_spec)


def kv_cache_config(s: Setup) -> Any:
    """vLLM's KVCacheConfig of `s` (with its retention interval)."""
    base = dataclasses.replace(s, groups=tuple(
        dataclasses.replace(g, kind=_BASE_KIND.get(g.kind, g.kind), num_spec=0 if g.kind in _BASE_KIND else g.num_spec)
        for g in s.groups))
    cfg = configs.vllm_kv_cache_config(group_specs(base), s.num_blocks)
    for g, group in zip(s.groups, cfg.kv_cache_groups):
        if g.kind in _BASE_KIND:
            group.kv_cache_spec = _spec(g, group.kv_cache_spec)
    cfg.prefix_cache_retention_interval = s.retention
    return cfg


__all__ = ["MIXES", "SPARSE_KINDS", "covers", "kv_cache_config", "random_groups"]
