"""KV-cache configuration: hybridcache's own small spec/config classes, and
the duck-typed reading of vLLM's (or these) into what the native core takes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal, cast


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class AttentionSpec:
    """The base of the attention specs below, as vLLM's `AttentionSpec` is of
    its own: a rule that asks for it (a later release's new-block records
    for zeroing) reads hybridcache's classes as it reads vLLM's."""

    __slots__ = ()


@dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    """The KV-cache spec of full-attention layers (vLLM's `FullAttentionSpec`,
    the fields the manager reads): every token of a request keeps its KV
    entries, so a request holds ``ceil(tokens / block_size)`` blocks.

    Args:
        block_size: tokens per KV block (> 0).
        num_kv_heads, head_size, dtype: the tensor layout; the manager
            ignores them (they size the GPU tensors, which the caller owns),
            but specs that differ in them are different groups for lookups.
        sliding_window: always None here (vLLM's field, for its subclasses).

    Specs are compared by value: groups with equal specs share their prefix
    cache lookups, as in vLLM. Bad values (a block size that is not a
    positive int) raise ValueError when the `KVCacheManager` is built.
    """

    block_size: int
    num_kv_heads: int = 1
    head_size: int = 1
    dtype: Any = None
    sliding_window: int | None = None


@dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    """The KV-cache spec of sliding-window attention layers (vLLM's
    `SlidingWindowSpec`): a token attends to the ``sliding_window`` tokens
    before it, so blocks wholly outside the window are freed as the request
    advances (they show as the null block 0 in its table) and a prefix-cache
    hit needs only the last window's blocks.

    Args:
        block_size: tokens per KV block (> 0).
        sliding_window: the window in tokens (> 0).
        num_kv_heads, head_size, dtype: the tensor layout (not read by the
            manager; see `FullAttentionSpec`).

    Bad values raise ValueError when the `KVCacheManager` is built.
    """

    block_size: int
    sliding_window: int
    num_kv_heads: int = 1
    head_size: int = 1
    dtype: Any = None

    def max_admission_blocks_per_request(self, max_num_batched_tokens: int, max_model_len: int) -> int:
        """The most blocks one request can hold in this group at admission
        (vLLM's method of that name): the window plus one step's tokens,
        capped at `max_model_len`, plus one block because the window may
        start mid-block. Used for `allocate_slots(full_sequence_must_fit=True)`."""
        num_tokens = min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return _cdiv(num_tokens, self.block_size) + 1


@dataclass(frozen=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """The KV-cache spec of chunked local attention layers (vLLM's
    `ChunkedLocalAttentionSpec`, e.g. Llama 4): the sequence is cut into
    chunks of ``attention_chunk_size`` tokens and a token attends only within
    its chunk, so blocks of earlier chunks are freed.

    Args:
        block_size: tokens per KV block (> 0).
        attention_chunk_size: the chunk in tokens (> 0).
        num_kv_heads, head_size, dtype: the tensor layout (not read by the
            manager; see `FullAttentionSpec`).

    Bad values raise ValueError when the `KVCacheManager` is built.
    """

    block_size: int
    attention_chunk_size: int
    num_kv_heads: int = 1
    head_size: int = 1
    dtype: Any = None

    def max_admission_blocks_per_request(self, max_num_batched_tokens: int, max_model_len: int) -> int:
        """The most blocks one request can hold in this group at admission
        (vLLM's method of that name): one chunk plus one step's tokens,
        capped at `max_model_len`."""
        num_tokens = min(self.attention_chunk_size + max_num_batched_tokens, max_model_len)
        return _cdiv(num_tokens, self.block_size)


@dataclass(frozen=True)
class MambaSpec:
    """The state spec of Mamba / linear-attention layers (vLLM's `MambaSpec`):
    a request's state is one block (plus one per speculative token), not one
    per token.

    Args:
        block_size: tokens a state block stands for. With
            ``mamba_cache_mode="none"`` vLLM sets it to `max_model_len` (one
            block per request); with "align" it is the attention block size.
        shapes, dtypes: the state tensors' layout (not read by the manager).
        mamba_cache_mode: prefix caching of the state:
            "none" (never cached: a request's state cannot be reused),
            "all" (a state block per `block_size` tokens, every one cached) or
            "align" (the state is cached only at block boundaries; the caller
            must end prefill chunks there, as vLLM's scheduler does, see the
            caller's contract in docs/usage.md).
        num_speculative_blocks: extra state blocks for speculative decoding,
            vLLM sets it to ``num_speculative_tokens`` (0 without drafts).

    Bad values (another mode, a negative count) raise ValueError when the
    `KVCacheManager` is built.
    """

    block_size: int
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[Any, ...] = ()
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0


@dataclass(frozen=True)
class CrossAttentionSpec(AttentionSpec):
    """The KV-cache spec of cross-attention layers of encoder-decoder models
    (vLLM's `CrossAttentionSpec`, e.g. Whisper): the blocks hold the encoder
    output, sized by `allocate_slots(num_encoder_tokens=...)` at the first
    allocation; never prefix-cached.

    Args:
        block_size: tokens per KV block (> 0).
        num_kv_heads, head_size, dtype: the tensor layout (not read by the
            manager; see `FullAttentionSpec`).
    """

    block_size: int
    num_kv_heads: int = 1
    head_size: int = 1
    dtype: Any = None


@dataclass
class KVCacheGroupSpec:
    """One KV-cache group (vLLM's `KVCacheGroupSpec`): layers that share one
    block table per request because they have the same spec.

    Args:
        layer_names: the model's layers in the group (names only; the
            manager does not read them).
        kv_cache_spec: the group's spec, one of this module's
            (`FullAttentionSpec`, `SlidingWindowSpec`,
            `ChunkedLocalAttentionSpec`, `MambaSpec`, `CrossAttentionSpec`)
            or vLLM's of those names (or their subclasses: MLA, TQ
            full attention, ...). Sink and encoder-only specs raise
            NotImplementedError, as not every supported vLLM has a working
            manager for them; an unknown type raises NotImplementedError too.
        is_eagle_group: the group of an EAGLE drafter's layers (vLLM drops
            the last matched block of such groups on a prefix-cache hit).
    """

    layer_names: list[str]
    kv_cache_spec: Any
    is_eagle_group: bool = False


@dataclass
class KVCacheConfig:
    """The KV cache of a model (vLLM's `KVCacheConfig`): one block pool of
    `num_blocks` blocks shared by all groups, and the groups.

    Args:
        num_blocks: blocks in the pool (> 0). Block 0 is the null block
            (padding in tables, never handed out), so `num_blocks - 1` are
            usable.
        kv_cache_tensors: vLLM's tensor descriptions; not read by the
            manager (the caller owns the GPU memory).
        kv_cache_groups: the `KVCacheGroupSpec`s, in the order block ids are
            returned (group g of every result is this list's entry g).

    `KVCacheManager` raises ValueError for a non-positive `num_blocks` and
    TypeError for groups without a `kv_cache_spec`. vLLM's own KVCacheConfig
    is accepted as well (read by duck typing).
    """

    num_blocks: int
    kv_cache_tensors: list[Any] = field(default_factory=list)
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)


# Spec class name -> (native manager kind, event kind). Checked along the
# class's MRO, most derived first, so vLLM's subclasses and ours both resolve.
_SPEC_KINDS: dict[str, tuple[str | None, str]] = {
    "SlidingWindowMLASpec": ("sliding_window", "sliding_window_mla"),
    # Later releases' (the oldest has neither): R-SWA is a FullAttentionSpec
    # subclass, events report it as full attention; a ring has no kind.
    "RSWASpec": ("rswa", "full_attention"),
    "CircularBufferSpec": ("circular_buffer", "unknown"),
    "HiddenStateCacheSpec": ("full_attention", "mla_attention"),
    "MLAAttentionSpec": ("full_attention", "mla_attention"),
    "TQFullAttentionSpec": ("full_attention", "full_attention"),
    # Some supported vLLM releases cannot build its manager (constructor
    # signature mismatch).
    "SinkFullAttentionSpec": (None, "sink_full_attention"),
    "FullAttentionSpec": ("full_attention", "full_attention"),
    "ChunkedLocalAttentionSpec": ("chunked_local", "chunked_local_attention"),
    "SlidingWindowSpec": ("sliding_window", "sliding_window"),
    "MambaSpec": ("mamba", "mamba"),
    # Some supported vLLM releases register no manager for it.
    "EncoderOnlyAttentionSpec": (None, "encoder_only_attention"),
    "CrossAttentionSpec": ("cross_attention", "cross_attention"),
    "UniformTypeKVCacheSpecs": (None, "unknown"),
}

# vLLM reports new blocks for zeroing for exactly these spec types.
_REPORTS_NEW_BLOCK_IDS = frozenset({"FullAttentionSpec", "TQFullAttentionSpec", "MLAAttentionSpec"})


NativeKind = Literal["full_attention", "sliding_window", "chunked_local", "cross_attention", "mamba", "rswa",
                     "circular_buffer"]
MambaCacheMode = Literal["none", "all", "align"]


@dataclass(frozen=True)
class NativeGroup:
    """One KV-cache group as the native core takes it (`_GroupArg` in
    _native.pyi; the binding reads these attributes by name).

    kind: "full_attention", "sliding_window", "chunked_local",
    "cross_attention", "mamba", "rswa" or "circular_buffer" (any other
    raises NotImplementedError);
    spec_class: index of the first group with an equal spec (looked up
    together, as vLLM does); admission_cap: the spec's per-request block cap
    (sliding window, chunked local), else None; window_or_chunk: the sliding
    window, attention chunk size or R-SWA window (ignored by other kinds);
    mamba_cache_mode: "none", "all" or "align" (read for "mamba" only)."""

    kind: NativeKind
    block_size: int
    is_eagle_group: bool
    reports_new_block_ids: bool
    spec_class: int
    admission_cap: int | None
    window_or_chunk: int
    mamba_cache_mode: MambaCacheMode
    num_speculative_blocks: int
    # Mamba align prefill checkpoints: (alignment,
    # hash_block_size, num_hash_lookahead_tokens, drop_eagle_block,
    # only_at_prefill_end), or None; set by a release's facade that has them.
    mamba_checkpoints: tuple[int, int, int, bool, bool] | None = None
    # A later spec's prefix_cacheable (False: no hits, no caching) and a
    # sliding window's extra_retained_tokens; their defaults for specs without them.
    prefix_cacheable: bool = True
    extra_retained_tokens: int = 0


@dataclass(frozen=True)
class GroupInfo:
    """What the facade keeps per group (internal): the record the native core
    takes, the KV-event spec kind and the sliding window reported in events."""

    native: NativeGroup
    event_kind: str
    sliding_window: int | None


def _classify(spec: Any, index: int) -> tuple[str, str]:
    for cls in type(spec).__mro__:
        if cls.__name__ in _SPEC_KINDS:
            kind, event_kind = _SPEC_KINDS[cls.__name__]
            if kind is None:
                raise NotImplementedError(
                    f"kv_cache_groups[{index}]: {cls.__name__} is not supported by hybridcache "
                    "(not every supported vLLM has a working manager for it either)"
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
        # Positional: later releases name the first parameter max_in_flight_tokens.
        return int(method(max_num_batched_tokens, max_model_len))
    if kind == "sliding_window":
        return _cdiv(min(int(spec.sliding_window) - 1 + max_num_batched_tokens, max_model_len), int(spec.block_size)) + 1
    return _cdiv(min(int(spec.attention_chunk_size) + max_num_batched_tokens, max_model_len), int(spec.block_size))


def _native_group(spec: Any, kind: str, index: int, spec_class: int, is_eagle: bool, cap: int | None) -> NativeGroup:
    block_size = _int_field(spec, "block_size", index)
    param, mode, num_spec = 0, "none", 0
    if kind == "sliding_window":
        param = _int_field(spec, "sliding_window", index)
    elif kind == "chunked_local":
        param = _int_field(spec, "attention_chunk_size", index)
    elif kind == "rswa":
        param = _int_field(spec, "rswa_window", index, minimum=0)
    elif kind == "mamba":
        mode = getattr(spec, "mamba_cache_mode", "none")
        if mode not in ("none", "all", "align"):
            raise ValueError(f"kv_cache_groups[{index}].kv_cache_spec.mamba_cache_mode must be none/all/align, got {mode!r}")
        num_spec = _int_field(spec, "num_speculative_blocks", index, minimum=0)
    reports_new = type(spec).__name__ in _REPORTS_NEW_BLOCK_IDS
    cacheable = bool(getattr(spec, "prefix_cacheable", True))
    extra = 0
    if kind == "sliding_window" and getattr(spec, "extra_retained_tokens", None) is not None:
        extra = _int_field(spec, "extra_retained_tokens", index, minimum=0)
    return NativeGroup(kind=cast(NativeKind, kind), block_size=block_size, is_eagle_group=is_eagle,
                       reports_new_block_ids=reports_new, spec_class=spec_class, admission_cap=cap,
                       window_or_chunk=param, mamba_cache_mode=cast(MambaCacheMode, mode),
                       num_speculative_blocks=num_spec, prefix_cacheable=cacheable, extra_retained_tokens=extra)


def read_groups(kv_cache_config: Any, max_num_batched_tokens: int, max_model_len: int) -> list[GroupInfo]:
    """Reads `kv_cache_config.kv_cache_groups` (vLLM's or ours) by duck typing.

    Returns one `GroupInfo` per group, in order. Raises TypeError when the
    config has no groups list or a group no spec, NotImplementedError for an
    unsupported spec type, ValueError for a bad spec field (named)."""
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
    """`kv_cache_config.num_blocks`; ValueError unless a positive int."""
    n = getattr(kv_cache_config, "num_blocks", None)
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise ValueError(f"kv_cache_config.num_blocks must be a positive int, got {n!r}")
    return n


RETENTION_ENV = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"


def read_retention_interval(groups: list[GroupInfo], scheduler_block_size: int) -> int | None:
    """VLLM_PREFIX_CACHE_RETENTION_INTERVAL as vLLM reads it under the
    whole-block-hits profile when it builds a manager (`int(...)` of the
    variable; unset: None, dense caching) and checks it: only a model with
    a sliding-window group, and a non-negative multiple of
    `scheduler_block_size`. ValueError otherwise."""
    raw = os.environ.get(RETENTION_ENV)
    if raw is None:
        return None
    try:
        interval = int(raw)
    except ValueError:
        raise ValueError(f"{RETENTION_ENV} must be an integer, got {raw!r}") from None
    if not any(g.native.kind == "sliding_window" for g in groups):
        raise ValueError(
            f"{RETENTION_ENV} is set but this model has no "
            "sliding-window KV cache group, so retention has no effect. Unset it "
            "(the feature only applies to sliding-window attention)."
        )
    if interval < 0 or interval % scheduler_block_size != 0:
        raise ValueError(
            f"{RETENTION_ENV} ({interval}) must be non-negative and a multiple of "
            f"scheduler_block_size ({scheduler_block_size})."
        )
    return interval
