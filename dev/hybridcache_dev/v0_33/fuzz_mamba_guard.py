"""Steering the 0.33.0 fuzz around vLLM 0.33.0's own crashes with Mamba
"align" prefill checkpoint blocks under prefix caching: a checkpoint that
`get_num_blocks_to_allocate` recorded for an allocation that then failed
(or an earlier step's) stays in `MambaManager._checkpoints`, and a later
`cache_blocks` asserts on it (`_cache_partial_tail_block`'s
`0 <= checkpoint_idx < len(blocks)`, or `cache_full_blocks`' promotion
assert when a block keyed at its own boundary comes due again).

The reference is wrapped so those calls are recognised before they run
(state untouched); the driver then skips them on both managers and counts
a known bug avoided, as for the other pinned crashes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridcache_dev.v0_33.fuzz_driver import SchedulerDriver
from hybridcache_dev.fuzz_setup import ReferenceError_


class KnownCrash(Exception):
    """vLLM 0.33.0 would assert on this call (see the module docstring)."""


def _checkpoint_managers(ref: Any) -> list[tuple[int, Any]]:
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager

    return [(i, m) for i, m in enumerate(ref.coordinator.single_type_managers)
            if isinstance(m, MambaManager) and m.enable_caching and m.mamba_cache_mode == "align"
            and m.has_prefill_checkpoint_blocks]


def would_crash(ref: Any, request: Any, num_tokens: int, direct: bool, query: tuple[int, int] = (0, 0)) -> bool:
    """Whether caching `num_tokens` of `request` asserts in vLLM 0.33.0
    (`direct`: `cache_blocks` itself, whose checkpoint is a stale one;
    else an allocation computing `query` (start, end), which may record
    one: judged without the table, so at worst a call too many is skipped)."""
    from vllm.v1.kv_cache_interface import get_mamba_prefill_checkpoint_position, is_mamba_prefill_checkpoint_valid

    rid = request.request_id
    for gid, m in _checkpoint_managers(ref):
        blocks = m.req_to_blocks.get(rid, [])
        checkpoint = m._checkpoints.get(rid)
        if direct and checkpoint is not None and not 0 <= checkpoint[1] < len(blocks):
            return True
        # A checkpoint (or the prompt boundary) keyed past the request's
        # hashes (lookahead hashes trail the tokens; drafts add tokens).
        hbs = m.block_pool.hash_block_size
        if direct:
            position = checkpoint[0] if checkpoint is not None else 0
        else:
            start, end = query
            position = get_mamba_prefill_checkpoint_position(
                end, m.cache_hit_alignment_tokens, m.drop_eagle_checkpoint_block,
                num_hash_lookahead_tokens=m.block_pool.num_hash_lookahead_tokens)
            prefill_end = (max(request.num_prompt_tokens, request.num_tokens - 1)
                           if ref.coordinator.retention_interval == 0 else 0)
            if not (end >= prefill_end and end > m.block_size and is_mamba_prefill_checkpoint_valid(
                    start, end, position, hbs, m.block_size, m.kv_cache_spec.prefill_checkpoint_alignment)):
                position = 0
        if position // hbs > len(request.block_hashes):
            return True
        tokens = ref.coordinator.get_num_cacheable_tokens(num_tokens, gid)
        latest = get_mamba_prefill_checkpoint_position(
            request.num_prompt_tokens, hbs, m.drop_eagle_checkpoint_block,
            num_hash_lookahead_tokens=m.block_pool.num_hash_lookahead_tokens)
        if tokens == latest and tokens // hbs > len(request.block_hashes):
            return True
        num_full = min(tokens, len(request.block_hashes) * m.block_pool.hash_block_size) // m.block_size
        for i in range(m.num_cached_block.get(rid, 0), min(num_full, len(blocks))):
            b = blocks[i]
            if not b.is_null and b.block_hash is not None and (
                    b.block_hash_num_tokens is None or b.block_hash_num_tokens >= (i + 1) * m.block_size):
                return True
    return False


class GuardedReference:
    """vLLM 0.33.0's manager, raising `KnownCrash` (before anything runs)
    where its own caching would assert."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> Any:
        if would_crash(self._inner, request, num_computed_tokens, direct=True):
            raise KnownCrash("cache_blocks")
        return self._inner.cache_blocks(request, num_computed_tokens)

    def allocate_slots(self, request: Any, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       *args: Any, **kw: Any) -> Any:
        if not kw.get("delay_cache_blocks", False) and not args:
            total = min(request.num_computed_tokens + num_new_computed_tokens
                        + kw.get("num_external_computed_tokens", 0), self._inner.max_model_len)
            if would_crash(self._inner, request, min(total + num_new_tokens, request.num_tokens), direct=False,
                           query=(total, total + num_new_tokens)):
                raise KnownCrash("allocate_slots")
        return self._inner.allocate_slots(request, num_new_tokens, num_new_computed_tokens, *args, **kw)


    def truncate_computed_blocks(self, blocks: Any, num_computed_tokens: int) -> Any:
        # A connector lookup with Mamba layers reports the full-attention hit;
        # a sliding-window group's own hit may be shorter, and vLLM asserts
        # when asked to cut it at the full-attention length.
        from vllm.v1.core.single_type_kv_cache_manager import MambaManager

        for m, group_blocks in zip(self._inner.coordinator.single_type_managers, blocks.blocks):
            if not isinstance(m, MambaManager) and num_computed_tokens // m.block_size > len(group_blocks):
                raise KnownCrash("truncate_computed_blocks")
        return self._inner.truncate_computed_blocks(blocks, num_computed_tokens)


def guards(setup: Any) -> bool:
    """Setups whose reference needs the guard: Mamba align with prefix
    caching (prefill checkpoint blocks; beside a sliding window)."""
    return setup.caching and any(g.kind == "mamba" and g.mode == "align" for g in setup.groups)


def guard_reference(ref: Any, setup: Any) -> Any:
    """vLLM's manager `ref` for `setup`, guarded where `guards(setup)`."""
    return GuardedReference(ref) if guards(setup) else ref


class GuardedDriver(SchedulerDriver):
    """`SchedulerDriver` that skips (on both managers) a call the guarded
    reference recognised as one of vLLM 0.33.0's crashes."""

    def both(self, op: str, fn: Callable[[Any], Any], norm: Callable[[Any], Any] = lambda x: x) -> tuple[Any, Any]:
        try:
            return super().both(op, fn, norm)
        except ReferenceError_ as e:
            if not isinstance(e.__cause__, KnownCrash) or self.allow_known_bugs:
                raise
            self.f.known_bug_avoided += 1
            return None, None
