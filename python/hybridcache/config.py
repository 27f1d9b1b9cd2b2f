"""KV-cache configuration: hybridcache's own small spec/config classes, and
the duck-typed reading of vLLM's (or these) into what the native core takes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FullAttentionSpec:
    """A full-attention KV-cache layer group (the fields vLLM's spec has)."""

    block_size: int
    num_kv_heads: int = 1
    head_size: int = 1
    dtype: Any = None
    sliding_window: int | None = None


@dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: Any
    is_eagle_group: bool = False


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list[Any] = field(default_factory=list)
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)


# Spec class name -> (native manager kind, event kind). Checked along the
# class's MRO, most derived first, so vLLM's subclasses and ours both resolve.
_SPEC_KINDS: dict[str, tuple[str | None, str]] = {
    "SlidingWindowMLASpec": (None, "sliding_window_mla"),
    "HiddenStateCacheSpec": (None, "mla_attention"),
    "MLAAttentionSpec": ("full_attention", "mla_attention"),
    "TQFullAttentionSpec": ("full_attention", "full_attention"),
    "SinkFullAttentionSpec": (None, "sink_full_attention"),
    "FullAttentionSpec": ("full_attention", "full_attention"),
    "ChunkedLocalAttentionSpec": (None, "chunked_local_attention"),
    "SlidingWindowSpec": (None, "sliding_window"),
    "MambaSpec": (None, "mamba"),
    "EncoderOnlyAttentionSpec": (None, "encoder_only_attention"),
    "CrossAttentionSpec": (None, "cross_attention"),
    "UniformTypeKVCacheSpecs": (None, "unknown"),
}

# vLLM reports new blocks for zeroing for exactly these spec types.
_REPORTS_NEW_BLOCK_IDS = frozenset({"FullAttentionSpec", "TQFullAttentionSpec", "MLAAttentionSpec"})


@dataclass(frozen=True)
class GroupInfo:
    """What the facade keeps per group: native kind plus event metadata."""

    native: tuple[str, int, bool, bool]
    event_kind: str
    sliding_window: int | None


def _classify(spec: Any, index: int) -> tuple[str, str]:
    for cls in type(spec).__mro__:
        if cls.__name__ in _SPEC_KINDS:
            kind, event_kind = _SPEC_KINDS[cls.__name__]
            if kind is None:
                raise NotImplementedError(
                    f"kv_cache_groups[{index}]: {cls.__name__} is not supported by "
                    "hybridcache yet (full attention only in this version)"
                )
            return kind, event_kind
    raise NotImplementedError(
        f"kv_cache_groups[{index}]: unknown KV cache spec type {type(spec).__name__}"
    )


def read_groups(kv_cache_config: Any) -> list[GroupInfo]:
    """Reads `kv_cache_config.kv_cache_groups` (vLLM's or ours) by duck typing."""
    try:
        groups = list(kv_cache_config.kv_cache_groups)
    except (AttributeError, TypeError) as e:
        raise TypeError("kv_cache_config must have a kv_cache_groups list") from e
    out = []
    for i, g in enumerate(groups):
        spec = getattr(g, "kv_cache_spec", None)
        if spec is None:
            raise TypeError(f"kv_cache_groups[{i}] has no kv_cache_spec")
        block_size = getattr(spec, "block_size", None)
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
            raise ValueError(f"kv_cache_groups[{i}].kv_cache_spec.block_size must be a positive int, got {block_size!r}")
        kind, event_kind = _classify(spec, i)
        is_eagle = bool(getattr(g, "is_eagle_group", False))
        reports_new = type(spec).__name__ in _REPORTS_NEW_BLOCK_IDS
        window = getattr(spec, "sliding_window", None) if event_kind.startswith("sliding_window") else None
        out.append(GroupInfo((kind, block_size, is_eagle, reports_new), event_kind, window))
    return out


def read_num_blocks(kv_cache_config: Any) -> int:
    n = getattr(kv_cache_config, "num_blocks", None)
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise ValueError(f"kv_cache_config.num_blocks must be a positive int, got {n!r}")
    return n


def check_retention_interval(groups: list[GroupInfo]) -> None:
    """vLLM 0.23.0 rejects VLLM_PREFIX_CACHE_RETENTION_INTERVAL without a
    sliding-window group; with one it is not implemented here yet."""
    if os.environ.get("VLLM_PREFIX_CACHE_RETENTION_INTERVAL") is None:
        return
    if not any(g.event_kind.startswith("sliding_window") for g in groups):
        raise ValueError(
            "VLLM_PREFIX_CACHE_RETENTION_INTERVAL is set but this model has no "
            "sliding-window KV cache group, so retention has no effect. Unset it "
            "(the feature only applies to sliding-window attention)."
        )
    raise NotImplementedError("VLLM_PREFIX_CACHE_RETENTION_INTERVAL is not supported yet")
