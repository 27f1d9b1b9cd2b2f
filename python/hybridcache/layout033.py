"""Which KV-cache layouts hybridcache's vLLM 0.33.0 facade covers, in
0.33.0's terms: each group's spec by the 0.33.0 manager that runs it, the
layouts refused by name (NotImplementedError), 0.33.0's retention-interval
and context-parallel checks. `manager033.KVCacheManager033` asks these at
construction; the tools (`hybridcache replay`) ask the facade."""

from __future__ import annotations

from typing import Any

from hybridcache.manager import _positive_int

# Spec classes by the 0.33.0 manager this facade runs them as, and the
# classes refused (with what to call them). A spec's first class (in its
# MRO) found here decides: RSWASpec is a FullAttentionSpec subclass.
_FULL_ATTENTION_SPECS = ("FullAttentionSpec", "MLAAttentionSpec", "HiddenStateCacheSpec", "SinkFullAttentionSpec")
_SLIDING_WINDOW_SPECS = ("SlidingWindowSpec", "SlidingWindowMLASpec")
_CHUNKED_LOCAL_SPECS = ("ChunkedLocalAttentionSpec",)
_MAMBA_SPECS = ("MambaSpec",)
_REFUSED_SPECS = {
    "RSWASpec": "R-SWA (RSWASpec)",
    "CircularBufferSpec": "circular buffers (CircularBufferSpec)",
    "CrossAttentionSpec": "cross attention (CrossAttentionSpec)",
}


def layout_kind(spec: Any) -> str | None:
    """"full", "sliding_window", "chunked_local", "mamba", or None
    (refused or unknown)."""
    for cls in type(spec).__mro__:
        if cls.__name__ in _REFUSED_SPECS:
            return None
        if cls.__name__ in _FULL_ATTENTION_SPECS:
            return "full"
        if cls.__name__ in _SLIDING_WINDOW_SPECS:
            return "sliding_window"
        if cls.__name__ in _CHUNKED_LOCAL_SPECS:
            return "chunked_local"
        if cls.__name__ in _MAMBA_SPECS:
            return "mamba"
    return None


def _refused_name(spec: Any) -> str:
    for cls in type(spec).__mro__:
        if cls.__name__ in _REFUSED_SPECS:
            return _REFUSED_SPECS[cls.__name__]
    return type(spec).__name__


def check_layout(kv_cache_config: Any, hash_block_size: int, enable_caching: bool, dcp: int = 1) -> list[str]:
    """The groups' kinds, if the 0.33.0 facade covers this layout: full
    attention, sliding window and chunked local groups; NotImplementedError
    naming what it does not cover."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if not groups:
        raise NotImplementedError(
            "hybridcache's vLLM 0.33.0 support needs at least one KV cache group (attention-free "
            "models are not supported yet)"
        )
    kinds = []
    for i, g in enumerate(groups):
        spec = getattr(g, "kv_cache_spec", None)
        kind = layout_kind(spec)
        if kind is None:
            raise NotImplementedError(
                f"kv_cache_groups[{i}]: {_refused_name(spec)} is not supported by hybridcache's vLLM "
                "0.33.0 facade yet (it covers full attention, sliding window and chunked local "
                "groups, and Mamba beside full attention)"
            )
        if getattr(spec, "prefix_cacheable", True) is False:
            raise NotImplementedError(
                f"kv_cache_groups[{i}]: a group that is not prefix-cacheable ({type(spec).__name__}"
                f"{' with bounded_replay=True' if getattr(spec, 'bounded_replay', False) else ''}: vLLM 0.33.0 "
                "skips it in hits and caching) is not supported by hybridcache's vLLM 0.33.0 facade yet"
            )
        # A block holds block_size * dcp tokens (dcp > 1 only with one group).
        block_size = getattr(spec, "block_size", None)
        if block_size is not None:
            block_size *= dcp
        if kind == "full" and enable_caching and block_size != hash_block_size:
            raise NotImplementedError(
                f"kv_cache_groups[{i}]: a full-attention block of {block_size} tokens over hash blocks "
                f"of {hash_block_size} (vLLM 0.33.0 caches partial tail blocks and serves partial hash "
                "hits there) is not supported by hybridcache's vLLM 0.33.0 facade yet"
            )
        extra = getattr(spec, "extra_retained_tokens", None) or 0
        if kind == "sliding_window" and extra:
            raise NotImplementedError(
                f"kv_cache_groups[{i}]: extra_retained_tokens={extra} (multi-module "
                "MTP) is not supported by hybridcache's vLLM 0.33.0 facade yet"
            )
        if kind == "mamba" and getattr(spec, "mamba_cache_mode", "none") == "align":
            if enable_caching and block_size != hash_block_size:
                raise NotImplementedError(
                    f"kv_cache_groups[{i}]: a Mamba align block of {block_size} tokens over hash blocks of "
                    f"{hash_block_size} (vLLM 0.33.0's partial hash hits with copy-on-write) is not "
                    "supported by hybridcache's vLLM 0.33.0 facade yet"
                )
        kinds.append(kind)
    modes = [getattr(g.kv_cache_spec, "mamba_cache_mode", "none") for g, k in zip(groups, kinds) if k == "mamba"]
    _check_mamba_layout(kinds, enable_caching, modes)
    return kinds


def needs_zeroing(kv_cache_config: Any, kinds: list[str]) -> bool:
    """0.33.0's `KVCacheConfig.needs_kv_cache_zeroing`: Mamba layers, or
    attention caches in more than one precision (a block reused across
    groups would decode stale bytes); then new blocks are recorded for the
    worker to zero."""
    return "mamba" in kinds or bool(getattr(kv_cache_config, "has_mixed_precision_kv_cache", False))


def _check_mamba_layout(kinds: list[str], enable_caching: bool, modes: list[str] | None = None) -> None:
    """Mamba groups are covered beside full-attention and sliding-window
    groups: without prefix caching (0.33.0's KVCacheCoordinatorNoPrefixCache),
    and with it in "align" mode when every block is one hash block (no
    partial hash hits; `check_layout` refuses the others). 0.33.0 itself
    asserts that Mamba prefix caching runs in "align" mode (ValueError)."""
    if "mamba" not in kinds:
        return
    others = sorted(set(kinds) - {"mamba", "full", "sliding_window"})
    if others:
        raise NotImplementedError(
            f"Mamba groups beside {', '.join(others)} groups are not supported by hybridcache's vLLM "
            "0.33.0 facade yet (it covers Mamba beside full attention and sliding windows)"
        )
    if enable_caching and set(kinds) == {"mamba"}:
        raise NotImplementedError(
            "Mamba prefix caching without an attention group is not supported by hybridcache's vLLM 0.33.0 "
            "facade yet"
        )
    if enable_caching and any(m != "align" for m in modes or ()):
        raise ValueError("Mamba prefix caching requires mamba_cache_mode='align' (vLLM 0.33.0 asserts it)")


def check_retention(kv_cache_config: Any, scheduler_block_size: int, kinds: list[str]) -> int | None:
    """0.33.0's `prefix_cache_retention_interval` check (ValueError, its
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


def context_parallel(kv_cache_config: Any, dcp_world_size: int, pcp_world_size: int) -> tuple[int, int]:
    """The (dcp, pcp) the core scales blocks by, in 0.33.0's form: only dcp
    scales a block, and only of a dcp-sharded spec (every attention spec by
    default); pcp scales nothing (single_type_kv_cache_manager.py L107-109,
    L761-765; the scheduler passes pcp_world_size=1)."""
    dcp = _positive_int("dcp_world_size", dcp_world_size)
    _positive_int("pcp_world_size", pcp_world_size)
    if dcp == 1:
        return 1, 1
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or ())
    if len(groups) != 1:
        raise NotImplementedError(
            f"decode context parallelism (dcp_world_size={dcp}) with {len(groups)} KV cache groups is not "
            "supported by hybridcache's vLLM 0.33.0 facade yet (one full-attention group is)"
        )
    return (dcp if getattr(groups[0].kv_cache_spec, "dcp_sharded", True) else 1), 1


__all__ = ["check_layout", "check_retention", "context_parallel", "layout_kind", "needs_zeroing"]
