"""KV-cache group layouts for the development tools: the wheel's `GroupSpec`
and config builders (`hybridcache.tools.configs`), and what builds, checks
and spells them: the group constructors, `check`, the compact text form
(`format_mix`, `parse_mix`: ``"full,sw:128@32,mamba:align:2,full+eagle"``)
and the two managers the whole-block-hits tools compare.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from hybridcache.tools.configs import GroupSpec, kv_cache_config



def hybridcache_kv_cache_config(groups: Any, num_blocks: int) -> Any:
    """hybridcache's own KVCacheConfig for resolved `groups` (no vLLM, no torch)."""
    return kv_cache_config(groups, num_blocks)


def vllm_kv_cache_config(groups: Any, num_blocks: int) -> Any:
    """vLLM's KVCacheConfig for resolved `groups` (imports vLLM and torch)."""
    return kv_cache_config(groups, num_blocks, vllm=True)


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


def check(g: GroupSpec) -> GroupSpec:
    """`g` with its kind spelled canonically; ValueError for a group vLLM cannot have."""
    kind = _KIND_ALIASES.get(g.kind)
    if kind is None:
        raise ValueError(f"unknown KV-cache group kind {g.kind!r}; one of {GROUP_KINDS}")
    g = dataclasses.replace(g, kind=kind)
    if g.block_size is not None and g.block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {g.block_size}")
    if kind == "sliding_window" and not (g.sliding_window or 0) >= 1:
        raise ValueError("a sliding_window group needs sliding_window >= 1")
    if kind == "chunked_local" and not (g.attention_chunk_size or 0) >= 1:
        raise ValueError("a chunked_local group needs attention_chunk_size >= 1")
    if kind == "mamba":
        if g.mamba_cache_mode not in (None, *MAMBA_MODES):
            raise ValueError(f"mamba_cache_mode must be one of {MAMBA_MODES}, got {g.mamba_cache_mode!r}")
        if g.num_speculative_blocks < 0:
            raise ValueError("num_speculative_blocks must be >= 0")
    return g


def format_group(g: GroupSpec) -> str:
    """One group's text form (`parse_mix` reads it)."""
    text = _SHORT_KIND[g.kind]
    if g.kind == "sliding_window":
        text += f":{g.sliding_window}"
    elif g.kind == "chunked_local":
        text += f":{g.attention_chunk_size}"
    elif g.kind == "mamba" and (g.mamba_cache_mode or g.num_speculative_blocks):
        text += f":{g.mamba_cache_mode or 'auto'}"
        if g.num_speculative_blocks:
            text += f":{g.num_speculative_blocks}"
    if g.block_size is not None:
        text += f"@{g.block_size}"
    if g.is_eagle_group:
        text += "+eagle"
    if g.half_precision:
        text += "+bf16"
    return text


def full(block_size: int | None = None, *, eagle: bool = False) -> GroupSpec:
    return check(GroupSpec("full", block_size, is_eagle_group=eagle))


def sliding_window(window: int, block_size: int | None = None, *, eagle: bool = False) -> GroupSpec:
    return check(GroupSpec("sliding_window", block_size, sliding_window=window, is_eagle_group=eagle))


def chunked_local(chunk: int, block_size: int | None = None, *, eagle: bool = False) -> GroupSpec:
    return check(GroupSpec("chunked_local", block_size, attention_chunk_size=chunk, is_eagle_group=eagle))


def mamba(
    mode: str | None = None,
    num_speculative_blocks: int = 0,
    block_size: int | None = None,
    *,
    eagle: bool = False,
) -> GroupSpec:
    return check(GroupSpec(
        "mamba",
        block_size,
        mamba_cache_mode=mode,
        num_speculative_blocks=num_speculative_blocks,
        is_eagle_group=eagle,
    ))


def cross_attention(block_size: int | None = None) -> GroupSpec:
    return check(GroupSpec("cross_attention", block_size))


def parse_mix(text: str) -> tuple[GroupSpec, ...]:
    """Parses a mix such as ``"full,sw:128@32,mamba:align:2,full+eagle"``.

    Comma-separated groups, each ``KIND[:ARGS][@BLOCK_SIZE][+eagle]``; ``*N``
    after a group repeats it. Kinds: ``full``; ``sw:WINDOW``;
    ``chunked:CHUNK``; ``mamba[:MODE[:NUM_SPECULATIVE_BLOCKS]]`` (MODE one of
    none/all/align/auto); ``cross``.
    """
    groups: list[GroupSpec] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise ValueError(f"empty group in mix {text!r}")
        repeat = 1
        if "*" in item:
            item, count = item.rsplit("*", 1)
            repeat = int(count)
        eagle = False
        if item.endswith("+eagle"):
            item, eagle = item[: -len("+eagle")], True
        block_size = None
        if "@" in item:
            item, size = item.split("@", 1)
            block_size = int(size)
        name, *args = item.split(":")
        kind = _KIND_ALIASES.get(name)
        try:
            if kind == "full" and not args:
                group = full(block_size, eagle=eagle)
            elif kind == "sliding_window" and len(args) == 1:
                group = sliding_window(int(args[0]), block_size, eagle=eagle)
            elif kind == "chunked_local" and len(args) == 1:
                group = chunked_local(int(args[0]), block_size, eagle=eagle)
            elif kind == "mamba" and len(args) <= 2:
                mode = args[0] if args and args[0] != "auto" else None
                nspec = int(args[1]) if len(args) > 1 else 0
                group = mamba(mode, nspec, block_size, eagle=eagle)
            elif kind == "cross_attention" and not args and not eagle:
                group = cross_attention(block_size)
            else:
                raise ValueError
        except ValueError as e:
            raise ValueError(f"cannot parse mix group {raw.strip()!r} ({e or 'bad arguments'})") from None
        groups.extend([group] * repeat)
    return tuple(groups)


def format_mix(groups: Iterable[GroupSpec]) -> str:
    return ",".join(format_group(g) for g in groups)


def hybridcache_manager(kv_cache_config: Any, kwargs: dict[str, Any]) -> Any:
    """hybridcache's facade of vLLM 0.23.0 on `kv_cache_config` (its own or
    vLLM's classes): `KVCacheManager` answering as vLLM's where a caller
    never calls `new_step_starts()` (None, not hybridcache's own error)."""
    from hybridcache.releases.v0_23.scheduler import VllmKVCacheManager

    return VllmKVCacheManager(kv_cache_config, **kwargs)


def vllm_manager(kv_cache_config: Any, kwargs: dict[str, Any]) -> Any:
    """vLLM's own KVCacheManager (the whole-block-hits keywords) on `kv_cache_config`."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    return KVCacheManager(kv_cache_config, **kwargs)


__all__ = ["GroupSpec", "check", "format_mix", "hybridcache_kv_cache_config", "hybridcache_manager", "parse_mix",
           "vllm_kv_cache_config", "vllm_manager"]
