"""Seeded scheduler-like traces replayed against KVCacheManager implementations.

A small, deterministic scheduler simulation (not vLLM's scheduler, but driving
the manager the way vLLM 0.23.0's ``Scheduler.schedule`` does) issues every
public call of vLLM's v1 ``KVCacheManager`` API: prefix-cache lookups, chunked
prefill, speculative decoding with changing draft counts, EAGLE lookahead,
external (connector) tokens, delayed caching, preemption, aborts, evictions
and prefix-cache resets.

The model's KV-cache groups are described by a *mix* (``ReplayConfig.mix``):
full attention, sliding window, chunked local attention, Mamba (``none`` /
``all`` / ``align``, with speculative blocks) and cross attention, each with its
own block size and EAGLE flag. One simulation serves every mix; where vLLM's
scheduler treats hybrid models specially the simulation does too (Mamba
"align" block-aligned prefill chunks, ``new_step_starts`` every step, encoder
tokens for cross attention, no partial KV-load failures with several groups).

``replay`` applies each operation to several managers at once (same request
objects) and raises ``ReplayDivergence`` on the first differing output;
``run_single`` drives one manager and times it.

Nothing here imports torch or vLLM at module import time; ``vllm_factory``
imports both when called, ``hybridcache_factory`` neither.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .request import LoRARequest, Request

ManagerFactory = Callable[["ReplayConfig"], Any]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------
# KV-cache group mixes.
# --------------------------------------------------------------------------

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
    (vLLM forces "none" when prefix caching is off).
    """

    kind: str = "full"
    block_size: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    mamba_cache_mode: str | None = None
    num_speculative_blocks: int = 0
    is_eagle_group: bool = False

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
        kind, *args = item.split(":")
        kind = _KIND_ALIASES.get(kind)
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
    return ",".join(str(g) for g in groups)


@dataclass
class ReplayConfig:
    """Shape of the simulated workload and of the managers under test.

    ``hash_block_size``, ``scheduler_block_size`` and ``num_lookahead_tokens``
    of None are resolved in place, as vLLM resolves them; use ``with_changes``
    (not ``dataclasses.replace``) to derive a config that re-resolves them.
    """

    num_blocks: int = 64
    # Block size of every group that does not set its own.
    block_size: int = 16
    # The model's KV-cache groups: GroupSpecs or a parse_mix string.
    mix: Any = (GroupSpec(),)
    # None: as vLLM's resolve_kv_cache_block_sizes (one group: its block
    # size; several: the GCD of their block sizes with prefix caching, else
    # the scheduler block size).
    hash_block_size: int | None = None
    # None: the LCM of the groups' block sizes.
    scheduler_block_size: int | None = None
    max_model_len: int = 512
    max_num_batched_tokens: int = 256
    enable_caching: bool = True
    enable_kv_cache_events: bool = True
    use_eagle: bool = False
    log_stats: bool = True
    num_requests: int = 60
    max_running: int = 8
    max_arrivals_per_step: int = 3
    min_prompt_len: int = 1
    max_prompt_len: int = 300
    max_output_len: int = 64
    vocab_size: int = 1000
    # Shared prefixes make prefix-cache hits (and shared blocks) common.
    num_shared_prefixes: int = 4
    max_shared_prefix_len: int = 240
    shared_prefix_prob: float = 0.7
    duplicate_prompt_prob: float = 0.1
    max_drafts: int = 8
    # None: max_drafts when use_eagle (as vLLM's scheduler does), else 0.
    num_lookahead_tokens: int | None = None
    eos_prob: float = 0.02
    lora_prob: float = 0.05
    cache_salt_prob: float = 0.05
    skip_prefix_cache_prob: float = 0.03
    # Reusing the id of a request already freed is legal and catches state
    # keyed by request id that outlives free().
    reuse_request_id_prob: float = 0.1
    external_tokens_prob: float = 0.15
    async_load_prob: float = 0.3
    full_sequence_must_fit_prob: float = 0.2
    reserved_blocks_prob: float = 0.1
    abort_prob: float = 0.03
    evict_prob: float = 0.08
    reset_prob: float = 0.03
    remove_skipped_prob: float = 0.05
    # Encoder length of each request when the mix has a cross-attention group.
    max_encoder_len: int = 48
    # Also compare every block's ref_cnt and hash and the free-queue order
    # (vLLM's BlockPool attributes that connectors read) after every step.
    compare_pool_state: bool = True
    # ... and after every operation (slow; for pinning down a divergence).
    compare_pool_every_op: bool = False
    max_steps: int = 20_000
    # The resolved groups (block sizes and Mamba modes filled in).
    groups: tuple[GroupSpec, ...] = field(init=False, repr=False, compare=False)
    _auto: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.mix = parse_mix(self.mix) if isinstance(self.mix, str) else tuple(self.mix)
        if not self.mix or not all(isinstance(g, GroupSpec) for g in self.mix):
            raise ValueError("mix must be a non-empty sequence of GroupSpec (or a parse_mix string)")
        self._auto = frozenset(
            name
            for name in ("hash_block_size", "scheduler_block_size", "num_lookahead_tokens")
            if getattr(self, name) is None
        )
        self.groups = tuple(self._resolve_group(g) for g in self.mix)
        sizes = [g.block_size for g in self.groups]
        if self.scheduler_block_size is None:
            self.scheduler_block_size = math.lcm(*sizes)
        if self.hash_block_size is None:
            self.hash_block_size = self._default_hash_block_size()
        if self.num_lookahead_tokens is None:
            self.num_lookahead_tokens = self.max_drafts if self.use_eagle else 0
        self._validate()

    # ---- resolution -------------------------------------------------------

    def _resolve_group(self, g: GroupSpec) -> GroupSpec:
        if g.kind != "mamba":
            return g if g.block_size is not None else dataclasses.replace(g, block_size=self.block_size)
        mode = g.mamba_cache_mode or ("align" if self.enable_caching else "none")
        if (mode == "none") == self.enable_caching:
            raise ValueError(
                f"mamba_cache_mode {mode!r} with enable_caching={self.enable_caching}: vLLM uses "
                "'none' exactly when prefix caching is off"
            )
        block_size = g.block_size
        if block_size is None:
            # vLLM: max_model_len without prefix caching, else the attention
            # block size (cache_config.block_size).
            block_size = self.max_model_len if mode == "none" else self.block_size
        return dataclasses.replace(g, block_size=block_size, mamba_cache_mode=mode)

    def _default_hash_block_size(self) -> int:
        """vLLM's resolve_kv_cache_block_sizes."""
        sizes = [g.block_size for g in self.groups]
        if len(sizes) == 1 or not self.enable_caching:
            return self.scheduler_block_size
        if any(g.kind == "mamba" and g.block_size != self.split_block_size for g in self.groups):
            return self.scheduler_block_size
        return math.gcd(*sizes)

    def _validate(self) -> None:
        sizes = [g.block_size for g in self.groups]
        if any(self.scheduler_block_size % s for s in sizes) or self.scheduler_block_size % self.hash_block_size:
            raise ValueError(
                f"scheduler_block_size {self.scheduler_block_size} must be a multiple of every "
                f"group block size {sizes} and of hash_block_size {self.hash_block_size}"
            )
        if self.enable_caching:
            if len(sizes) == 1 and self.hash_block_size != sizes[0]:
                raise ValueError("with one group vLLM requires hash_block_size == block_size")
            if any(s % self.hash_block_size for s in sizes):
                raise ValueError(f"every group block size {sizes} must be a multiple of hash_block_size")
        modes = {g.mamba_cache_mode for g in self.groups if g.kind == "mamba"}
        if len(modes) > 1:
            raise ValueError("vLLM has one mamba_cache_mode for the whole model")
        kinds = {g.kind for g in self.groups}
        specs = {dataclasses.replace(g, is_eagle_group=False) for g in self.groups}
        if self.enable_caching and len(self.groups) > 1 and len(specs) < 2:
            raise ValueError("vLLM's hybrid coordinator needs at least two distinct group specs")
        full_sizes = {g.block_size for g in self.groups if g.kind == "full"}
        if self.enable_caching and len(full_sizes) > 1:
            # vLLM 0.23.0's HybridKVCacheCoordinator.find_longest_cache_hit
            # truncates only the first full-attention spec group to the final
            # hit length; another one keeps longer hits, and allocate_slots
            # then asks its BlockPool for a negative number of blocks, which
            # corrupts the free-block count. No legal trace exists.
            raise ValueError("vLLM 0.23.0 mishandles full attention groups of different block sizes")
        if "cross_attention" in kinds and self.enable_caching:
            raise ValueError("vLLM disables prefix caching for cross attention (encoder-decoder)")
        if "chunked_local" in kinds and self.enable_caching:
            eagle = self.eagle_group_ids
            for i, g in enumerate(self.groups):
                if g.kind != "chunked_local":
                    continue
                if g.block_size != self.scheduler_block_size:
                    raise ValueError("vLLM requires chunked local attention's block size to be the scheduler's")
                if i in eagle or any(j in eagle for j, o in enumerate(self.groups) if o == g):
                    raise ValueError("vLLM does not support EAGLE on chunked local attention groups")
        if self.num_blocks - 1 < self.min_num_blocks():
            raise ValueError(
                f"num_blocks {self.num_blocks}: one max_model_len request needs "
                f"{self.min_num_blocks()} blocks besides the null block"
            )
        if not 1 <= self.min_prompt_len <= self.max_prompt_len < self.max_model_len:
            raise ValueError("need 1 <= min_prompt_len <= max_prompt_len < max_model_len")

    # ---- derived ----------------------------------------------------------

    @property
    def split_block_size(self) -> int:
        """vLLM's cache_config.block_size after KV-cache setup (the smallest
        group block size): the granularity of Mamba "align" prefill chunks."""
        return min(g.block_size for g in self.groups)

    @property
    def mamba_align(self) -> bool:
        """vLLM's Scheduler.need_mamba_block_aligned_split."""
        return any(g.kind == "mamba" and g.mamba_cache_mode == "align" for g in self.groups)

    @property
    def has_cross_attention(self) -> bool:
        return any(g.kind == "cross_attention" for g in self.groups)

    @property
    def eagle_group_ids(self) -> set[int]:
        """Groups that drop the EAGLE block on hits (vLLM's coordinator rule)."""
        ids = {i for i, g in enumerate(self.groups) if g.is_eagle_group}
        if self.use_eagle and not ids:
            ids = set(range(len(self.groups)))
        return ids

    def min_num_blocks(self) -> int:
        """Blocks one request of max_model_len tokens may hold (all groups)."""
        extra = self.max_drafts + self.num_lookahead_tokens
        total = 0
        for g in self.groups:
            bs, length = g.block_size, self.max_model_len
            if g.kind == "full":
                total += _cdiv(length, bs)
            elif g.kind == "cross_attention":
                total += _cdiv(self.max_encoder_len, bs)
            elif g.kind == "sliding_window":
                window = g.sliding_window - 1 + self.max_num_batched_tokens + extra
                total += _cdiv(min(window, length), bs) + 1
            elif g.kind == "chunked_local":
                chunk = g.attention_chunk_size + self.max_num_batched_tokens + extra
                total += _cdiv(min(chunk, length), bs) + 1
            elif g.mamba_cache_mode == "all":
                total += _cdiv(length, bs) + g.num_speculative_blocks
            elif g.mamba_cache_mode == "align":
                total += 2 + g.num_speculative_blocks
            else:
                total += _cdiv(length, bs) + g.num_speculative_blocks
        return total

    def with_changes(self, **changes: Any) -> ReplayConfig:
        """dataclasses.replace that re-resolves the fields that were None."""
        reset = {name: None for name in self._auto if name not in changes}
        return dataclasses.replace(self, **reset, **changes)

    def describe(self) -> str:
        return (
            f"mix={format_mix(self.groups)} scheduler_block_size={self.scheduler_block_size} "
            f"hash_block_size={self.hash_block_size} caching={self.enable_caching} "
            f"eagle={self.use_eagle} lookahead={self.num_lookahead_tokens} max_drafts={self.max_drafts}"
        )

    def manager_kwargs(self) -> dict[str, Any]:
        """Constructor keyword arguments shared by every manager implementation."""
        return dict(
            max_model_len=self.max_model_len,
            scheduler_block_size=self.scheduler_block_size,
            hash_block_size=self.hash_block_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_caching=self.enable_caching,
            use_eagle=self.use_eagle,
            log_stats=self.log_stats,
            enable_kv_cache_events=self.enable_kv_cache_events,
        )


DEFAULT_CONFIG = ReplayConfig(num_requests=400, max_drafts=4)

# Mixes of the CLI's --mix presets (also usable as --mix NAME).
MIX_PRESETS: dict[str, str] = {
    "full": "full",
    "full-sw": "full,sw:64",
    "full-mamba": "full,mamba",
    "full-mamba-spec": "full,mamba:align:2",
    "sw-mamba": "sw:64,mamba",
    "full-sw-mamba": "full,sw:64,mamba",
    "full-mamba3": "full,mamba*3",
    "interleaved": "full,sw:48,full,sw:48",
    "two-windows": "full,sw:32,sw:96",
    "chunked": "full,chunked:64",
    "mixed-sizes": "full@16,sw:64@32",
}



@dataclass
class ReplaySummary:
    seed: int
    steps: int = 0
    ops: int = 0
    finished: int = 0
    aborted: int = 0
    preemptions: int = 0
    cache_hit_tokens: int = 0
    events: int = 0
    failed_allocations: int = 0
    evict_calls: int = 0
    successful_resets: int = 0
    stalls: int = 0
    # Requests admitted with a local prefix-cache hit.
    hit_requests: int = 0
    # Scheduled draft tokens (speculative decoding).
    draft_tokens: int = 0
    external_tokens: int = 0
    async_loads: int = 0
    # Mamba "align": chunks shortened to a block boundary / not scheduled.
    split_trims: int = 0
    split_blocked: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ReplayDivergence(AssertionError):
    """Two managers answered the same operation differently."""

    def __init__(self, seed: int, step: int, op: str, values: Sequence[tuple[str, Any]]):
        self.seed, self.step, self.op, self.values = seed, step, op, list(values)
        shown = "\n".join(f"  {name}: {value!r}" for name, value in self.values)
        ref = self.values[0][1]
        odd = next((v for _, v in self.values[1:] if v != ref), ref)
        where = _first_difference(ref, odd)
        super().__init__(f"divergence at seed={seed} step={step} op={op}{where}\n{shown}")


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    """Locates the first differing element of two nested tuples, for big values."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
        if len(a) != len(b):
            return f" (lengths differ at {path or 'top'}: {len(a)} != {len(b)})"
    if not path:
        return ""
    return f" (first difference at {path}: {a!r} != {b!r})"


# --------------------------------------------------------------------------
# Output normalization: implementation-neutral, comparable values.
# --------------------------------------------------------------------------

_STATS_FIELDS = (
    "reset",
    "requests",
    "queries",
    "hits",
    "preempted_requests",
    "preempted_queries",
    "preempted_hits",
)

# Field order of vLLM's msgspec events, for event objects that are not Structs.
_EVENT_FIELDS = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}


def _freeze(value: Any) -> Any:
    """Lists and tuples compare alike (msgspec encodes both as arrays)."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def norm_blocks(blocks: Any) -> tuple[tuple[int, ...], ...] | None:
    if blocks is None:
        return None
    return tuple(tuple(group) for group in blocks.get_block_ids())


def norm_allocated(blocks: Any) -> Any:
    """Block ids, plus which of them are still unhashed (not yet cached)."""
    if blocks is None:
        return None
    return norm_blocks(blocks), _freeze(blocks.get_unhashed_block_ids_all_groups())


def norm_computed(result: tuple[Any, int]) -> tuple[Any, int]:
    blocks, num_hit_tokens = result
    return norm_blocks(blocks), num_hit_tokens


def _event_field_names(event: Any) -> Sequence[str]:
    names = getattr(type(event), "__struct_fields__", None)  # msgspec.Struct
    if names is not None:
        return names
    if dataclasses.is_dataclass(event):
        return [f.name for f in dataclasses.fields(event)]
    return _EVENT_FIELDS.get(type(event).__name__, sorted(vars(event)))


def norm_event(event: Any) -> tuple[str, tuple[tuple[str, Any], ...]]:
    names = _event_field_names(event)
    return type(event).__name__, tuple((n, _freeze(getattr(event, n))) for n in names)


def norm_events(events: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(norm_event(e) for e in events)


def norm_stats(stats: Any) -> tuple[tuple[str, Any], ...] | None:
    if stats is None:
        return None
    return tuple((name, getattr(stats, name)) for name in _STATS_FIELDS)


def pool_state(manager: Any) -> tuple[Any, ...]:
    """(ref_cnt, block_hash) of every block and the free queue's order."""
    pool = manager.block_pool
    blocks = tuple((b.ref_cnt, b.block_hash) for b in pool.blocks)
    free_order = tuple(b.block_id for b in pool.free_block_queue.get_all_free_blocks())
    return blocks, free_order


def norm_usage(usage: float) -> float:
    # Tolerate float formulas that are equal in exact arithmetic.
    return round(float(usage), 9)


def norm_ids(ids: Sequence[int]) -> tuple[int, ...]:
    return tuple(ids)


def _same(value: Any) -> Any:
    return value


# --------------------------------------------------------------------------
# Fan-out: one operation, every manager, compared.
# --------------------------------------------------------------------------


class _Fanout:
    """Applies an operation to every manager and checks they agree.

    Manager 0 is the reference: if it raises, the trace itself is illegal and
    the exception propagates unchanged (a generator bug, not a divergence).
    """

    def __init__(
        self,
        managers: Sequence[Any],
        names: Sequence[str],
        seed: int,
        check_pool_every_op: bool = False,
    ):
        self.managers = list(managers)
        self.names = list(names)
        self.seed = seed
        self.step = 0
        self.ops = 0
        # Compare the pools after every operation (slow; pins a divergence
        # that no return value shows to the call that caused it).
        self.check_pool_every_op = check_pool_every_op and len(self.managers) > 1

    def call(
        self, op: str, fn: Callable[[Any, int], Any], norm: Callable[[Any], Any] = _same
    ) -> list[Any]:
        self.ops += 1
        results, normalized = [], []
        for i, mgr in enumerate(self.managers):
            try:
                result = fn(mgr, i)
                value = norm(result)
            except Exception as exc:
                if i == 0:
                    # An illegal trace (a generator bug): say where it went wrong.
                    exc.add_note(f"reference {self.names[0]} raised at seed={self.seed} step={self.step} op={op}")
                    raise
                result, value = exc, ("raised", type(exc).__name__, str(exc))
            results.append(result)
            normalized.append(value)
        if any(v != normalized[0] for v in normalized[1:]):
            raise ReplayDivergence(
                self.seed, self.step, op, list(zip(self.names, normalized))
            )
        if self.check_pool_every_op:
            pools = [pool_state(m) for m in self.managers]
            if any(p != pools[0] for p in pools[1:]):
                raise ReplayDivergence(
                    self.seed, self.step, f"block_pool state after {op}", list(zip(self.names, pools))
                )
        return results


# --------------------------------------------------------------------------
# The scheduler simulation.
# --------------------------------------------------------------------------


def _later_group_free_hit(blocks: Any) -> bool:
    """A hit block of group 1+ sits free in the pool (ref count 0)."""
    if blocks is None:
        return False
    return any(not b.is_null and b.ref_cnt == 0 for group in blocks.blocks[1:] for b in group)


@dataclass(eq=False)
class _Seq:
    """Simulator-side state of one request."""

    req: Request
    max_tokens: int
    drafts: int = 0  # draft tokens proposed for the next step
    load_steps: int = 0  # remaining steps of an async KV load
    encoder_tokens: int = 0  # cross attention: encoder length

    @property
    def rid(self) -> str:
        return self.req.request_id


class _Simulation:
    def __init__(self, config: ReplayConfig, seed: int, fanout: _Fanout):
        self.cfg = config
        self.rng = random.Random(seed)
        self.fan = fanout
        self.summary = ReplaySummary(seed=seed)
        self.prefixes = [self._prefix() for _ in range(config.num_shared_prefixes)]
        self.prompts: list[list[int]] = []
        self.next_req = 0
        self.freed_ids: list[str] = []
        self.waiting: list[_Seq] = []
        self.running: list[_Seq] = []
        self.loading: list[_Seq] = []  # async KV loads in flight
        self.idle_steps = 0
        self.preempted_this_step = False

    # ---- workload -------------------------------------------------------

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(self.cfg.vocab_size) for _ in range(n)]

    def _prefix(self) -> list[int]:
        cfg = self.cfg
        n = self.rng.randint(1, min(cfg.max_shared_prefix_len, cfg.max_prompt_len))
        if self.rng.random() < 0.5:  # aligned prefixes give whole-block hits
            align = cfg.scheduler_block_size
            n = max(align, n - n % align)
        return self._tokens(min(n, cfg.max_prompt_len))

    def _prompt(self) -> list[int]:
        cfg, rng = self.cfg, self.rng
        if self.prompts and rng.random() < cfg.duplicate_prompt_prob:
            return list(rng.choice(self.prompts))
        n = rng.randint(cfg.min_prompt_len, cfg.max_prompt_len)
        prompt: list[int] = []
        if self.prefixes and rng.random() < cfg.shared_prefix_prob:
            prompt = list(rng.choice(self.prefixes)[:n])
        prompt += self._tokens(n - len(prompt))
        self.prompts.append(prompt)
        return prompt

    def _new_seq(self) -> _Seq:
        cfg, rng = self.cfg, self.rng
        lora = None
        if rng.random() < cfg.lora_prob:
            lora_id = rng.randint(1, 2)
            lora = LoRARequest(f"lora{lora_id}", lora_id)
        salt = f"salt{rng.randint(0, 1)}" if rng.random() < cfg.cache_salt_prob else None
        req = Request(
            self._request_id(),
            self._prompt(),
            cfg.hash_block_size,
            lora_request=lora,
            cache_salt=salt,
            skip_reading_prefix_cache=rng.random() < cfg.skip_prefix_cache_prob,
        )
        self.next_req += 1
        seq = _Seq(req, max_tokens=rng.randint(1, cfg.max_output_len))
        if cfg.has_cross_attention:
            seq.encoder_tokens = rng.randint(1, cfg.max_encoder_len)
        return seq

    def _request_id(self) -> str:
        if self.freed_ids and self.rng.random() < self.cfg.reuse_request_id_prob:
            return self.freed_ids.pop(self.rng.randrange(len(self.freed_ids)))
        return f"req-{self.next_req}"

    def _arrive(self) -> None:
        for _ in range(self.rng.randint(0, self.cfg.max_arrivals_per_step)):
            if self.next_req < self.cfg.num_requests:
                self.waiting.append(self._new_seq())

    def _done(self) -> bool:
        return self.next_req >= self.cfg.num_requests and not (
            self.waiting or self.running or self.loading
        )

    # ---- manager calls --------------------------------------------------

    def _free(self, seq: _Seq) -> None:
        self.fan.call(f"free({seq.rid})", lambda m, i: m.free(seq.req))

    def _allocate(self, seq: _Seq, num_new_tokens: int, computed=None, **kw) -> Any:
        """allocate_slots on every manager; `computed` holds per-manager blocks."""
        op = f"allocate_slots({seq.rid}, {num_new_tokens}, {kw})"

        def call(m: Any, i: int) -> Any:
            blocks = computed[i] if computed is not None else None
            return m.allocate_slots(seq.req, num_new_tokens, new_computed_blocks=blocks, **kw)

        result = self.fan.call(op, call, norm_allocated)[0]
        if result is None:
            self.summary.failed_allocations += 1
        return result

    def _holders(self) -> list[_Seq]:
        """Requests that may hold blocks."""
        return self.running + self.loading + [s for s in self.waiting if s.req.num_computed_tokens]

    # ---- one step -------------------------------------------------------

    def step(self) -> None:
        self.fan.step = self.summary.steps
        self._arrive()
        self.fan.call("new_step_starts", lambda m, i: m.new_step_starts())
        self._maintenance()
        self._finish_loads()
        scheduled: dict[str, int] = {}
        self.preempted_this_step = False
        budget = self._schedule_running(scheduled, self.cfg.max_num_batched_tokens)
        if not self.preempted_this_step:  # as vLLM: no admissions after preempting
            self._schedule_waiting(scheduled, budget)
        self._observe_schedule()
        self._apply_outputs(scheduled)
        self._observe_step()
        self._break_stalls(scheduled)
        self.summary.steps += 1

    def _maintenance(self) -> None:
        """Out-of-band calls: aborts, evictions, resets, window trimming."""
        cfg, rng = self.cfg, self.rng
        if self.waiting and rng.random() < cfg.abort_prob:
            self._abort(self.waiting, rng.randrange(len(self.waiting)))
        if self.running and rng.random() < cfg.abort_prob:
            self._abort(self.running, rng.randrange(len(self.running)))
        if self.loading and rng.random() < cfg.abort_prob:
            self._abort(self.loading, rng.randrange(len(self.loading)))
        if rng.random() < cfg.evict_prob:
            self._evict()
        idle = not self._holders()
        if rng.random() < (0.3 if idle else cfg.reset_prob):
            self._reset()
        if self.running and rng.random() < cfg.remove_skipped_prob:
            # What a finishing connector request does (and what allocate_slots
            # does first), out of band.
            seq = rng.choice(self.running)
            n = seq.req.num_computed_tokens
            self.fan.call(
                f"remove_skipped_blocks({seq.rid}, {n})",
                lambda m, i: m.remove_skipped_blocks(seq.rid, n),
            )

    def _abort(self, queue: list[_Seq], index: int) -> None:
        seq = queue.pop(index)
        self._free(seq)
        self.freed_ids.append(seq.rid)
        self.summary.aborted += 1

    def _evict(self) -> None:
        rng, holders = self.rng, self._holders()
        if holders and rng.random() < 0.5:
            # Target blocks in use (any group), which are likely cached.
            seq = rng.choice(holders)
            groups = self.fan.call(
                f"get_block_ids({seq.rid})",
                lambda m, i: m.get_block_ids(seq.rid),
                _freeze,
            )[0]
            ids = [b for g in groups for b in g]
            chosen = set(rng.sample(ids, min(len(ids), rng.randint(1, 4))))
        else:
            chosen = {rng.randrange(self.cfg.num_blocks) for _ in range(rng.randint(1, 6))}
        self.fan.call(f"evict_blocks({sorted(chosen)})", lambda m, i: m.evict_blocks(set(chosen)))
        self.summary.evict_calls += 1

    def _reset(self) -> None:
        ok = self.fan.call("reset_prefix_cache", lambda m, i: m.reset_prefix_cache())[0]
        self.summary.successful_resets += bool(ok)

    def _finish_loads(self) -> None:
        """Complete async KV loads: cache what arrived, requeue for compute."""
        for seq in list(self.loading):
            seq.load_steps -= 1
            if seq.load_steps > 0:
                continue
            self.loading.remove(seq)
            self._complete_load(seq)
            self.waiting.insert(0, seq)

    def _complete_load(self, seq: _Seq) -> None:
        req, rng, bs = seq.req, self.rng, self.cfg.scheduler_block_size
        outcome = rng.random()
        # vLLM handles failed (invalid) loaded blocks for one group only.
        if outcome < 0.15 and len(self.cfg.groups) == 1:
            # Some blocks failed: keep the valid block-aligned prefix only.
            req.num_computed_tokens = rng.randint(0, req.num_computed_tokens // bs) * bs
            if req.num_computed_tokens == 0:
                self._free(seq)
                return
        n = req.num_computed_tokens
        self.fan.call(f"cache_blocks({seq.rid}, {n})", lambda m, i: m.cache_blocks(req, n))
        # A full hit must recompute the last token to sample from it.
        if req.num_computed_tokens == req.num_tokens:
            req.num_computed_tokens = req.num_tokens - 1

    def _mamba_split(
        self, req: Request, num_new_tokens: int, num_local_hit: int = 0, num_external: int = 0
    ) -> int:
        """vLLM's Scheduler._mamba_block_aligned_split (Mamba "align" mode)."""
        if not self.cfg.mamba_align:
            return num_new_tokens
        num_computed = req.num_computed_tokens + num_local_hit + num_external
        if num_computed < max(req.num_prompt_tokens, req.num_tokens - 1):
            bs = self.cfg.split_block_size
            last_cache_position = req.num_tokens - req.num_tokens % bs
            if self.cfg.use_eagle:  # EAGLE prunes the last matched block
                last_cache_position = max(last_cache_position - bs, 0)
            after = num_computed + num_new_tokens
            if after < last_cache_position:
                num_new_tokens = num_new_tokens // bs * bs
            elif num_computed < last_cache_position < after:
                # Force caching the state at the last block boundary.
                num_new_tokens = last_cache_position - num_computed
        return num_new_tokens

    def _split(self, req: Request, n: int, hit: int = 0, external: int = 0) -> int:
        split = self._mamba_split(req, n, hit, external)
        if split != n:
            self.summary.split_trims += 1
        if split == 0:
            self.summary.split_blocked += 1
        return split

    def _schedule_running(self, scheduled: dict[str, int], budget: int) -> int:
        """Mirrors the RUNNING loop of vLLM's schedule(); returns the budget left."""
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            req = seq.req
            n = req.num_tokens + seq.drafts - req.num_computed_tokens
            n = min(n, budget, self.cfg.max_model_len - 1 - req.num_computed_tokens)
            if n > 0:
                n = self._split(req, n)
            if n <= 0:
                index += 1
                continue
            if self._allocate_or_preempt(seq, n) is None:
                break
            scheduled[seq.rid] = n
            budget -= n
            index += 1
        return budget

    def _allocate_or_preempt(self, seq: _Seq, n: int) -> Any:
        """Preempt the newest running request until `seq` fits or is preempted."""
        lookahead = self.cfg.num_lookahead_tokens
        while True:
            blocks = self._allocate(seq, n, num_lookahead_tokens=lookahead)
            if blocks is not None:
                return blocks
            victim = self.running.pop()
            self._preempt(victim)
            if victim is seq:
                return None

    def _preempt(self, seq: _Seq) -> None:
        self._free(seq)
        seq.req.num_computed_tokens = 0
        seq.req.num_preemptions += 1
        seq.drafts = 0
        self.waiting.insert(0, seq)
        self.summary.preemptions += 1
        self.preempted_this_step = True

    def _schedule_waiting(self, scheduled: dict[str, int], budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_running:
            seq = self.waiting[0]
            admitted = self._admit(seq, budget)
            if admitted is None:
                break
            self.waiting.pop(0)
            if admitted == 0:  # async load started; no compute this step
                self.loading.append(seq)
                continue
            self.running.append(seq)
            scheduled[seq.rid] = admitted
            budget -= admitted

    def _admit(self, seq: _Seq, budget: int) -> int | None:
        """Allocate for a waiting request; tokens scheduled, or None if it failed."""
        cfg, rng, req = self.cfg, self.rng, seq.req
        computed, hit, external, async_load = None, 0, 0, False
        if req.num_computed_tokens == 0:
            results = self.fan.call(
                f"get_computed_blocks({seq.rid})",
                lambda m, i: m.get_computed_blocks(req),
                norm_computed,
            )
            computed = [blocks for blocks, _ in results]
            hit = results[0][1]
            external, async_load = self._external_tokens(req, hit)
            if external and _later_group_free_hit(computed[0]):
                # vLLM 0.23.0 allocates external-token blocks group by group:
                # an earlier group's may pop a later group's free hit, which
                # then sits in two groups. hybridcache avoids that (README,
                # tests/test_vllm_divergences.py); keep traces where vLLM is sound.
                external, async_load = 0, False
        else:  # its async load finished; as vLLM, pass the shared empty blocks
            computed = [m.empty_kv_cache_blocks for m in self.fan.managers]
        num_computed = req.num_computed_tokens or hit + external
        num_new = 0 if async_load else min(req.num_tokens - num_computed, budget)
        if not async_load:  # as vLLM: no alignment when setting up an async load
            num_new = self._split(req, num_new, hit, external)
            if num_new == 0:
                return None
        # Encoder inputs (cross attention) are scheduled with the first chunk.
        encoder = seq.encoder_tokens if num_computed == 0 and num_new else 0
        reserved = rng.randint(1, 4) if rng.random() < cfg.reserved_blocks_prob else 0
        if external and cfg.mamba_align:
            # vLLM 0.23.0's Mamba "align" block count omits the block that
            # allocate_new_computed_blocks takes for external tokens (one per
            # Mamba group), so a tight pool makes its BlockPool raise. Keep
            # that many blocks in reserve so every trace is legal for vLLM.
            reserved += sum(g.kind == "mamba" for g in cfg.groups)
        blocks = self._allocate(
            seq,
            num_new,
            computed,
            num_new_computed_tokens=hit,
            # As vLLM's scheduler: no lookahead while an EAGLE request loads KV.
            num_lookahead_tokens=0 if async_load and cfg.use_eagle else cfg.num_lookahead_tokens,
            num_external_computed_tokens=external,
            delay_cache_blocks=async_load,
            num_encoder_tokens=encoder,
            full_sequence_must_fit=rng.random() < cfg.full_sequence_must_fit_prob,
            reserved_blocks=reserved,
        )
        if blocks is None:
            return None
        self.summary.cache_hit_tokens += hit
        self.summary.hit_requests += hit > 0
        self.summary.external_tokens += external
        self.summary.async_loads += async_load
        req.num_computed_tokens = num_computed
        if async_load:
            seq.load_steps = rng.randint(1, 3)
        return num_new

    def _external_tokens(self, req: Request, hit: int) -> tuple[int, bool]:
        """Tokens a simulated KV connector offers after the local hit."""
        cfg, rng = self.cfg, self.rng
        if cfg.has_cross_attention or rng.random() >= cfg.external_tokens_prob:
            return 0, False
        async_load = rng.random() < cfg.async_load_prob
        # Synchronous loads must leave at least one token to compute.
        room = req.num_tokens - hit - (0 if async_load else 1)
        if room <= 0:
            return 0, False
        align = cfg.scheduler_block_size
        if rng.random() < 0.5 and room >= align:
            external = rng.randint(1, room // align) * align
        else:
            external = rng.randint(1, room)
        return external, async_load

    def _apply_outputs(self, scheduled: dict[str, int]) -> None:
        """Advance computed tokens, sample, accept drafts and finish requests."""
        for seq in list(self.running):
            n = scheduled.get(seq.rid)
            if n is None:
                continue
            req = seq.req
            req.num_computed_tokens += n
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk: nothing sampled yet
            num_drafts = req.num_computed_tokens - req.num_tokens
            self.summary.draft_tokens += num_drafts
            accepted = self.rng.randint(0, num_drafts)
            req.num_computed_tokens -= num_drafts - accepted
            if self._append_and_check_stop(seq, accepted + 1):
                self.running.remove(seq)
                self._free(seq)
                self.freed_ids.append(seq.rid)
                self.summary.finished += 1
            else:
                seq.drafts = self._next_drafts(seq.drafts)

    def _append_and_check_stop(self, seq: _Seq, num_sampled: int) -> bool:
        cfg, req = self.cfg, seq.req
        room = min(seq.max_tokens - req.num_output_tokens, cfg.max_model_len - req.num_tokens)
        req.append_output_token_ids(self._tokens(min(num_sampled, room)))
        return (
            num_sampled >= room
            or req.num_tokens >= cfg.max_model_len
            or self.rng.random() < cfg.eos_prob
        )

    def _next_drafts(self, previous: int) -> int:
        """Draft count of the next step, suffix-decoding style: it drifts up
        and down, drops to 0, jumps back to the maximum."""
        top, rng = self.cfg.max_drafts, self.rng
        if top == 0:
            return 0
        r = rng.random()
        if r < 0.25:
            return 0
        if r < 0.35:
            return top
        if r < 0.7:
            return min(top, max(0, previous + rng.choice((-2, -1, 1, 2))))
        return rng.randint(1, top)

    # ---- observations ---------------------------------------------------

    def _observe_schedule(self) -> None:
        """What vLLM's schedule() reads at the end of a step."""
        if self.running:
            rid = self.running[0].rid
            self.fan.call(
                f"get_num_common_prefix_blocks({rid})",
                lambda m, i: m.get_num_common_prefix_blocks(rid),
                norm_ids,
            )
        self.fan.call("take_new_block_ids", lambda m, i: m.take_new_block_ids(), norm_ids)
        for seq in self._holders():
            self.fan.call(
                f"get_block_ids({seq.rid})", lambda m, i: m.get_block_ids(seq.rid), _freeze
            )

    def _observe_step(self) -> None:
        """Pool state, events and stats after the step's frees."""
        self.fan.call(
            "block_pool.get_num_free_blocks",
            lambda m, i: m.block_pool.get_num_free_blocks(),
        )
        self.fan.call("usage", lambda m, i: m.usage, norm_usage)
        if self.cfg.compare_pool_state:
            self.fan.call("block_pool state", lambda m, i: pool_state(m))
        events = self.fan.call("take_events", lambda m, i: m.take_events(), norm_events)[0]
        self.summary.events += len(events)
        self.fan.call(
            "make_prefix_cache_stats", lambda m, i: m.make_prefix_cache_stats(), norm_stats
        )

    def _break_stalls(self, scheduled: dict[str, int]) -> None:
        """Abort the head waiting request when blocks held by waiting requests
        leave nothing runnable (vLLM would deadlock the same way)."""
        stalled = not scheduled and not self.running and not self.loading and self.waiting
        self.idle_steps = self.idle_steps + 1 if stalled else 0
        if self.idle_steps >= 3:
            self._abort(self.waiting, 0)
            self.summary.stalls += 1
            self.idle_steps = 0

    def run(self) -> ReplaySummary:
        start = time.perf_counter()
        while not self._done() and self.summary.steps < self.cfg.max_steps:
            self.step()
        self.fan.step = self.summary.steps
        self._drain()
        self.summary.seconds = time.perf_counter() - start
        self.summary.ops = self.fan.ops
        return self.summary

    def _drain(self) -> None:
        """Free everything, then a prefix-cache reset (which must succeed)."""
        for queue in (self.running, self.loading, self.waiting):
            while queue:
                self._abort(queue, len(queue) - 1)
        self._reset()
        self._observe_step()


# --------------------------------------------------------------------------
# Entry points.
# --------------------------------------------------------------------------


def _run(
    config: ReplayConfig, seed: int, managers: Sequence[Any], names: Sequence[str]
) -> ReplaySummary:
    fanout = _Fanout(managers, names, seed, config.compare_pool_every_op)
    return _Simulation(config, seed, fanout).run()


def replay(
    config: ReplayConfig,
    seed: int,
    factories: Sequence[ManagerFactory],
    names: Sequence[str] | None = None,
) -> ReplaySummary:
    """Replay one seeded trace against every manager, comparing all outputs.

    The first factory builds the reference manager. Raises ReplayDivergence on
    the first operation whose normalized outputs differ.
    """
    if names is None:
        names = [f"manager{i}" for i in range(len(factories))]
    managers = [factory(config) for factory in factories]
    return _run(config, seed, managers, names)


def run_single(config: ReplayConfig, seed: int, factory: ManagerFactory) -> ReplaySummary:
    """Replay one seeded trace against a single manager (no comparison), timed."""
    return _run(config, seed, [factory(config)], ["manager"])


def make_vllm_kv_cache_config(config: ReplayConfig) -> Any:
    """vLLM's KVCacheConfig for `config`'s groups (imports vLLM and torch)."""
    import torch
    from vllm.v1 import kv_cache_interface as iface

    groups = []
    for i, g in enumerate(config.groups):
        attn = dict(block_size=g.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
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
                block_size=g.block_size,
                shapes=((1, 1),),
                dtypes=(torch.float32,),
                mamba_cache_mode=g.mamba_cache_mode,
                num_speculative_blocks=g.num_speculative_blocks,
            )
        groups.append(iface.KVCacheGroupSpec([f"layer{i}"], spec, is_eagle_group=g.is_eagle_group))
    return iface.KVCacheConfig(
        num_blocks=config.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
    )


def make_kv_cache_config(config: ReplayConfig) -> Any:
    """hybridcache's own KVCacheConfig for `config`'s groups (no vLLM, no torch)."""
    from . import config as hc

    groups = []
    for i, g in enumerate(config.groups):
        if g.kind == "full":
            spec = hc.FullAttentionSpec(g.block_size)
        elif g.kind == "sliding_window":
            spec = hc.SlidingWindowSpec(g.block_size, g.sliding_window)
        elif g.kind == "chunked_local":
            spec = hc.ChunkedLocalAttentionSpec(g.block_size, g.attention_chunk_size)
        elif g.kind == "cross_attention":
            spec = hc.CrossAttentionSpec(g.block_size)
        else:
            spec = hc.MambaSpec(
                g.block_size,
                shapes=((1, 1),),
                dtypes=("float32",),
                mamba_cache_mode=g.mamba_cache_mode,
                num_speculative_blocks=g.num_speculative_blocks,
            )
        groups.append(hc.KVCacheGroupSpec([f"layer{i}"], spec, is_eagle_group=g.is_eagle_group))
    return hc.KVCacheConfig(num_blocks=config.num_blocks, kv_cache_groups=groups)


def vllm_factory(config: ReplayConfig) -> Any:
    """vLLM 0.23.0's own KVCacheManager for `config`."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    return KVCacheManager(make_vllm_kv_cache_config(config), **config.manager_kwargs())


def hybridcache_factory(config: ReplayConfig) -> Any:
    """hybridcache's KVCacheManager for `config`, on its own config classes
    (so the CLI needs neither vLLM nor torch)."""
    from . import KVCacheManager

    return KVCacheManager(make_kv_cache_config(config), **config.manager_kwargs())


def hybridcache_on_vllm_config_factory(config: ReplayConfig) -> Any:
    """hybridcache's KVCacheManager on vLLM's config classes (duck typing)."""
    from . import KVCacheManager

    return KVCacheManager(make_vllm_kv_cache_config(config), **config.manager_kwargs())


_FACTORIES = {"hybridcache": hybridcache_factory, "vllm": vllm_factory}


def _cli_config(args: argparse.Namespace) -> ReplayConfig:
    mix = MIX_PRESETS.get(args.mix, args.mix)
    changes: dict[str, Any] = dict(
        mix=mix,
        num_requests=args.requests,
        enable_caching=not args.no_caching,
        use_eagle=args.eagle,
        hash_block_size=args.hash_block_size,
    )
    if args.block_size is not None:
        changes["block_size"] = args.block_size
    if args.max_drafts is not None:
        changes["max_drafts"] = args.max_drafts
    if args.num_blocks is not None:
        return DEFAULT_CONFIG.with_changes(num_blocks=args.num_blocks, **changes)
    # Size the pool from the mix: room for a few max-length requests.
    probe = DEFAULT_CONFIG.with_changes(num_blocks=1 << 30, **changes)
    need = probe.min_num_blocks() + 1
    num_blocks = DEFAULT_CONFIG.num_blocks if need <= DEFAULT_CONFIG.num_blocks else need * 3 // 2
    return probe.with_changes(num_blocks=num_blocks)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Replay seeded KV-cache manager traces.")
    parser.add_argument("--impl", choices=sorted(_FACTORIES), default="hybridcache")
    parser.add_argument("--compare", choices=sorted(_FACTORIES), default=None,
                        help="also replay against this manager and compare every output")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--requests", type=int, default=DEFAULT_CONFIG.num_requests)
    parser.add_argument(
        "--mix", default="full",
        help="the model's KV-cache groups: a preset (" + ", ".join(sorted(MIX_PRESETS))
        + ") or groups such as 'full,sw:128@32,mamba:align:2,chunked:64,cross,full+eagle' "
        "(KIND[:ARGS][@BLOCK_SIZE][+eagle][*COUNT]; mamba:MODE:NUM_SPECULATIVE_BLOCKS)",
    )
    parser.add_argument("--block-size", type=int, default=None,
                        help="block size of groups without @SIZE (default %(default)s: 16)")
    parser.add_argument("--hash-block-size", type=int, default=None,
                        help="default: as vLLM resolves it (GCD of group block sizes)")
    parser.add_argument("--num-blocks", type=int, default=None,
                        help="default: sized from the mix")
    parser.add_argument("--max-drafts", type=int, default=None)
    parser.add_argument("--no-caching", action="store_true", help="disable prefix caching")
    parser.add_argument("--eagle", action="store_true", help="EAGLE: lookahead slots, hit pruning")
    args = parser.parse_args(argv)
    try:
        config = _cli_config(args)
    except ValueError as e:
        parser.error(str(e))
    print(config.describe())
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        if args.compare:
            factories = [_FACTORIES[args.compare], _FACTORIES[args.impl]]
            summary = replay(config, seed, factories, [args.compare, args.impl])
        else:
            summary = run_single(config, seed, _FACTORIES[args.impl])
        print(summary.as_dict())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
