"""The differential fuzz per core profile, on top of the tools' call
spellings (`hybridcache_dev.release_api`): how a drawn setup becomes
managers (the reference is vLLM's own; the candidate is hybridcache's
facade for the release, or vLLM's again for the harness self-check), how
requests are made, and how each observable is read and normalized.

`release(name)` gives the release's `FuzzApi`; `fuzz.run_fuzz` and the
tests ask it for setups, managers and (through `drive`) the driver class.
Nothing here imports vLLM or torch at import time.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
from collections.abc import Sequence
from typing import Any

from hybridcache.tools import release_api as tools_api
from hybridcache.tools.compare import freeze

from . import configs, scratch_groups
from .fuzz_setup import MIXES, Group, Setup, _manager_kwargs, build_hybridcache, build_vllm, group_specs, random_setup

CANDIDATES = ("hybridcache", "vllm")


class FuzzApi:
    """What the fuzz adds to a release's call spelling (a mixin over a
    `hybridcache_dev.release_api.ReleaseApi`)."""

    name = ""
    facade: tuple[str, str] = ("", "")
    mixes: tuple[str, ...] = ()
    # The fuzz drives this profile with `fuzz_driver.Driver` (hybridcache's
    # invariants and bad inputs, hybridcache's facade only), else with the
    # release's driver class (`drive`).
    classic = False

    def random_setup(self, rng: Any, mix: str, caching: bool) -> Setup:
        raise NotImplementedError

    def manager_kwargs(self, s: Setup) -> dict[str, Any]:
        raise NotImplementedError

    def build_reference(self, s: Setup) -> Any:
        raise NotImplementedError

    def build_facade(self, s: Setup) -> Any:
        raise NotImplementedError

    def build_candidate(self, s: Setup, candidate: str) -> Any:
        if candidate == "vllm":
            return self.build_reference(s)
        if candidate == "hybridcache":
            return self.build_facade(s)
        raise ValueError(f"unknown candidate {candidate!r}; choose from {', '.join(CANDIDATES)}")

    def candidate_missing(self, candidate: str) -> str | None:
        """None when `candidate` can be built; else why not (one line)."""
        if candidate == "vllm":
            return None
        module, cls = self.facade
        if importlib.util.find_spec(module) is None:
            return f"hybridcache's vLLM {self.name} facade ({module}.{cls}) is not there yet"
        return None


class WholeBlockHits(FuzzApi, tools_api.ReleaseApi):
    """The whole-block-hits profile: the fuzz as it always was (`fuzz_setup`, `fuzz_driver`)."""

    mixes = MIXES
    classic = True

    def random_setup(self, rng: Any, mix: str, caching: bool) -> Setup:
        return random_setup(rng, mix, caching)

    def manager_kwargs(self, s: Setup) -> dict[str, Any]:
        return _manager_kwargs(s)

    def build_reference(self, s: Setup) -> Any:
        return build_vllm(s)

    def build_facade(self, s: Setup) -> Any:
        return build_hybridcache(s)


# Partial hash hits with copy-on-write (`_partial_hit_groups`); the junction
# mix takes one of the first four's layouts with EAGLE's block drop and
# enable_mamba_shared_prefix_checkpoint (Mamba states keyed at junctions).
_JUNCTION_MIX = "mamba_junction"
_PARTIAL_HIT_MIXES = ("full_mamba_wide", "full_sw_mamba_wide", "full_full_mamba_wide", "full_mamba_dcp",
                      "full_coarse_mamba", "full_mamba_circ", _JUNCTION_MIX)


def _partial_hit_groups(rng: Any, mix: str, caching: bool) -> dict[str, Any]:
    """A Mamba align block of 32 or 64 tokens over hash blocks of 16 (this profile
    turns partial hash hits on: hits end inside Mamba and full-attention
    blocks, the shared tail is copied on write): full attention of 16
    beside it (`full_mamba_wide`), with a sliding window of 16 too
    (`full_sw_mamba_wide`: a block-granular group, of one hash block), or
    full attention of 32 and 16 (`full_full_mamba_wide`: three spec groups,
    so the hit search iterates, one full-attention hit ending inside a
    block), or decode context parallelism (`full_mamba_dcp`). Two where
    this profile keeps them off or sets a group aside: a sliding window or
    chunked local group whose block is not the hash block beside them
    (`full_coarse_mamba`: looked up at block granularity only, so hits land
    on scheduler blocks while Mamba states are still keyed at hash
    boundaries inside their blocks; blocks of 4 to 16), and a
    circular buffer (`full_mamba_circ`: a ring of 2 to 16 tokens, out of
    prefix caching; the Mamba block 4, 8 or 16, so hits on or off)."""
    if mix == _JUNCTION_MIX:
        return _partial_hit_groups(rng, rng.choice(_PARTIAL_HIT_MIXES[:4]), caching)
    if mix == "full_mamba_dcp":
        # dcp 2 or 4 scales the full-attention block of 8 (dcp-sharded), the
        # Mamba block is replicated: this profile turns partial hits on for a
        # Mamba block at least as wide as the hash block (their gcd).
        dcp = rng.choice((2, 4))
        mbs = rng.choice((16, 32, 64))
        sizes = (8 * dcp, mbs)
        sbs = math.lcm(*sizes)
        mamba = Group("mamba", mbs, mode="align", num_spec=rng.randint(0, 2))
        return dict(groups=(Group("full", 8), mamba), scheduler_block_size=sbs,
                    hash_block_size=math.gcd(*sizes) if caching else sbs, dcp=dcp, pcp=1, replicated=(1,))
    if mix == "full_coarse_mamba":
        # Blocks of 4 to 16 tokens, so that hits on scheduler blocks happen.
        mbs = rng.choice((8, 16))
        if rng.random() < 0.3:
            # Chunked local as wide as the scheduler block (vLLM's chunked
            # hit search asserts it, and no EAGLE block drop).
            sbs = rng.choice((mbs, 16))
            coarse = Group("chunked", sbs, rng.choice((sbs, 2 * sbs)))
            return dict(groups=(Group("full", 4), coarse, Group("mamba", mbs, mode="align")),
                        scheduler_block_size=sbs, hash_block_size=4 if caching else sbs, use_eagle=False)
        sw = Group("sw", rng.choice((8, 16)), rng.randint(3, 40))
        mamba = Group("mamba", mbs, mode="align", num_spec=rng.randint(0, 2))
        sbs = math.lcm(4, sw.block_size, mbs)
        # EAGLE mostly: its cacheable count is not rounded to the scheduler
        # block, so producer tails inside a Mamba block (and their copies) occur.
        return dict(groups=(Group("full", 4), sw, mamba), scheduler_block_size=sbs,
                    hash_block_size=4 if caching else sbs, use_eagle=rng.random() < 0.8)
    if mix == "full_mamba_circ":
        # The ring hashes nothing: its capacity need not be a hash block's multiple.
        mbs, ring = rng.choice((4, 8, 16)), rng.choice((2, 4, 8, 16))
        mamba = Group("mamba", mbs, mode="align", num_spec=rng.randint(0, 2))
        sbs = math.lcm(4, mbs, ring)
        return dict(groups=(Group("full", 4), mamba, Group("circ", ring)), scheduler_block_size=sbs,
                    hash_block_size=4 if caching else sbs)
    mbs = rng.choice((32, 64))
    mamba = Group("mamba", mbs, mode="align", num_spec=rng.randint(0, 2))
    groups: tuple[Group, ...] = (Group("full", 16), mamba)
    if mix == "full_sw_mamba_wide":
        groups = (Group("full", 16), Group("sw", 16, rng.randint(3, 40)), mamba)
    if mix == "full_full_mamba_wide":
        groups = (Group("full", 32), mamba, Group("full", 16))
    return dict(groups=groups, scheduler_block_size=mbs, hash_block_size=16 if caching else mbs)


# Mixes whose vLLM-vs-vLLM self-check the partial-block-hits driver passes (the facade
# supports full attention and sliding window; the others follow as it
# grows). The profile's own: several full-attention groups (equal specs, one
# with a sliding window, different block sizes) and partial Mamba hits.
# full_mamba_ckpt: Mamba align whose layers export prefill checkpoints
# (num_prefill_checkpoint_blocks), with prefix caching too (the reference's
# own asserts there are steered around: the release's fuzz_mamba_guard.py).
PARTIAL_BLOCK_HITS_MIXES = (*MIXES, "full_mamba_partial", "full_full", "full_full_sw", "full_fullbs", "full_sw_mixed",
             *scratch_groups.MIXES, "full_wide_sw", "full_fullbs4",
             "full_mamba_ckpt", "full_sw_mamba", "mamba_only", "chunked_mamba", *_PARTIAL_HIT_MIXES)


_PROFILE_ONLY_MIXES = ("full_mamba_partial", "full_full", "full_full_sw", "full_fullbs", "full_sw_mixed",
                   *scratch_groups.MIXES, "full_wide_sw", "full_fullbs4",
                   "full_mamba_ckpt", "full_sw_mamba", "mamba_only", "chunked_mamba", *_PARTIAL_HIT_MIXES)


def _hybrid_context_parallel(rng: Any, s: Setup) -> Setup:
    """Context parallelism on several attention groups, as this profile sizes it
    (kv_cache_utils.resolve_kv_cache_block_sizes): dcp scales the
    full-attention (dcp-sharded) blocks, the other groups are replicated
    (its hybrid coordinator takes no other), the scheduler block is the
    LCM of the scaled blocks and the hash block their GCD (a scaled
    full-attention block may outgrow it: partial tails). Drawn on a quarter
    of the attention-only multi-group setups."""
    if len(s.groups) < 2 or s.dcp * s.pcp > 1 or any(g.kind == "mamba" for g in s.groups) or rng.random() >= 0.25:
        return s
    if s.caching and any(g.kind == "chunked" for g in s.groups):
        # vLLM's partial-block-hits chunked-local hit search asserts that every group
        # has one block size, which dcp breaks.
        return s
    dcp, pcp = rng.choice(((2, 1), (2, 2), (1, 2), (4, 1)))
    full = [g.kind in ("full", "rswa") for g in s.groups]  # RSWASpec is a FullAttentionSpec
    scaled = [g.block_size * (dcp if f else 1) for g, f in zip(s.groups, full)]
    sbs, hbs = math.lcm(*scaled), math.gcd(*scaled)
    retention = s.retention if not s.retention else rng.choice((sbs, 2 * sbs))
    return dataclasses.replace(s, dcp=dcp, pcp=pcp, scheduler_block_size=sbs, hash_block_size=hbs if s.caching else sbs,
                               retention=retention, replicated=tuple(i for i, f in enumerate(full) if not f))


def _several_full_groups(rng: Any, mix: str, caching: bool) -> dict[str, Any]:
    """The groups and block sizes of the partial-block-hits profile's own mixes: two equal
    full-attention groups (one spec group, looked up together), the same
    with a sliding window, block sizes 4 and 8 (this profile truncates both to
    the hit; with caching the wider one caches partial tails), or full
    attention and sliding window in two precisions. Partial tails (a
    full-attention block wider than the hash block): full attention of 8
    beside a sliding window of 4 (`full_wide_sw`), and full attention of 16
    beside 4 (`full_fullbs4`: three inner hash boundaries per block, so a
    block can carry several partial keys)."""
    if mix == "full_wide_sw":
        sw = Group("sw", 4, rng.randint(3, 14))
        return dict(groups=(Group("full", 8), sw), scheduler_block_size=8, hash_block_size=4 if caching else 8)
    if mix == "full_fullbs4":
        return dict(groups=(Group("full", 16), Group("full", 4)), scheduler_block_size=16,
                    hash_block_size=4 if caching else 16)
    if mix == "full_full":
        bs = rng.choice((4, 8))
        return dict(groups=(Group("full", bs), Group("full", bs)), scheduler_block_size=bs, hash_block_size=bs)
    if mix == "full_sw_mixed":
        # float32 full attention, bfloat16 sliding window: new blocks are
        # recorded for zeroing (take_new_block_ids, skip_zeroing_group_ids).
        sw = Group("sw", rng.choice((4, 8)), rng.randint(3, 14), half=True)
        return dict(groups=(Group("full", 4), sw), scheduler_block_size=8, hash_block_size=4 if caching else 8)
    if mix == "full_full_sw":
        sw = Group("sw", rng.choice((4, 8)), rng.randint(3, 14))
        return dict(groups=(Group("full", 4), Group("full", 4), sw), scheduler_block_size=8,
                    hash_block_size=4 if caching else 8)
    return dict(groups=(Group("full", 4), Group("full", 8)), scheduler_block_size=8,
                hash_block_size=4 if caching else 8)


class PartialBlockHits(FuzzApi, tools_api.BoundaryLookupApi):
    """The partial-block-hits profile: its own mixes and setups, every
    keyword its scheduler passes, its `Request` made for a setup."""

    mixes = PARTIAL_BLOCK_HITS_MIXES

    def random_setup(self, rng: Any, mix: str, caching: bool) -> Setup:
        s = random_setup(rng, "full" if mix in _PROFILE_ONLY_MIXES else mix, caching)
        if s.dcp * s.pcp > 1:
            # The whole-block-hits context-parallel draw (one full-attention group),
            # sized the partial-block-hits profile's way: only dcp scales a block (vLLM's
            # resolve_dcp_kv_block_size); pcp is passed and changes nothing
            # for full attention. The profile-only mixes redraw their groups:
            # no context parallelism there.
            sbs = s.scheduler_block_size // (s.dcp * s.pcp)
            if mix in _PROFILE_ONLY_MIXES:
                s = dataclasses.replace(s, dcp=1, pcp=1, scheduler_block_size=sbs, hash_block_size=sbs)
            else:
                s = dataclasses.replace(s, scheduler_block_size=sbs * s.dcp, hash_block_size=sbs * s.dcp)
        if mix == "full_mamba_partial":
            # A Mamba align block wider than the hash block: sub-block
            # ("partial") hits with copy-on-write (0.26+).
            mamba = Group("mamba", 8, mode="align" if caching else "none", num_spec=rng.randint(0, 2))
            s = dataclasses.replace(s, mix=mix, groups=(Group("full", 4), mamba), scheduler_block_size=8,
                                    hash_block_size=4 if caching else 8)
        elif mix in scratch_groups.MIXES:
            s = dataclasses.replace(s, mix=mix, **scratch_groups.random_groups(rng, mix, caching))
        elif mix == "full_mamba_ckpt":
            bs = rng.choice((4, 8))
            mamba = Group("mamba", bs, mode="align", num_spec=rng.randint(0, 2))
            s = dataclasses.replace(s, mix=mix, groups=(Group("full", bs), mamba), scheduler_block_size=bs,
                                    hash_block_size=bs)
        elif mix == "full_sw_mamba":
            # Full attention, a sliding window and Mamba (the partial-block-hits profile's hybrid tests).
            trio = (Group("full", 4), Group("sw", 4, rng.randint(3, 14)),
                    Group("mamba", 4, mode="align", num_spec=rng.randint(0, 2)))
            s = dataclasses.replace(s, mix=mix, groups=trio, scheduler_block_size=4, hash_block_size=4)
        elif mix == "mamba_only":
            # A model of Mamba layers only (the partial-block-hits profile's unitary coordinator;
            # with caching its block is the hash block).
            bs = rng.choice((4, 8))
            mamba = Group("mamba", bs, mode="align" if caching else "none", num_spec=rng.randint(0, 2))
            s = dataclasses.replace(s, mix=mix, groups=(mamba,), scheduler_block_size=bs, hash_block_size=bs)
        elif mix == "chunked_mamba":
            # Chunked local attention beside Mamba (Llama-4-style local layers
            # in a hybrid); chunked local's block is the scheduler's.
            bs = rng.choice((4, 8))
            groups: tuple[Group, ...] = (Group("full", bs), Group("chunked", bs, rng.choice((8, 16))),
                      Group("mamba", bs, mode="align" if caching else "none", num_spec=rng.randint(0, 2)))
            # vLLM's chunked-local hit search asserts no EAGLE block drop.
            s = dataclasses.replace(s, mix=mix, groups=groups[rng.random() < 0.5:], scheduler_block_size=bs,
                                    hash_block_size=bs, use_eagle=False)
        elif mix in _PARTIAL_HIT_MIXES:
            s = dataclasses.replace(s, mix=mix, **_partial_hit_groups(rng, mix, caching))
        elif mix in _PROFILE_ONLY_MIXES:
            s = dataclasses.replace(s, mix=mix, **_several_full_groups(rng, mix, caching))
        # Sparse retention is a KVCacheConfig field in this profile (the scheduler's
        # default 0: replay boundaries and shared-prefix junctions only), for
        # sliding window and Mamba groups.
        retention = None
        if caching and any(g.kind in ("sw", "mamba", *scratch_groups.SPARSE_KINDS) for g in s.groups):
            retention = rng.choice((None, 0, 0, s.scheduler_block_size, 2 * s.scheduler_block_size))
        elif any(g.kind == "mamba" for g in s.groups):
            # Without caching retention only moves Mamba checkpoints (0: the prefill end's only).
            retention = rng.choice((None, 0))
        s = dataclasses.replace(s, metrics_sample_rate=None, retention=retention)
        # This profile knows Mamba cache modes "align" and "none" only ("all" is gone);
        # without prefix caching either may be configured (align needs no cache).
        has_mamba = any(g.kind == "mamba" for g in s.groups)
        mamba_mode = "align" if caching or (has_mamba and rng.random() < 0.5) else "none"
        # Mamba2 / GDN layers export prefill checkpoints (0.29+); others do not.
        # Drawn without caching only: with it vLLM there can raise an
        # AssertionError in cache_blocks (sw_mamba, self-check seed 33), and
        # the facade covers Mamba without prefix caching.
        checkpoint = rng.choice((None, 1, s.hash_block_size)) if mamba_mode == "align" and not caching else None
        if mix == "full_mamba_ckpt" and mamba_mode == "align":
            checkpoint = rng.choice((1, s.hash_block_size))  # with caching too
        if mix in _PARTIAL_HIT_MIXES and mamba_mode == "align":
            checkpoint = rng.choice((None, 1, s.hash_block_size))
        groups = tuple(dataclasses.replace(g, mode=mamba_mode, checkpoint=checkpoint) if g.kind == "mamba" else g
                       for g in s.groups)
        s = dataclasses.replace(s, groups=groups)
        sbs = s.scheduler_block_size
        use_eagle, spec, hash_la, prefill_la = False, 0, 0, 0
        if s.use_eagle or mix == _JUNCTION_MIX:
            # EAGLE-family (one token of prefill lookahead) or multi-module
            # MTP (one per draft token); vLLM wants sbs >= that with caching.
            spec = rng.randint(1, 4)
            prefill_la = min(spec, sbs) if rng.random() < 0.3 else 1
            if caching and mix != _JUNCTION_MIX and rng.random() < 0.6 and any(g.kind == "full" for g in s.groups):
                # Lookahead block hashes (this profile's default for EAGLE with
                # caching): the scheduler then passes use_eagle=False.
                # Without a full-attention group vLLM's partial-block-hits hit search
                # indexes past the (fewer) lookahead hashes (IndexError in
                # SlidingWindowManager.find_longest_cache_hit): steered around.
                hash_la = prefill_la
            else:
                use_eagle = True
        elif rng.random() < 0.3:
            spec = rng.randint(1, 3)  # draft-model / n-gram drafts: no EAGLE rules
        s = _hybrid_context_parallel(rng, s)
        return dataclasses.replace(
            s,
            release=self.name,
            use_eagle=use_eagle,
            spec_tokens=spec,
            dynamic_drafts=spec > 0 and rng.random() < 0.5,
            hash_lookahead=hash_la,
            prefill_lookahead=prefill_la,
            watermark=rng.choice((0.0, 0.0, 0.05, 0.1)),
            max_in_flight_tokens=rng.choice((None, 16, 64, 256)),
            full_must_fit=rng.random() < 0.2,
            deferred_frees=rng.random() < 0.5,
            async_sched=rng.random() < 0.4,
            # Mamba states keyed at shared-prefix junctions, where the
            # scheduler then ends chunks (on with EAGLE, partial hits and
            # no multi-module MTP; the flag narrows to off elsewhere). Drawn
            # on the partial-hit mixes only, so other mixes keep their draws.
            shared_prefix_checkpoint=mix == _JUNCTION_MIX or mix in _PARTIAL_HIT_MIXES and rng.random() < 0.7,
        )

    def manager_kwargs(self, s: Setup) -> dict[str, Any]:
        # Every keyword the partial-block-hits profile's scheduler passes (scheduler.py L351-370).
        return dict(
            max_model_len=s.max_model_len,
            max_in_flight_tokens=s.max_in_flight_tokens,
            enable_caching=s.caching,
            use_eagle=s.use_eagle,
            num_hash_lookahead_tokens=s.hash_lookahead,
            num_prefill_lookahead=s.prefill_lookahead,
            log_stats=s.log_stats,
            enable_kv_cache_events=s.events,
            dcp_world_size=s.dcp,
            pcp_world_size=s.pcp,
            scheduler_block_size=s.scheduler_block_size,
            hash_block_size=s.hash_block_size,
            metrics_collector=None,
            watermark=s.watermark,
            enable_mamba_shared_prefix_checkpoint=s.shared_prefix_checkpoint,
        )

    def kv_cache_config(self, s: Setup) -> Any:
        if scratch_groups.covers(s):
            cfg = scratch_groups.kv_cache_config(s)
        else:
            cfg = configs.vllm_kv_cache_config(group_specs(s), s.num_blocks)
            cfg.prefix_cache_retention_interval = s.retention
        for i in s.replicated:
            g = cfg.kv_cache_groups[i]
            g.kv_cache_spec = dataclasses.replace(g.kv_cache_spec, dcp_sharded=False)
        return cfg

    def build_reference(self, s: Setup) -> Any:
        from vllm.v1.core.kv_cache_manager import KVCacheManager

        return KVCacheManager(kv_cache_config=self.kv_cache_config(s), **self.manager_kwargs(s))

    def build_facade(self, s: Setup) -> Any:
        module, cls = self.facade
        facade = getattr(importlib.import_module(module), cls)
        # The scheduler hands the facade vLLM's own KVCacheConfig.
        return facade(kv_cache_config=self.kv_cache_config(s), **self.manager_kwargs(s))

    def make_request(
        self,
        s: Setup,
        request_id: str,
        tokens: Sequence[int],
        *,
        lora: bool = False,
        cache_salt: str | None = None,
        skip_reading_prefix_cache: bool = False,
        report_full: bool = False,
        session_id: str | None = None,
    ) -> Any:
        """vLLM's own `Request` for setup `s`, hashed by its request block hasher."""
        r = self.tool_request(request_id, tokens, s.hash_block_size if s.caching else None, s.max_model_len,
                              1 if lora else None, cache_salt, skip_reading_prefix_cache,
                              hash_lookahead=s.hash_lookahead, session_id=session_id)
        if report_full:
            r.kv_cache_report_mode = "full"
        return r


def _fuzz_api(row: Any) -> FuzzApi:
    return {"whole-block-hits": WholeBlockHits, "partial-block-hits": PartialBlockHits}[row.profile]()


RELEASES: dict[str, Any] = {}


def release(name: str) -> Any:
    """The `FuzzApi` of vLLM release `name`: its profile's, with the row's
    version and facade (`hybridcache_dev.release_api.registry_lookup`)."""
    return tools_api.registry_lookup(RELEASES, name, _fuzz_api)


def norm_block_list(blocks: Sequence[Any]) -> tuple[Any, ...]:
    """`KVCacheBlock`s handed out for a later `block_pool.free_blocks`."""
    return freeze([b.block_id for b in blocks])
