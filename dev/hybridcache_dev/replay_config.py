"""`ReplayConfig`: the shape of the replay's simulated workload and of the
managers under test (groups, block sizes resolved as vLLM resolves
them, pool size, request mix, the probabilities of every operation), with
vLLM's own legality rules checked at construction."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from .configs import GroupSpec, format_mix, hybridcache_kv_cache_config, parse_mix, vllm_kv_cache_config


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
    hash_block_size: int = None  # type: ignore[assignment]  # None: resolved in __post_init__
    # None: the LCM of the groups' block sizes.
    scheduler_block_size: int = None  # type: ignore[assignment]  # None: resolved
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
    num_lookahead_tokens: int = None  # type: ignore[assignment]  # None: resolved
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
        sizes = [g.size for g in self.groups]
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
        sizes = [g.size for g in self.groups]
        if len(sizes) == 1 or not self.enable_caching:
            return self.scheduler_block_size
        if any(g.kind == "mamba" and g.block_size != self.split_block_size for g in self.groups):
            return self.scheduler_block_size
        return math.gcd(*sizes)

    def _validate(self) -> None:
        sizes = [g.size for g in self.groups]
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
            # The whole-block-hits HybridKVCacheCoordinator.find_longest_cache_hit
            # truncates only the first full-attention spec group to the final
            # hit length; another one keeps longer hits, and allocate_slots
            # then asks its BlockPool for a negative number of blocks, which
            # corrupts the free-block count. No legal trace exists.
            raise ValueError("vLLM's whole-block-hits coordinator mishandles full attention groups of different block sizes")
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
        return min(g.size for g in self.groups)

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
            bs, length = g.size, self.max_model_len
            if g.kind == "full":
                total += _cdiv(length, bs)
            elif g.kind == "cross_attention":
                total += _cdiv(self.max_encoder_len, bs)
            elif g.kind == "sliding_window":
                window = (g.sliding_window or 0) - 1 + self.max_num_batched_tokens + extra
                total += _cdiv(min(window, length), bs) + 1
            elif g.kind == "chunked_local":
                chunk = (g.attention_chunk_size or 0) + self.max_num_batched_tokens + extra
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
        reset: dict[str, Any] = {name: None for name in self._auto if name not in changes}
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

    def hybridcache_kv_cache_config(self) -> Any:
        """hybridcache's own KVCacheConfig of these groups (no vLLM, no torch)."""
        return hybridcache_kv_cache_config(self.groups, self.num_blocks)

    def vllm_kv_cache_config(self) -> Any:
        """vLLM's KVCacheConfig of these groups (imports vLLM and torch)."""
        return vllm_kv_cache_config(self.groups, self.num_blocks)


DEFAULT_CONFIG = ReplayConfig(num_requests=400, max_drafts=4)
