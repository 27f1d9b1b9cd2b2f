"""KV-cache group layouts of the simulated models, and the one place that
turns them into configurations: hybridcache's own config classes (no vLLM, no
torch) or vLLM's (imports both when called).

A layout is a sequence of `GroupSpec`; `format_mix` writes its compact text
form (``"full,sw:128@32,mamba:align:2,full+eagle"``), which the development
package's `parse_mix` reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

GROUP_KINDS = ("full", "sliding_window", "chunked_local", "mamba", "cross_attention")

_KIND_ALIASES = {
    "full": "full",
    "fa": "full",
    "full_attention": "full",
    "sw": "sliding_window",
    "swa": "sliding_window",
    "sliding_window": "sliding_window",
    "chunked": "chunked_local",
    "local": "chunked_local",
    "chunked_local": "chunked_local",
    "mamba": "mamba",
    "cross": "cross_attention",
    "cross_attention": "cross_attention",
}

_SHORT_KIND = {
    "full": "full",
    "sliding_window": "sw",
    "chunked_local": "chunked",
    "mamba": "mamba",
    "cross_attention": "cross",
}

MAMBA_MODES = ("none", "all", "align")


@dataclass(frozen=True)
class GroupSpec:
    """One KV-cache group of the simulated model.

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

    def __post_init__(self) -> None:
        kind = _KIND_ALIASES.get(self.kind)
        if kind is None:
            raise ValueError(f"unknown KV-cache group kind {self.kind!r}; one of {GROUP_KINDS}")
        object.__setattr__(self, "kind", kind)
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if kind == "sliding_window" and not (self.sliding_window or 0) >= 1:
            raise ValueError("a sliding_window group needs sliding_window >= 1")
        if kind == "chunked_local" and not (self.attention_chunk_size or 0) >= 1:
            raise ValueError("a chunked_local group needs attention_chunk_size >= 1")
        if kind == "mamba":
            if self.mamba_cache_mode not in (None, *MAMBA_MODES):
                raise ValueError(f"mamba_cache_mode must be one of {MAMBA_MODES}, got {self.mamba_cache_mode!r}")
            if self.num_speculative_blocks < 0:
                raise ValueError("num_speculative_blocks must be >= 0")

    @property
    def size(self) -> int:
        """The block size of a resolved group."""
        if self.block_size is None:
            raise ValueError(f"group {self} has no block size yet (resolve it first)")
        return self.block_size

    def __str__(self) -> str:
        text = _SHORT_KIND[self.kind]
        if self.kind == "sliding_window":
            text += f":{self.sliding_window}"
        elif self.kind == "chunked_local":
            text += f":{self.attention_chunk_size}"
        elif self.kind == "mamba" and (self.mamba_cache_mode or self.num_speculative_blocks):
            text += f":{self.mamba_cache_mode or 'auto'}"
            if self.num_speculative_blocks:
                text += f":{self.num_speculative_blocks}"
        if self.block_size is not None:
            text += f"@{self.block_size}"
        if self.is_eagle_group:
            text += "+eagle"
        if self.half_precision:
            text += "+bf16"
        return text


def full(block_size: int | None = None, *, eagle: bool = False) -> GroupSpec:
    return GroupSpec("full", block_size, is_eagle_group=eagle)


def sliding_window(window: int, block_size: int | None = None, *, eagle: bool = False) -> GroupSpec:
    return GroupSpec("sliding_window", block_size, sliding_window=window, is_eagle_group=eagle)


def chunked_local(chunk: int, block_size: int | None = None, *, eagle: bool = False) -> GroupSpec:
    return GroupSpec("chunked_local", block_size, attention_chunk_size=chunk, is_eagle_group=eagle)


def mamba(
    mode: str | None = None,
    num_speculative_blocks: int = 0,
    block_size: int | None = None,
    *,
    eagle: bool = False,
) -> GroupSpec:
    return GroupSpec(
        "mamba",
        block_size,
        mamba_cache_mode=mode,
        num_speculative_blocks=num_speculative_blocks,
        is_eagle_group=eagle,
    )


def cross_attention(block_size: int | None = None) -> GroupSpec:
    return GroupSpec("cross_attention", block_size)


def format_mix(groups: Iterable[GroupSpec]) -> str:
    return ",".join(str(g) for g in groups)


# --------------------------------------------------------------------------
# The config builders: one per implementation, both from the same groups.
# --------------------------------------------------------------------------


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


def hybridcache_manager(kv_cache_config: Any, kwargs: dict[str, Any]) -> Any:
    """hybridcache's facade of vLLM 0.23.0 on `kv_cache_config` (its own or
    vLLM's classes): `KVCacheManager` answering as vLLM's where a caller
    never calls `new_step_starts()` (None, not hybridcache's own error)."""
    from ..releases.v0_23.scheduler import VllmKVCacheManager

    return VllmKVCacheManager(kv_cache_config, **kwargs)


def vllm_manager(kv_cache_config: Any, kwargs: dict[str, Any]) -> Any:
    """vLLM's own KVCacheManager (the whole-block-hits keywords) on `kv_cache_config`."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    return KVCacheManager(kv_cache_config, **kwargs)
