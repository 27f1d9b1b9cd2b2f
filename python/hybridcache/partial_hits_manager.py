"""`PartialHitsManager`: the vLLM `KVCacheManager` API of the releases
running the core's partial-block-hits profile (free-queue
policy, caching capped at the hashed blocks, null block not ref-counted,
stats recorded by the scheduler, partial hash hits with copy-on-write),
over the native core. A release's facade (`hybridcache.releases.<folder>.
manager`) subclasses it, names its row (`_release`) and adds only what its
release changed; the row's flags choose the rest here (`read_gate`: the
request attribute lookups read; `zeroing_from_config`; `evict_first` on
the pool view; `cached_tokens_probe` and `common_prefix_blocks`: methods
the release's class has, checked when the class is made).

What these releases changed at the API is here: the constructor's keywords,
`get_computed_blocks` returning `(blocks, hit tokens,
shared_prefix_boundary)`, `record_prefix_cache_stats`, deferred frees
(`pop_blocks_for_free`, then `block_pool.free_blocks`), the watermark and
the new drains. The rules themselves are the core's.

The layouts covered are `layout_checks.check_layout`'s: full attention
(FullAttentionSpec, MLAAttentionSpec, HiddenStateCacheSpec,
SinkFullAttentionSpec, R-SWA), circular buffers, sliding window (bounded
replay and `extra_retained_tokens` too), chunked local and cross-attention
groups, one group or several, with vLLM's sparse retention; Mamba groups
(none / align, with speculative and prefill checkpoint blocks) alone or
beside full attention, sliding windows, chunked local attention and
circular buffers, with prefix caching in align mode (blocks wider than the
hash block included: partial hash hits and copy-on-write); mixed-precision
caches (new blocks recorded for zeroing). A spec class it does not know,
Mamba beside R-SWA or cross attention, and attention-free models raise
NotImplementedError naming them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hybridcache import _native
from hybridcache.block_copies import BlockCopies
from hybridcache.blocks import KVCacheBlocks
from hybridcache.deferred_frees import DeferredFrees
from hybridcache.config import read_groups
from hybridcache.facade import KVCacheManagerBase, _positive_int
from hybridcache.layout_checks import (
    assigned_retention,
    check_layout,
    check_retention,
    context_parallel,
    layout_kind,
    needs_zeroing,
)
from hybridcache.releases import Release
from hybridcache.scheduler_views import (
    _COORDINATOR_VIEWS,
    EvictFirstBlockPoolView,
    SchedulerBlockPoolView,
    SchedulerCoordinatorView,
)
from hybridcache.scheduler_stats import SchedulerRecordedStats


class _Removed:
    """A method a release removed, which a base class has: reading it is
    the AttributeError vLLM's manager of that release gives."""

    def __init__(self, name: str, version: str) -> None:
        self._name, self._version = name, version

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        raise AttributeError(f"'KVCacheManager' object has no attribute '{self._name}' "
                             f"(vLLM {self._version} removed it)")


# The retention interval is the config's, checked (not one assigned later).
_CONFIGURED = object()


def _waiting_statuses() -> list[Any]:
    """The request statuses the watermark applies to (vLLM's
    `RequestStatus.WAITING` / `PREEMPTED`; that IntEnum's values when vLLM
    is not importable)."""
    try:
        from vllm.v1.request import RequestStatus
    except ImportError:
        return [1, 6]
    return [RequestStatus.WAITING, RequestStatus.PREEMPTED]


class PartialHitsManager(SchedulerRecordedStats, DeferredFrees, BlockCopies, KVCacheManagerBase):
    """Drop-in for `vllm.v1.core.kv_cache_manager.KVCacheManager` of the
    releases running the partial-block-hits profile, with vLLM's
    constructor keywords (the scheduler passes all of them
    by name). See the module docstring for the layouts covered. Composes the
    shared parts: stats the scheduler records (`scheduler_stats`), deferred
    frees (`deferred_frees`), copy-on-write drains (`block_copies`).

    Raises:
        NotImplementedError: a layout the module docstring does not list,
            dcp > 1 with several groups.
        ValueError: a bad count, a negative watermark, a retention interval
            vLLM refuses, MTP whose lookahead exceeds the scheduler
            block size.
    """

    # The release's row (a subclass names it): its version, profile and flags.
    _release: Release
    # Its core profile (`block_copies` builds vLLM's classes where it is loaded).
    _profile: str

    # The row's flags for methods a release's class has or lacks.
    _FLAGGED_METHODS = (("cached_tokens_probe", "get_num_cached_tokens"),
                        ("common_prefix_blocks", "get_num_common_prefix_blocks"))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        release = cls.__dict__.get("_release")
        if release is None:
            return
        cls._profile = release.profile
        for flag, method in cls._FLAGGED_METHODS:
            if getattr(release, flag) and not hasattr(cls, method):
                raise TypeError(f"{cls.__name__}: the {release.version} row's {flag} is on, but the class lacks {method}")
            if not getattr(release, flag) and hasattr(cls, method):
                # The native base has it (an older release's method): gone here.
                setattr(cls, method, _Removed(method, release.version))

    # Private state in slots (see `KVCacheManagerBase.__slots__`).
    __slots__ = ("_args", "_block_sizes", "_group_infos", "_hash_block_size", "_kinds", "_live_stats",
                 "_retention_interval", "_scheduler_block_size", "_specs")

    # Each group's kind as `layout` names it ("full", "mamba", ...).
    _kinds: tuple[str, ...]

    # Multi-module MTP's re-prefillable tail (num_prefill_lookahead - 1).
    num_reprefillable_tokens: int

    # The constructor's arguments (a later retention interval rebuilds from them).
    _args: dict[str, Any]
    _scheduler_block_size: int
    _hash_block_size: int
    # Tokens per block of each group, as the core sizes them (dcp scales them).
    _block_sizes: list[int]
    _group_infos: list[Any]
    _retention_interval: int | None
    num_hash_lookahead_tokens: int
    coordinator: SchedulerCoordinatorView

    def __new__(
        cls,
        kv_cache_config: Any,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        enable_mamba_shared_prefix_checkpoint: bool = False,
    ) -> PartialHitsManager:
        """Builds the manager; the arguments are vLLM's (every partial-block-hits release's)."""
        args = dict(kv_cache_config=kv_cache_config, max_model_len=max_model_len,
                    scheduler_block_size=scheduler_block_size, hash_block_size=hash_block_size,
                    max_in_flight_tokens=max_in_flight_tokens, enable_caching=enable_caching,
                    use_eagle=use_eagle, num_hash_lookahead_tokens=num_hash_lookahead_tokens,
                    num_prefill_lookahead=num_prefill_lookahead, log_stats=log_stats,
                    enable_kv_cache_events=enable_kv_cache_events, dcp_world_size=dcp_world_size,
                    pcp_world_size=pcp_world_size, metrics_collector=metrics_collector, watermark=watermark,
                    enable_mamba_shared_prefix_checkpoint=enable_mamba_shared_prefix_checkpoint)
        return cls._construct(args, _CONFIGURED)

    @classmethod
    def _construct(cls, args: dict[str, Any], retention_interval: Any) -> PartialHitsManager:
        """The constructor's work over its arguments (`args`), with the
        retention interval the config gives (`_CONFIGURED`, checked as
        vLLM checks it) or one assigned to `coordinator.retention_interval`."""
        kv_cache_config, max_model_len = args["kv_cache_config"], args["max_model_len"]
        scheduler_block_size, hash_block_size = args["scheduler_block_size"], args["hash_block_size"]
        max_in_flight_tokens, enable_caching = args["max_in_flight_tokens"], args["enable_caching"]
        use_eagle, log_stats = args["use_eagle"], args["log_stats"]
        num_hash_lookahead_tokens, num_prefill_lookahead = args["num_hash_lookahead_tokens"], args["num_prefill_lookahead"]
        enable_kv_cache_events, metrics_collector = args["enable_kv_cache_events"], args["metrics_collector"]
        dcp_world_size, pcp_world_size, watermark = args["dcp_world_size"], args["pcp_world_size"], args["watermark"]
        enable_mamba_shared_prefix_checkpoint = args["enable_mamba_shared_prefix_checkpoint"]
        max_model_len = _positive_int("max_model_len", max_model_len)
        if max_in_flight_tokens is None:
            max_in_flight_tokens = max_model_len
        max_in_flight_tokens = _positive_int("max_in_flight_tokens", max_in_flight_tokens)
        scheduler_block_size = _positive_int("scheduler_block_size", scheduler_block_size)
        dcp_scales = context_parallel(kv_cache_config, dcp_world_size, pcp_world_size, bool(enable_caching))
        kinds = check_layout(kv_cache_config, bool(enable_caching))
        if retention_interval is _CONFIGURED:
            retention_interval = getattr(kv_cache_config, "prefix_cache_retention_interval", None)
            retention = check_retention(kv_cache_config, scheduler_block_size, kinds)
        else:
            retention = assigned_retention(retention_interval, kinds)
        for name, v in (("num_hash_lookahead_tokens", num_hash_lookahead_tokens),
                        ("num_prefill_lookahead", num_prefill_lookahead)):
            # vLLM takes bools too (its tests pass use_eagle-style flags).
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        num_hash_lookahead_tokens, num_prefill_lookahead = int(num_hash_lookahead_tokens), int(num_prefill_lookahead)
        if isinstance(watermark, bool) or not isinstance(watermark, (int, float)) or not watermark >= 0.0:
            raise ValueError(f"watermark must be non-negative, got {watermark!r}")
        groups = read_groups(kv_cache_config, max_in_flight_tokens, max_model_len)
        eagle_groups = any(g.native.is_eagle_group for g in groups) or use_eagle
        if enable_caching and eagle_groups and scheduler_block_size < num_prefill_lookahead:
            raise ValueError(
                f"Multi-module MTP with prefix caching requires scheduler_block_size"
                f" (={scheduler_block_size}) >= num_speculative_tokens (={num_prefill_lookahead})."
            )
        # vLLM records new block ids only for worker-side zeroing (Mamba
        # groups or a mixed-precision cache), then for every attention group.
        zeroing = needs_zeroing(kv_cache_config, kinds, cls._release.zeroing_from_config)
        specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups]
        checkpoints = _mamba_checkpoints(retention_interval, hash_block_size, num_hash_lookahead_tokens, use_eagle,
                                         bool(enable_caching))
        # Each group's block holds its dcp scale times the spec's tokens
        # (vLLM's managers; the admission caps above keep the spec's size).
        groups = [type(g)(native=replace(_records_new_block_ids(g.native, zeroing, spec),
                                         mamba_checkpoints=checkpoints(spec),
                                         block_size=g.native.block_size * scale),
                          event_kind=g.event_kind, sliding_window=g.sliding_window)
                  for g, spec, scale in zip(groups, specs, dcp_scales)]
        self = cls._build(kv_cache_config, groups, max_model_len, scheduler_block_size, hash_block_size,
                          enable_caching, use_eagle, log_stats, enable_kv_cache_events, cls._release.version,
                          retention_interval=retention,
                          num_hash_lookahead_tokens=num_hash_lookahead_tokens,
                          # The groups are scaled already (vLLM's rule, above).
                          dcp_world_size=1, pcp_world_size=1,
                          # vLLM's pool calls the collector as the whole-block-hits
                          # releases' pool does, except that the null block is never
                          # touched.
                          metrics_collector=metrics_collector)
        # Multi-module MTP: the last num_prefill_lookahead - 1 tokens may be
        # re-prefilled, so they are not cached (vLLM's num_reprefillable_tokens).
        self.num_reprefillable_tokens = max(0, num_prefill_lookahead - 1)
        self._set_reprefillable_tokens(self.num_reprefillable_tokens)
        self._kinds = tuple(kinds)
        self.dcp_world_size, self.pcp_world_size = int(dcp_world_size), int(pcp_world_size)
        if enable_caching and self.dcp_world_size > 1:
            # vLLM turns partial hash hits on under dcp for a Mamba block as
            # wide as the hash block; the core, built with the scaled groups, hears the dcp.
            self._native._set_partial_hits_dcp(self.dcp_world_size)
        # vLLM's one predicate, read by the scheduler too (it ends chunks
        # at junctions only where the manager keys them); multi-module MTP
        # caches below the chunk end, so it is out.
        shared_prefix_checkpoint = bool(enable_mamba_shared_prefix_checkpoint) and eagle_groups \
            and self._native._partial_hash_hits and self.num_reprefillable_tokens == 0
        if shared_prefix_checkpoint:
            self._native._set_shared_prefix_checkpoint(True)
        self._scheduler_block_size = scheduler_block_size
        # As given (the coordinator view's `retention_interval`).
        self._retention_interval = retention_interval
        self._init_views(groups, hash_block_size, watermark, num_hash_lookahead_tokens, log_stats,
                       shared_prefix_checkpoint)
        self._args = args
        return self

    def _assign_retention_interval(self, value: Any) -> None:
        """`coordinator.retention_interval = value`: vLLM's
        coordinator reads it at every call (its tests assign it right after
        building the manager). The core settles retention into each group
        at construction, so the manager is built anew with `value` and this
        object adopts its core: exact while this manager has served nothing,
        refused (ValueError, nothing changed) once it has."""
        assigned_retention(value, list(self._kinds))  # TypeError / ValueError first
        served = bool(self.request_ids() or self.num_cached_keys or self._events)
        # Built first only when nothing else shows service: a free queue
        # reordered by earlier frees does too.
        fresh = None if served else type(self)._construct(self._args, value)
        if fresh is None or self.free_queue() != fresh.free_queue():
            raise ValueError(
                "coordinator.retention_interval can be assigned only before the manager's first request "
                "(hybridcache's core settles retention at construction); set "
                "KVCacheConfig.prefix_cache_retention_interval before building the manager instead"
            )
        self._adopt_core(fresh)
        self._group_infos = fresh._group_infos
        self._retention_interval = value

    def _init_views(self, groups: list[Any], hash_block_size: int, watermark: float,
                  num_hash_lookahead_tokens: int, log_stats: bool, shared_prefix_checkpoint: bool) -> None:
        self._group_infos = groups
        self._specs = [g.kv_cache_spec for g in self.kv_cache_config.kv_cache_groups]
        self._hash_block_size = hash_block_size
        # Tokens per block of each group, as the core sizes them (dcp scales them).
        self._block_sizes = [g.native.block_size for g in groups]
        # `_stats_cls`: the base found it once (fresh stats every step).
        self._live_stats: Any = self._stats_cls() if log_stats else None
        self.watermark_blocks = int(watermark * self.num_blocks)
        self._set_watermark(self.watermark_blocks, _waiting_statuses())
        self.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        # Full-attention groups keep no longer hit than the scheduler adopts.
        self.retained_hit_group_ids: tuple[int, ...] = ()
        self.mamba_shared_prefix_checkpoint = shared_prefix_checkpoint
        self.kv_cache_event_metadata = tuple((g.event_kind, g.sliding_window) for g in groups)
        self._set_read_gate(self._release.read_gate)
        self.block_pool = (EvictFirstBlockPoolView if self._release.evict_first else SchedulerBlockPoolView)(self)
        self.coordinator = _COORDINATOR_VIEWS[self.coordinator_kind](self)

    # -- lookups and stats ------------------------------------------------

    def get_computed_blocks(  # type: ignore[override]
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[Any, int, int]:
        """The longest prefix-cache hit: (KVCacheBlocks, hit tokens,
        shared_prefix_boundary). The boundary is where the longest hit one
        attention type found ends when a sparse-retention group lags it
        (else 0; the scheduler stores it in `request.shared_prefix_boundary`).
        Counts nothing: the scheduler calls `record_prefix_cache_stats`."""
        blocks, hit, boundary = self._get_computed_blocks_with_boundary(request, max_cache_hit_length)
        if hit and self._event_builder is not None and getattr(request, "kv_cache_report_mode", "incremental") == "full":
            self._report_reused_hit(request, blocks)
        return blocks, hit, boundary

    def _report_reused_hit(self, request: Any, blocks: Any) -> None:
        """vLLM's `BlockStored` for the blocks of a hit, so external
        consumers learn of reused blocks (`kv_cache_report_mode="full"`)."""
        hashes = request.block_hashes
        raw = []
        for group, (bs, group_blocks) in enumerate(zip(self._block_sizes, blocks.blocks)):
            n = len(group_blocks)
            if n:
                # One hash per block: the last hash block's in it.
                scale = bs // self._hash_block_size
                block_hashes = list(hashes[scale - 1::scale][:n])
                # A partial hit can end inside a block the prompt does not
                # fill (no block hash: vLLM raises IndexError there):
                # only the hit blocks with a block hash are reported.
                n = len(block_hashes)
                if n:
                    raw.append(("stored", block_hashes, None, 0, n * bs, bs, group, list(range(n))))
        self._on_events(raw, request)

    def get_computed_blocks_for_connector(self, request: Any, max_cache_hit_length: int | None = None) -> tuple[Any, int, int, bool]:
        """vLLM's lookup for requests with a KV connector: with Mamba
        layers beside full attention, each group looked up on its own and
        the full-attention hit reported with `hit_diverged` (a group lags
        it); otherwise, or when a group hit deeper, `get_computed_blocks`
        plus `hit_diverged=False`."""
        blocks, hit, boundary, diverged = self._get_computed_blocks_for_connector(request, max_cache_hit_length)
        if diverged is not None:
            return blocks, hit, boundary, diverged
        if hit and self._event_builder is not None and getattr(request, "kv_cache_report_mode", "incremental") == "full":
            self._report_reused_hit(request, blocks)
        return blocks, hit, boundary, False

    # -- frees --------------------------------------------------------------

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Frees blocks no attention reads any more (sliding-window blocks
        below the window of `processed_computed_tokens`; none for full
        attention); given `num_prompt_tokens`, R-SWA groups free the decode
        blocks between the prompt and their window."""
        super().remove_skipped_blocks(request_id, processed_computed_tokens, num_prompt_tokens)

    # -- new drains and queries --------------------------------------------

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> tuple[list[int], ...]:
        """The request's block ids covering its first `num_computed_tokens`
        tokens, per group; all of them for a group whose blocks are not
        token positions (Mamba state, cross-attention, encoder-only)."""
        # vLLM clips by the spec's own block size, not the dcp-scaled one
        # (kv_cache_manager.py L756): with dcp > 1 that keeps more ids.
        out = []
        for ids, spec in zip(self.get_block_ids(request_id), self._specs):
            names = {cls.__name__ for cls in type(spec).__mro__}
            positional = "AttentionSpec" in names and not names & {"CrossAttentionSpec", "EncoderOnlyAttentionSpec"}
            out.append(ids[: -(-num_computed_tokens // int(spec.block_size))] if positional else ids)
        return tuple(out)

    # Tokens of the request's prefix its cached blocks cover (the fewest
    # over the prefix-cacheable groups other than cross attention): the most
    # any of a group's blocks' hash covers (`block_hash_num_tokens`: a full
    # block's end, a partial entry's boundary inside the block, or the
    # boundary a Mamba state is keyed at). The scheduler asks once per
    # finished prefill: the native method itself, no Python frame.
    estimate_cached_tokens = _native.NativeManager._estimate_cached_tokens

    def truncate_computed_blocks(self, blocks: Any, num_computed_tokens: int) -> Any:
        """`blocks` (a lookup result) cut to `num_computed_tokens` tokens, a
        multiple of each prefix-cacheable group's block size (the others
        never have hit blocks; a Mamba group may hold fewer: an external hit
        can supply its state). References are untouched."""
        out: list[list[Any]] = []
        for bs, group_blocks, g, spec in zip(self._block_sizes, blocks.blocks, self._groups, self._specs):
            if not g.native.prefix_cacheable:
                if len(group_blocks):
                    raise ValueError("a group out of prefix caching has no computed blocks")
                out.append([])
                continue
            if num_computed_tokens % bs:
                raise ValueError(f"num_computed_tokens ({num_computed_tokens}) is not a multiple of the block size {bs}")
            n = num_computed_tokens // bs
            if layout_kind(spec) == "mamba":
                n = min(n, len(group_blocks))
            if n > len(group_blocks):
                raise ValueError(f"num_computed_tokens ({num_computed_tokens}) exceeds the {len(group_blocks)} blocks given")
            out.append([getattr(b, "block_id", b) for b in group_blocks[:n]])
        return self.create_kv_cache_blocks(tuple(out))

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Re-records the request's blocks from `start_token` on for
        worker-side zeroing (a failed async KV load left them unwritten), in
        the groups that record new block ids (none without Mamba groups).
        ValueError if `start_token` is not block-aligned there."""
        self._record_blocks_for_zeroing(request_id, start_token)

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """Mamba align boundary states for a KV connector, drained:
        {request id: [(group, block id, boundary tokens), ...]}, every state
        cached since the last call (none without Mamba prefix caching)."""
        return self._take_boundary_state_offloads()

    def finalize_partial_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        """A finishing request's Mamba align producer tails (its own prompt
        boundary state cached inside a block), consumed: `(group, block id,
        boundary tokens)` for each whose request forwarded nothing past the
        boundary (`num_computed_tokens` equals it, none in flight)."""
        return [(int(t[0]), int(t[1]), int(t[2])) for t in self._native._finalize_partial_tail_offloads(
            request.request_id, int(request.num_computed_tokens), int(getattr(request, "num_in_flight_tokens", 0)))]

    @property
    def _groups(self) -> list[Any]:
        return self._group_infos


def _mamba_checkpoints(retention_interval: Any, hash_block_size: int, num_hash_lookahead_tokens: int,
                       use_eagle: bool, enable_caching: bool) -> Any:
    """What decides a Mamba align group's prefill checkpoints and, with
    prefix caching, the states it caches, per spec (None: neither): the
    spec's `num_prefill_checkpoint_blocks` and `prefill_checkpoint_alignment`
    (alignment 0: no checkpoint blocks), and the manager settings vLLM
    reads (`drop_eagle_checkpoint_block` is `use_eagle`; with retention 0
    only the chunk reaching the prefill end checkpoints)."""
    only_at_end = retention_interval == 0

    def of(spec: Any) -> tuple[int, int, int, bool, bool] | None:
        alignment = getattr(spec, "prefill_checkpoint_alignment", None)
        if getattr(spec, "mamba_cache_mode", None) != "align":
            return None
        if not getattr(spec, "num_prefill_checkpoint_blocks", 0) or alignment is None:
            if not enable_caching:
                return None
            alignment = 0
        return (int(alignment), int(hash_block_size), int(num_hash_lookahead_tokens), bool(use_eagle), only_at_end)

    return of


def _records_new_block_ids(native: Any, zeroing: bool, spec: Any) -> Any:
    """vLLM's rule: a group records its new block ids for the worker to
    zero when the config needs zeroing and its spec is an attention spec
    (not a circular buffer)."""
    names = {cls.__name__ for cls in type(spec).__mro__}
    records = zeroing and "AttentionSpec" in names and "CircularBufferSpec" not in names
    return replace(native, reports_new_block_ids=records)


__all__ = ["KVCacheBlocks", "PartialHitsManager"]
