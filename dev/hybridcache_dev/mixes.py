"""`parse_mix`: the compact text form of a KV-cache group layout
(`hybridcache.tools.configs.format_mix` writes it) read back, for the
replay's configurations and CLI."""

from __future__ import annotations

from hybridcache.tools.configs import (
    _KIND_ALIASES,
    GroupSpec,
    chunked_local,
    cross_attention,
    full,
    mamba,
    sliding_window,
)


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
