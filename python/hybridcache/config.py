"""KV-cache configuration: hybridcache's own small spec/config classes, and
the duck-typed reading of vLLM's (or these) into what the native core takes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class FullAttentionSpec:
    """A full-attention KV-cache layer group (the fields vLLM's spec has)."""

    block_size: int
    num_kv_heads: int = 1
    head_size: int = 1
    dtype: Any = None
    sliding_window: int | None = None


@dataclass(frozen=True)
class SlidingWindowSpec:
    block_size: int
    sliding_window: int
    num_kv_heads: int = 1
    head_size: int = 1
    dtype: Any = None

    def max_admission_blocks_per_request(self, max_num_batched_tokens: int, max_model_len: int) -> int:
        # The window may start mid-block, hence one block more.
        num_tokens = min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return _cdiv(num_tokens, self.block_size) + 1


@dataclass(frozen=True)
class ChunkedLocalAttentionSpec:
    block_size: int
    attention_chunk_size: int
    num_kv_heads: int = 1
    head_size: int = 1
    dtype: Any = None

    def max_admission_blocks_per_request(self, max_num_batched_tokens: int, max_model_len: int) -> int:
        num_tokens = min(self.attention_chunk_size + max_num_batched_tokens, max_model_len)
        return _cdiv(num_tokens, self.block_size)


@dataclass(frozen=True)
class MambaSpec:
    """A Mamba / linear-attention state group; `mamba_cache_mode` is
    "none", "all" or "align"."""

    block_size: int
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[Any, ...] = ()
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0


@dataclass(frozen=True)
class CrossAttentionSpec:
    block_size: int
    num_kv_heads: int = 1
    head_size: int = 1
    dtype: Any = None


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
    "SlidingWindowMLASpec": ("sliding_window", "sliding_window_mla"),
    "HiddenStateCacheSpec": ("full_attention", "mla_attention"),
    "MLAAttentionSpec": ("full_attention", "mla_attention"),
    "TQFullAttentionSpec": ("full_attention", "full_attention"),
    # vLLM 0.23.0 cannot build its manager (constructor signature mismatch).
    "SinkFullAttentionSpec": (None, "sink_full_attention"),
    "FullAttentionSpec": ("full_attention", "full_attention"),
    "ChunkedLocalAttentionSpec": ("chunked_local", "chunked_local_attention"),
    "SlidingWindowSpec": ("sliding_window", "sliding_window"),
    "MambaSpec": ("mamba", "mamba"),
    # vLLM 0.23.0 registers no manager for it.
    "EncoderOnlyAttentionSpec": (None, "encoder_only_attention"),
    "CrossAttentionSpec": ("cross_attention", "cross_attention"),
    "UniformTypeKVCacheSpecs": (None, "unknown"),
}

# vLLM reports new blocks for zeroing for exactly these spec types.
_REPORTS_NEW_BLOCK_IDS = frozenset({"FullAttentionSpec", "TQFullAttentionSpec", "MLAAttentionSpec"})


@dataclass(frozen=True)
class GroupInfo:
    """What the facade keeps per group: the native description plus event metadata."""

    native: tuple[str, int, bool, bool, int, int | None, int, str, int]
    event_kind: str
    sliding_window: int | None


def _classify(spec: Any, index: int) -> tuple[str, str]:
    for cls in type(spec).__mro__:
        if cls.__name__ in _SPEC_KINDS:
            kind, event_kind = _SPEC_KINDS[cls.__name__]
            if kind is None:
                raise NotImplementedError(
                    f"kv_cache_groups[{index}]: {cls.__name__} is not supported by hybridcache "
                    "(vLLM 0.23.0 has no working manager for it either)"
                )
            return kind, event_kind
    raise NotImplementedError(f"kv_cache_groups[{index}]: unknown KV cache spec type {type(spec).__name__}")


def _int_field(spec: Any, name: str, index: int, minimum: int = 1) -> int:
    v = getattr(spec, name, None)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise ValueError(f"kv_cache_groups[{index}].kv_cache_spec.{name} must be an int >= {minimum}, got {v!r}")
    return v


def _admission_cap(spec: Any, kind: str, max_num_batched_tokens: int, max_model_len: int) -> int | None:
    """The spec's own per-request cap (vLLM's single source of truth)."""
    if kind not in ("sliding_window", "chunked_local"):
        return None
    method = getattr(spec, "max_admission_blocks_per_request", None)
    if method is not None:
        return int(method(max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len))
    if kind == "sliding_window":
        return _cdiv(min(int(spec.sliding_window) - 1 + max_num_batched_tokens, max_model_len), int(spec.block_size)) + 1
    return _cdiv(min(int(spec.attention_chunk_size) + max_num_batched_tokens, max_model_len), int(spec.block_size))


def _native_group(spec: Any, kind: str, index: int, spec_class: int, is_eagle: bool, cap: int | None) -> tuple:
    block_size = _int_field(spec, "block_size", index)
    param, mode, num_spec = 0, "none", 0
    if kind == "sliding_window":
        param = _int_field(spec, "sliding_window", index)
    elif kind == "chunked_local":
        param = _int_field(spec, "attention_chunk_size", index)
    elif kind == "mamba":
        mode = getattr(spec, "mamba_cache_mode", "none")
        if mode not in ("none", "all", "align"):
            raise ValueError(f"kv_cache_groups[{index}].kv_cache_spec.mamba_cache_mode must be none/all/align, got {mode!r}")
        num_spec = _int_field(spec, "num_speculative_blocks", index, minimum=0)
    reports_new = type(spec).__name__ in _REPORTS_NEW_BLOCK_IDS
    return (kind, block_size, is_eagle, reports_new, spec_class, cap, param, mode, num_spec)


def read_groups(kv_cache_config: Any, max_num_batched_tokens: int, max_model_len: int) -> list[GroupInfo]:
    """Reads `kv_cache_config.kv_cache_groups` (vLLM's or ours) by duck typing."""
    try:
        groups = list(kv_cache_config.kv_cache_groups)
    except (AttributeError, TypeError) as e:
        raise TypeError("kv_cache_config must have a kv_cache_groups list") from e
    specs = []
    for i, g in enumerate(groups):
        spec = getattr(g, "kv_cache_spec", None)
        if spec is None:
            raise TypeError(f"kv_cache_groups[{i}] has no kv_cache_spec")
        specs.append(spec)
    out = []
    for i, (g, spec) in enumerate(zip(groups, specs)):
        kind, event_kind = _classify(spec, i)
        # Groups with equal specs are looked up together, as vLLM does.
        spec_class = next(j for j, other in enumerate(specs) if other == spec)
        cap = _admission_cap(spec, kind, max_num_batched_tokens, max_model_len)
        native = _native_group(spec, kind, i, spec_class, bool(getattr(g, "is_eagle_group", False)), cap)
        window = spec.sliding_window if kind == "sliding_window" else None
        out.append(GroupInfo(native, event_kind, window))
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
    if not any(g.native[0] == "sliding_window" for g in groups):
        raise ValueError(
            "VLLM_PREFIX_CACHE_RETENTION_INTERVAL is set but this model has no "
            "sliding-window KV cache group, so retention has no effect. Unset it "
            "(the feature only applies to sliding-window attention)."
        )
    raise NotImplementedError("VLLM_PREFIX_CACHE_RETENTION_INTERVAL is not supported yet")
