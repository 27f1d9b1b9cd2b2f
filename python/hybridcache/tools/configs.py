"""KV-cache group layouts of the tools' workloads (`GroupSpec`, as the
recordings store them) and the one place that turns them into
configurations: hybridcache's own config classes (no vLLM, no torch) or
vLLM's (imports both when called). The development package
(`hybridcache_dev.configs`) builds, checks and spells layouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GroupSpec:
    """One KV-cache group of a workload's model (`kind`: full,
    sliding_window, chunked_local, mamba or cross_attention).

    ``block_size`` None: ``ReplayConfig.block_size`` (for Mamba "none" mode,
    ``max_model_len``, as vLLM sizes Mamba blocks without prefix caching).
    ``mamba_cache_mode`` None: "align" with prefix caching, "none" without
    (vLLM forces "none" when prefix caching is off). The config builders
    take resolved groups (both set).
    """

    kind: str = "full"
    block_size: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    mamba_cache_mode: str | None = None
    num_speculative_blocks: int = 0
    is_eagle_group: bool = False
    # vLLM 0.29+'s Mamba align prefill checkpoints (num_prefill_checkpoint_blocks
    # = 1 with this prefill_checkpoint_alignment); None: none.
    mamba_checkpoint_alignment: int | None = None
    # The layer dtype is bfloat16 instead of float32 (the partial-block-hits profile zeroes new
    # blocks of a cache mixing precisions).
    half_precision: bool = False

    @property
    def size(self) -> int:
        """The block size of a resolved group."""
        if self.block_size is None:
            raise ValueError(f"group {self} has no block size yet (resolve it first)")
        return self.block_size


def hybridcache_kv_cache_config(groups: Sequence[GroupSpec], num_blocks: int) -> Any:
    """hybridcache's own KVCacheConfig for resolved `groups` (no vLLM, no torch)."""
    from .. import config as hc

    specs: list[hc.KVCacheGroupSpec] = []
    for i, g in enumerate(groups):
        spec: Any
        if g.kind == "full":
            spec = hc.FullAttentionSpec(g.size)
        elif g.kind == "sliding_window":
            spec = hc.SlidingWindowSpec(g.size, g.sliding_window or 0)
        elif g.kind == "chunked_local":
            spec = hc.ChunkedLocalAttentionSpec(g.size, g.attention_chunk_size or 0)
        elif g.kind == "cross_attention":
            spec = hc.CrossAttentionSpec(g.size)
        else:
            spec = hc.MambaSpec(
                g.size,
                shapes=((1, 1),),
                dtypes=("float32",),
                mamba_cache_mode=g.mamba_cache_mode or "none",
                num_speculative_blocks=g.num_speculative_blocks,
            )
        specs.append(hc.KVCacheGroupSpec([f"layer{i}"], spec, is_eagle_group=g.is_eagle_group))
    return hc.KVCacheConfig(num_blocks=num_blocks, kv_cache_groups=specs)


def vllm_kv_cache_config(groups: Sequence[GroupSpec], num_blocks: int) -> Any:
    """vLLM's KVCacheConfig for resolved `groups` (imports vLLM and torch)."""
    import torch
    from vllm.v1 import kv_cache_interface as iface

    specs = []
    for i, g in enumerate(groups):
        dtype = torch.bfloat16 if g.half_precision else torch.float32
        attn: dict[str, Any] = dict(block_size=g.size, num_kv_heads=1, head_size=1, dtype=dtype)
        if g.kind == "full":
            spec = iface.FullAttentionSpec(**attn)
        elif g.kind == "sliding_window":
            spec = iface.SlidingWindowSpec(**attn, sliding_window=g.sliding_window)
        elif g.kind == "chunked_local":
            spec = iface.ChunkedLocalAttentionSpec(**attn, attention_chunk_size=g.attention_chunk_size)
        elif g.kind == "cross_attention":
            spec = iface.CrossAttentionSpec(**attn)
        else:
            spec = iface.MambaSpec(
                block_size=g.size,
                shapes=((1, 1),),
                dtypes=(torch.float32,),
                mamba_cache_mode=g.mamba_cache_mode,
                num_speculative_blocks=g.num_speculative_blocks,
                **({} if g.mamba_checkpoint_alignment is None else
                   {"num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": g.mamba_checkpoint_alignment}),
            )
        specs.append(iface.KVCacheGroupSpec([f"layer{i}"], spec, is_eagle_group=g.is_eagle_group))
    return iface.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=specs)
