"""KV-cache events and prefix-cache stats in vLLM's own classes when vLLM is
importable (so publishers, routers and metrics keep working), else in
look-alike classes with the same fields in the same order. Events follow a
release's shape (`EventBuilder(..., release=)`, the release's row in
`hybridcache.releases`): eleven `BlockStored` fields, or, for a release
with `event_extras`, fifteen (+ locality, ownership, session_id,
lookahead_token_ids; `BlockRemoved` + locality, ownership)."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from hybridcache import releases
from hybridcache.hashing import generate_block_hash_extra_keys

MEDIUM_GPU = "GPU"


@dataclass
class BlockStored:
    """KV event: blocks entered the prefix cache (vLLM's `BlockStored`, same
    fields in the same order). `block_hashes` and `parent_block_hash` are
    the low 64 bits as ints unless VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0
    (then bytes); `token_ids` are the blocks' tokens; `medium` is "GPU"."""

    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


@dataclass
class BlockRemoved:
    """KV event: a cached block was evicted (reused or `evict_blocks`) from
    group `group_idx` (vLLM's `BlockRemoved`)."""

    block_hashes: list[Any]
    medium: str | None
    group_idx: int | None = None


@dataclass
class BlockStoredExtras(BlockStored):
    """`BlockStored` of a release with `event_extras`: the eleven fields, then `locality` and
    `ownership` (None from the manager's pool), `session_id` (the
    request's) and `lookahead_token_ids` (each block's lookahead tokens, or
    None without lookahead hashes)."""

    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


@dataclass
class BlockRemovedExtras(BlockRemoved):
    """`BlockRemoved` of a release with `event_extras`: the three fields, then `locality`, `ownership`."""

    locality: str | None = None
    ownership: str | None = None


@dataclass
class AllBlocksCleared:
    """KV event: `reset_prefix_cache()` emptied the prefix cache (vLLM's
    `AllBlocksCleared`)."""


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookup counts (vLLM's `PrefixCacheStats`): `requests`
    looked up, `queries` (tokens looked up), `hits` (tokens found), the same
    for requests resumed after preemption (`preempted_*`), and `reset`
    (the cache was reset since the last report)."""

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """Counts one lookup of `num_tokens` tokens that found `num_hits`."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


def _vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


#: The releases whose event shapes `EventBuilder` builds (every row of the table).
EVENT_RELEASES: tuple[str, ...] = releases.SUPPORTED_VLLM_VERSIONS


def _release_of(profile: str) -> releases.Release:
    """The release row of a core profile (ValueError for an unknown one)."""
    try:
        return releases.of_profile(releases.profile_of(profile))
    except ValueError:
        raise ValueError(f"no KV-event shape for vLLM {profile!r} (known: {', '.join(EVENT_RELEASES)})") from None


def _installed_release() -> releases.Release | None:
    import vllm

    return releases.find(str(getattr(vllm, "__version__", "")) or None)


def event_classes(release: str | None = None) -> tuple[type, type, type]:
    """(BlockStored, BlockRemoved, AllBlocksCleared) of the release whose
    core profile is `release` (default: the oldest release's): vLLM's own
    when vLLM is importable and its classes have that release's fields (a
    shape without `event_extras`: any vLLM; with them: an installed release
    with `event_extras`), else look-alikes with those fields."""
    shape = _release_of(release or releases.DEFAULT.profile)
    if _vllm_available():
        installed = _installed_release() if shape.event_extras else None
        if not shape.event_extras or (installed is not None and installed.event_extras):
            from vllm.distributed import kv_events as ev

            return ev.BlockStored, ev.BlockRemoved, ev.AllBlocksCleared
    if not shape.event_extras:
        return BlockStored, BlockRemoved, AllBlocksCleared
    return BlockStoredExtras, BlockRemovedExtras, AllBlocksCleared


def prefix_cache_stats_class() -> type:
    """vLLM's `PrefixCacheStats` class when vLLM is importable, else ours."""
    if _vllm_available():
        from vllm.v1.metrics.stats import PrefixCacheStats as VllmStats

        return VllmStats
    return PrefixCacheStats


def external_hash(h: bytes) -> bytes | int:
    """vLLM's `maybe_convert_block_hash`: the low 64 bits as an int unless
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0."""
    if not int(os.getenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")):
        return h
    return int.from_bytes(h, "big") & ((1 << 64) - 1)


def _set_order(keys: list[tuple[bytes, int]]) -> list[tuple[bytes, int]]:
    """A block's extra keys (the core's partial-block entries), added in
    this order, in the order vLLM's pool emits their `BlockRemoved`: it
    keeps them in a `set` of `hash + group (4 bytes, big-endian)` keys, so
    the same set built the same way here iterates the same way."""
    held: set[bytes] = set()
    for h, g in keys:
        held.add(h + g.to_bytes(4, "big", signed=False))
    return [(k[:-4], int.from_bytes(k[-4:], "big", signed=False)) for k in held]


class EventSource:
    """What `EventBuilder.build` reads of a request, read at once (before
    the manager call that makes the events changes anything, so that a
    read that raises leaves the manager as it was)."""

    __slots__ = ("all_token_ids", "mm_features", "lora_request", "cache_salt", "prompt_embeds",
                 "_prompt_embeds_per_block_hashes", "session_id")

    def __init__(self, request: Any) -> None:
        """Reads `request`'s fields, as `build` would read them."""
        self.all_token_ids = request.all_token_ids
        self.mm_features = request.mm_features
        self.lora_request = request.lora_request
        self.cache_salt = request.cache_salt
        self.prompt_embeds = request.prompt_embeds
        self._prompt_embeds_per_block_hashes = (
            None if self.prompt_embeds is None else request._prompt_embeds_per_block_hashes
        )
        self.session_id = getattr(request, "session_id", None)


class EventBuilder:
    """Turns the core's event tuples into event objects of one vLLM
    release's shape, reading from the request of the call that produced
    them what only it knows (tokens, LoRA, extra keys; with `event_extras`:
    session id, lookahead tokens)."""

    def __init__(
        self,
        group_kinds: list[tuple[str, int | None]],
        release: str | None = None,
        num_hash_lookahead_tokens: int = 0,
        medium: str = MEDIUM_GPU,
    ) -> None:
        """`group_kinds`: (spec kind, sliding window or None) per group, as
        reported in `BlockStored` events. `release`: a core profile of the
        table (default: the oldest release's). A release with
        `event_extras` only: `num_hash_lookahead_tokens` (the block pool's:
        each block's extra keys cover its window, the block plus these
        tokens, which `lookahead_token_ids` lists) and the pool's `medium`."""
        release = release or releases.DEFAULT.profile
        self._extras = _release_of(release).event_extras
        self._stored, self._removed, self._cleared = event_classes(release)
        if not self._extras and (num_hash_lookahead_tokens or medium != MEDIUM_GPU):
            raise ValueError(f"vLLM {release}'s events have no lookahead tokens and report medium 'GPU'")
        if type(num_hash_lookahead_tokens) is not int or num_hash_lookahead_tokens < 0:
            raise ValueError(f"num_hash_lookahead_tokens must be an int >= 0, got {num_hash_lookahead_tokens!r}")
        self._group_kinds = group_kinds
        self._release = release
        self._lookahead = num_hash_lookahead_tokens
        self._medium = medium

    @property
    def release(self) -> str:
        """The vLLM release whose event shape this builds."""
        return self._release

    def build(self, raw: list[tuple], request: Any) -> list[Any]:
        """Event objects for the core's raw event tuples of one call on
        `request` (its tokens, LoRA and extra keys fill `BlockStored`):
        ("stored", hashes, parent, start, end, block_size, group, positions),
        ("removed", hash, group), ("removed_set", [(hash, group), ...]),
        ("cleared",)."""
        out = []
        for ev in raw:
            tag = ev[0]
            if tag == "stored":
                out.append(self._build_stored(ev, request))
            elif tag == "removed":
                out.append(self._build_removed(ev[1], ev[2]))
            elif tag == "removed_set":
                out.extend(self._build_removed(h, g) for h, g in _set_order(ev[1]))
            else:
                out.append(self._cleared())
        return out

    def _build_removed(self, block_hash: bytes, group: int) -> Any:
        if not self._extras:
            return self._removed(block_hashes=[external_hash(block_hash)], medium=MEDIUM_GPU, group_idx=group)
        return self._removed(
            block_hashes=[external_hash(block_hash)], medium=self._medium, group_idx=group, locality=None, ownership=None
        )

    def _build_stored(self, ev: tuple, request: Any) -> Any:
        # `block_size`: the group's, or a partial block's span (a partial
        # block cached by the core's `partial_block_entries`); `positions` count in units of it.
        _, hashes, parent, start, end, block_size, group, positions = ev
        la = self._lookahead
        extra: list[Any] = []
        mm_idx = 0
        for pos in positions:
            block_start, block_end = pos * block_size, (pos + 1) * block_size
            # A lookahead window overlaps the next block's: each block scans
            # from the first input (the index only skips inputs ending before
            # the block, so the keys are vLLM's rewound scan's).
            keys, next_idx = generate_block_hash_extra_keys(
                request, block_start, block_end + la, 0 if la else mm_idx, for_event=True
            )
            mm_idx = next_idx
            extra.append(keys)
        lora = getattr(request, "lora_request", None)
        kind, window = self._group_kinds[group]
        fields: dict[str, Any] = dict(
            block_hashes=[external_hash(h) for h in hashes],
            parent_block_hash=None if parent is None else external_hash(parent),
            token_ids=list(request.all_token_ids[start:end]),
            block_size=block_size,
            lora_id=lora.adapter_id if lora else None,
            medium=MEDIUM_GPU,
            lora_name=lora.name if lora else None,
            extra_keys=extra if extra else None,
            group_idx=group,
            kv_cache_spec_kind=kind,
            kv_cache_spec_sliding_window=window,
        )
        if self._extras:
            tokens = request.all_token_ids
            fields.update(
                medium=self._medium,
                locality=None,
                ownership=None,
                session_id=getattr(request, "session_id", None),
                lookahead_token_ids=[list(tokens[(p + 1) * block_size : (p + 1) * block_size + la]) for p in positions]
                if la
                else None,
            )
        return self._stored(**fields)
