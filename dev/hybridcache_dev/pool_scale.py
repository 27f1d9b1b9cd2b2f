"""The pool-scale figures of `hybridcache bench`: the time to build a
manager over a large pool (full attention) and the resident memory it adds
per block, for hybridcache's facade and vLLM's manager; `format_scale`
gives the table's lines."""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from collections.abc import Callable
from typing import Any

from hybridcache import releases
from hybridcache.tools import configs as tools_configs
from hybridcache.tools.release_api import release as release_api

from .bench_trace import manager_kwargs

SCALE_BLOCKS = 1_000_000


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None


def pool_scale(factory: Callable[[Any], Any], config: Any, num_blocks: int) -> dict[str, Any]:
    """Time to build a manager over `num_blocks` blocks and RSS growth per
    block; `config` is a dataclass (vLLM's KVCacheConfig and ours are)."""
    factory(dataclasses.replace(config, num_blocks=16))  # imports and first-use costs out of the way
    gc.collect()
    rss0 = _rss_bytes()
    t0 = time.perf_counter()
    manager = factory(config)
    seconds = time.perf_counter() - t0
    rss1 = _rss_bytes()
    free = manager.block_pool.get_num_free_blocks()
    del manager
    gc.collect()
    per_block = None if rss0 is None or rss1 is None else max(0, rss1 - rss0) / num_blocks
    return {"num_blocks": num_blocks, "build_ms": seconds * 1e3, "bytes_per_block": per_block,
            "free_blocks": free}


def scale_figures(use_vllm: bool, num_blocks: int = SCALE_BLOCKS, release: str = releases.DEFAULT.version) -> dict[str, Any]:
    """Build time and bytes per block of a `num_blocks` pool (full
    attention), hybridcache's facade for vLLM `release` (and vLLM's manager)."""
    api, kwargs, groups = release_api(release), manager_kwargs(), [tools_configs.GroupSpec("full", 16)]
    out = {"hybridcache": pool_scale(lambda c: api.tool_facade(c, kwargs),
                                     tools_configs.kv_cache_config(groups, num_blocks), num_blocks)}
    if use_vllm:
        out["vllm"] = pool_scale(lambda c: api.tool_vllm(c, kwargs),
                                 tools_configs.kv_cache_config(groups, num_blocks, vllm=True), num_blocks)
    return out


def format_scale(scale: dict[str, Any]) -> list[str]:
    """One line per implementation: build time and bytes of metadata per block."""
    lines = []
    for name, s in scale.items():
        bpb = s["bytes_per_block"]
        lines.append(f"pool of {s['num_blocks']:,} blocks ({name}): built in {s['build_ms']:,.1f} ms, "
                     f"{'?' if bpb is None else f'{bpb:,.1f}'} bytes of metadata per block (RSS delta)")
    return lines
