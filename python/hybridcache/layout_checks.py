"""Which KV-cache layouts hybridcache's facade covers for the releases
running the partial-block-hits profile, in those releases' vLLM terms:
each group's spec by the vLLM manager that runs it,
the layouts refused by name (NotImplementedError), the retention-interval
and context-parallel checks, and the zeroing decision.
`partial_hits_manager.PartialHitsManager` asks these at construction; the
tools (`hybridcache replay`) ask the facade."""

from __future__ import annotations

from typing import Any

from hybridcache.facade import _positive_int

# Spec classes by the vLLM manager this facade runs them as, and the
# classes refused (with what to call them). A spec's first class (in its
# MRO) found here decides: RSWASpec is a FullAttentionSpec subclass.
_FULL_ATTENTION_SPECS = ("FullAttentionSpec", "MLAAttentionSpec", "HiddenStateCacheSpec", "SinkFullAttentionSpec")
_SLIDING_WINDOW_SPECS = ("SlidingWindowSpec", "SlidingWindowMLASpec")
_CHUNKED_LOCAL_SPECS = ("ChunkedLocalAttentionSpec",)
_MAMBA_SPECS = ("MambaSpec",)
# Encoder-decoder models (Whisper): the states of the encoder, one static
# allocation per request, never cached (prefix caching is refused).
_CROSS_ATTENTION_SPECS = ("CrossAttentionSpec",)
# vLLM's RSWAManager and CircularBufferManager (new kinds of the core).
_OWN_KIND_SPECS = {"RSWASpec": "rswa", "CircularBufferSpec": "circular_buffer"}


def layout_kind(spec: Any) -> str | None:
    """"full", "rswa", "circular_buffer", "sliding_window", "chunked_local",
    "mamba", "cross_attention", or None (refused or unknown)."""
    for cls in type(spec).__mro__:
        if cls.__name__ in _OWN_KIND_SPECS:
            return _OWN_KIND_SPECS[cls.__name__]
        if cls.__name__ in _FULL_ATTENTION_SPECS:
            return "full"
        if cls.__name__ in _SLIDING_WINDOW_SPECS:
            return "sliding_window"
        if cls.__name__ in _CHUNKED_LOCAL_SPECS:
            return "chunked_local"
        if cls.__name__ in _MAMBA_SPECS:
            return "mamba"
        if cls.__name__ in _CROSS_ATTENTION_SPECS:
            return "cross_attention"
    return None


def check_layout(kv_cache_config: Any, enable_caching: bool) -> list[str]:
    """The groups' kinds, if the partial-block-hits facade covers this
    layout: full attention (R-SWA too), circular buffers, sliding window
    (bounded replay and extra retained tokens too) and chunked local groups,
    Mamba beside them; NotImplementedError naming what it does not cover."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if not groups:
        raise NotImplementedError(
            "hybridcache's facade for this vLLM release needs at least one KV cache group (attention-free "
            "models are not supported yet)"
        )
    kinds = []
    for i, g in enumerate(groups):
        spec = getattr(g, "kv_cache_spec", None)
        kind = layout_kind(spec)
        if kind is None:
            raise NotImplementedError(
                f"kv_cache_groups[{i}]: {type(spec).__name__} is not supported by hybridcache's "
                "facade for this vLLM release yet (it covers full attention, R-SWA, circular buffers, sliding window, "
                "chunked local and cross-attention groups, and Mamba beside full attention, sliding "
                "windows, chunked local attention and circular buffers)"
            )
        # A full-attention block wider than the hash block (several groups,
        # hash block = their gcd) needs no refusal: it caches the prompt's
        # partial tail (the core's `profile.partial_block_entries`).
        kinds.append(kind)
    # A Mamba align block wider than the hash block needs no refusal either:
    # hits on hash blocks (partial hash hits) or, beside a group looked up
    # at block granularity only, on scheduler blocks while its states are
    # still keyed inside blocks (the core's `coordinator/partial_hits.rs`
    # decides which, as vLLM's `partial_hash_hits_enabled`).
    modes = [getattr(g.kv_cache_spec, "mamba_cache_mode", "none") for g, k in zip(groups, kinds) if k == "mamba"]
    _check_mamba_layout(kinds, enable_caching, modes)
    return kinds


def needs_zeroing(kv_cache_config: Any, kinds: list[str], from_config: bool = False) -> bool:
    """Whether new blocks are recorded for the worker to zero. vLLM's
    `KVCacheConfig.needs_kv_cache_zeroing` property: Mamba layers, or
    attention caches in more than one precision (a block reused across
    groups would decode stale bytes). `from_config` (the row's
    `zeroing_from_config`): the config's `needs_kv_cache_zeroing`
    field as it is, which the engine ORs over every worker's config (one
    worker needing it makes all record); the rule where the config has no
    such field."""
    rule = "mamba" in kinds or bool(getattr(kv_cache_config, "has_mixed_precision_kv_cache", False))
    if from_config:
        return bool(getattr(kv_cache_config, "needs_kv_cache_zeroing", rule))
    return rule


def _check_mamba_layout(kinds: list[str], enable_caching: bool, modes: list[str] | None = None) -> None:
    """Mamba groups are covered alone and beside full-attention,
    sliding-window, chunked-local and circular-buffer groups: without prefix
    caching (vLLM's KVCacheCoordinatorNoPrefixCache), and with it in
    "align" mode (a Mamba block spanning hash blocks too: states keyed
    inside blocks, copy-on-write). vLLM itself asserts that Mamba prefix
    caching runs in "align" mode (ValueError). Beside R-SWA or cross
    attention (no such model, and unproven): refused by name."""
    if "mamba" not in kinds:
        return
    others = sorted(set(kinds) - {"mamba", "full", "sliding_window", "chunked_local", "circular_buffer"})
    if others:
        raise NotImplementedError(
            f"Mamba groups beside {', '.join(others)} groups are not supported by hybridcache's "
            "facade for this vLLM release yet (it covers Mamba alone and beside full attention, sliding windows, "
            "chunked local attention and circular buffers)"
        )
    if enable_caching and any(m != "align" for m in modes or ()):
        raise ValueError("Mamba prefix caching requires mamba_cache_mode='align' (vLLM asserts it)")


def check_retention(kv_cache_config: Any, scheduler_block_size: int, kinds: list[str]) -> int | None:
    """vLLM's `prefix_cache_retention_interval` check (ValueError, its
    messages); the interval the core applies (None: dense; without a
    sliding-window group 0 caches densely too)."""
    interval = getattr(kv_cache_config, "prefix_cache_retention_interval", None)
    if interval is None:
        return None
    if "sliding_window" not in kinds and "mamba" not in kinds:
        if interval == 0:
            return None
        raise ValueError(
            "prefix_cache_retention_interval is set but this model has no sliding-window or Mamba KV "
            "cache group, so retention has no effect. Set it to 0 (it only applies to sliding-window "
            "and Mamba attention)."
        )
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 0 or interval % scheduler_block_size:
        raise ValueError(
            f"prefix_cache_retention_interval ({interval}) must be non-negative and a multiple of "
            f"scheduler_block_size ({scheduler_block_size})."
        )
    return int(interval)


def assigned_retention(interval: Any, kinds: list[str]) -> int | None:
    """The interval the core applies for one assigned to
    `coordinator.retention_interval` after construction, which vLLM does
    not check against the block size: None (dense) or an int >= 0
    (TypeError / ValueError otherwise); without a sliding-window or Mamba
    group it changes nothing (dense)."""
    if interval is None:
        return None
    if isinstance(interval, bool) or not isinstance(interval, int):
        raise TypeError(f"coordinator.retention_interval must be None or an int, got {type(interval).__name__}")
    if interval < 0:
        raise ValueError(f"coordinator.retention_interval must be None or >= 0, got {interval}")
    if "sliding_window" not in kinds and "mamba" not in kinds:
        return None
    return int(interval)


def context_parallel(kv_cache_config: Any, dcp_world_size: int, pcp_world_size: int,
                     enable_caching: bool) -> tuple[int, ...]:
    """How many times its spec's `block_size` tokens each group's block
    holds, in vLLM's form: dcp for a dcp-sharded spec (every attention spec
    by default), 1 for a replicated one (Mamba); pcp scales nothing (the
    partial-block-hits releases' scheduler passes pcp_world_size=1): vLLM's
    single_type_kv_cache_manager.py L107-109,
    kv_cache_utils.resolve_dcp_kv_block_size. The facade scales the groups
    by these before the core sees them (the whole-block-hits releases' rule,
    every group times dcp * pcp, is the core's `context_parallel_groups`).
    ValueError where vLLM asserts: its hybrid coordinator takes context
    parallelism for full attention and replicated groups only, and its sliding-window,
    chunked-local and Mamba hit searches assert dcp == 1 for a dcp-sharded
    group."""
    dcp = _positive_int("dcp_world_size", dcp_world_size)
    pcp = _positive_int("pcp_world_size", pcp_world_size)
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or ())
    specs = [getattr(g, "kv_cache_spec", None) for g in groups]
    sharded = [bool(getattr(spec, "dcp_sharded", True)) for spec in specs]
    if enable_caching and dcp * pcp > 1:
        for i, (spec, shard) in enumerate(zip(specs, sharded)):
            kind = layout_kind(spec)
            full = kind in ("full", "rswa")  # RSWASpec is a FullAttentionSpec
            if len(groups) > 1 and not full and (shard or (pcp > 1 and kind == "mamba")):
                raise ValueError(
                    f"kv_cache_groups[{i}]: dcp_world_size={dcp}, pcp_world_size={pcp} with a "
                    f"{type(spec).__name__} group: vLLM's hybrid coordinator supports context "
                    "parallelism only for full-attention and replicated (dcp_sharded=False) groups "
                    "(and replicated attention groups only under pcp)"
                )
            if dcp > 1 and shard and not full:
                raise ValueError(
                    f"kv_cache_groups[{i}]: dcp_world_size={dcp} with a dcp-sharded {type(spec).__name__} "
                    "group and prefix caching: vLLM's hit search for it asserts dcp == 1"
                )
    return tuple(dcp if shard else 1 for shard in sharded)


__all__ = ["assigned_retention", "check_layout", "check_retention", "context_parallel", "layout_kind", "needs_zeroing"]
