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


# The spec class of each group kind (hybridcache's and vLLM's share the
# names and keywords), and the group's field each kind adds.
_SPECS = {"full": ("FullAttentionSpec", None), "sliding_window": ("SlidingWindowSpec", "sliding_window"),
          "chunked_local": ("ChunkedLocalAttentionSpec", "attention_chunk_size"),
          "cross_attention": ("CrossAttentionSpec", None), "mamba": ("MambaSpec", None)}


def kv_cache_config(groups: Sequence[GroupSpec], num_blocks: int, vllm: bool = False) -> Any:
    """The KVCacheConfig of resolved `groups`: vLLM's classes (imports vLLM
    and torch) or hybridcache's own (neither)."""
    if vllm:
        import torch
        from vllm.v1 import kv_cache_interface as iface

        layer_dtype, state_dtype = {False: torch.float32, True: torch.bfloat16}, torch.float32
    else:
        from .. import config as iface

        layer_dtype, state_dtype = {False: None, True: None}, "float32"
    specs = []
    for i, g in enumerate(groups):
        name, field = _SPECS[g.kind]
        kw: dict[str, Any]
        if g.kind == "mamba":
            kw = dict(shapes=((1, 1),), dtypes=(state_dtype,), mamba_cache_mode=g.mamba_cache_mode or "none",
                      num_speculative_blocks=g.num_speculative_blocks)
            if g.mamba_checkpoint_alignment is not None:  # vLLM's classes only
                kw.update(num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=g.mamba_checkpoint_alignment)
        else:
            kw = dict(num_kv_heads=1, head_size=1, dtype=layer_dtype[g.half_precision])
            if field:
                kw[field] = getattr(g, field)
        spec = getattr(iface, name)(block_size=g.size, **kw)
        specs.append(iface.KVCacheGroupSpec([f"layer{i}"], spec, is_eagle_group=g.is_eagle_group))
    return iface.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=specs)
