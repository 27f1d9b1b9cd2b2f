"""Pure-Python copy planners mirroring vLLM's worker (the reference for
a native planner). Format: see the ``hybridcache.kernels`` docstring."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

# Pre-plan columns.
GROUP, DST, CONV_SRC, TEMP_SRC, BIAS = range(5)
PRE_COLS = 5
# Post-plan: GROUP, REQ, then K1 candidates of POST_FIELDS ints
# (DST_j, CONV_SRC_j, TEMP_SRC_j, BIAS_j, RESET_j) at 2 + POST_FIELDS*j.
REQ = 1
POST_FIELDS = 5
_INERT = (-1, -1, -1, 0, 0)


class PrePlan(NamedTuple):
    plan: torch.Tensor  # int32 (N, 5), CPU
    state_idx: list[int]  # mamba_state_idx after the step (= cur), per request
    num_accepted: list[int]  # num_accepted_tokens_cpu after the step


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def plan_from_block_tables(
    block_ids: Sequence[Sequence[Sequence[int]]],
    num_computed: Sequence[int],
    num_scheduled: Sequence[int],
    num_accepted: Sequence[int],
    prev_state_idx: Sequence[int | None],
    block_size: int,
    num_speculative_blocks: int,
) -> PrePlan:
    """vLLM's ``preprocess_mamba`` + ``collect_mamba_copy_meta`` as a plan.

    ``block_ids[i][g]``: the worker's block ids of request ``i`` (batch order)
    for mamba group ``g``. ``prev_state_idx[i]``: ``mamba_state_idx[req]`` or
    ``None`` for a new/resumed request. ``num_accepted``: the worker's
    ``num_accepted_tokens_cpu``.
    """
    n = len(block_ids)
    if not (len(num_computed) == len(num_scheduled) == len(num_accepted) == len(prev_state_idx) == n):
        raise ValueError("per-request inputs must all have len(block_ids) entries")
    B = block_size
    del num_speculative_blocks  # cur does not depend on it (num_blocks - 1 - k)
    rows: list[tuple[int, int, int, int, int]] = []
    state_idx: list[int] = []
    accepted = [int(a) for a in num_accepted]
    for i in range(n):
        nc = int(num_computed[i])
        prev = prev_state_idx[i]
        if prev is None:
            prev = (nc - 1) // B
        cur = _cdiv(nc + int(num_scheduled[i]), B) - 1  # = num_blocks - 1 - k in vLLM
        state_idx.append(cur)
        if prev != -1 and prev != cur:
            bias = accepted[i] - 1
            for g, ids in enumerate(block_ids[i]):
                if not (0 <= prev and prev + bias < len(ids) and 0 <= cur < len(ids)) or bias < 0:
                    raise ValueError(
                        f"request {i} group {g}: indices prev={prev} cur={cur} bias={bias} "
                        f"outside its {len(ids)} block ids"
                    )
                rows.append((g, ids[cur], ids[prev], ids[prev + bias], bias))
            accepted[i] = 1
    plan = torch.tensor(rows, dtype=torch.int32) if rows else torch.empty((0, PRE_COLS), dtype=torch.int32)
    return PrePlan(plan.reshape(-1, PRE_COLS), state_idx, accepted)


def post_decision(running: int, src: int, j: int, num_draft: int, block_size: int):
    """vLLM's fused-postprocess decision for ``a = j + 1`` accepted tokens.

    Returns ``None`` (nothing happens) or ``(copy, dst_idx, bias, reset)``.
    """
    if j < 0 or j > num_draft:
        return None
    aligned = ((running + j) // block_size) * block_size
    if aligned < running:
        return None
    bias = aligned - running
    dst = aligned // block_size - 1
    reset = src == dst
    return (not (reset and bias == 0), dst, bias, reset)


def post_plan_from_block_tables(
    block_ids: Sequence[Sequence[Sequence[int]]],
    state_idx: Sequence[int],
    num_computed: Sequence[int],
    num_scheduled: Sequence[int],
    num_draft: Sequence[int],
    block_size: int,
    num_speculative_blocks: int,
) -> torch.Tensor:
    """The post-verification plan, int32 ``(N, 2 + 5*(k+1))``.

    Inputs as staged by vLLM's ``stage_postprocess_inputs_to_gpu``:
    ``state_idx`` = ``mamba_state_idx`` after this step's preprocess,
    ``num_computed`` / ``num_scheduled`` / ``num_draft`` per request.
    """
    n = len(block_ids)
    if not (len(state_idx) == len(num_computed) == len(num_scheduled) == len(num_draft) == n):
        raise ValueError("per-request inputs must all have len(block_ids) entries")
    k1 = num_speculative_blocks + 1
    rows: list[list[int]] = []
    for i in range(n):
        nd = int(num_draft[i])
        if nd > num_speculative_blocks:
            raise ValueError(f"request {i}: {nd} drafts > num_speculative_blocks")
        running = int(num_computed[i]) + int(num_scheduled[i]) - nd
        src = int(state_idx[i])
        decisions = [post_decision(running, src, j, nd, block_size) for j in range(k1)]
        if not any(d is not None and d[0] for d in decisions):
            continue
        for g, ids in enumerate(block_ids[i]):
            row = [g, i]
            for d in decisions:
                if d is None:
                    row.extend(_INERT)
                    continue
                copy, dst, bias, reset = d
                if not copy:
                    row.extend((-1, -1, -1, 0, int(reset)))
                    continue
                if not (0 <= dst < len(ids) and 0 <= src and src + bias < len(ids)):
                    raise ValueError(
                        f"request {i} group {g}: indices src={src} dst={dst} bias={bias} "
                        f"outside its {len(ids)} block ids"
                    )
                row.extend((ids[dst], ids[src], ids[src + bias], bias, int(reset)))
            rows.append(row)
    cols = 2 + POST_FIELDS * k1
    if not rows:
        return torch.empty((0, cols), dtype=torch.int32)
    return torch.tensor(rows, dtype=torch.int32)


def pad_plan(plan: torch.Tensor, capacity: int) -> torch.Tensor:
    """``plan`` padded with inert rows (``DST = -1``) to ``capacity`` rows, for
    fixed-shape (CUDA graph) launches. Works for pre and post plans."""
    n, cols = plan.shape
    if n > capacity:
        raise ValueError(f"plan has {n} rows > capacity {capacity}")
    out = torch.empty((capacity, cols), dtype=plan.dtype, device=plan.device)
    out[:n] = plan
    pad = out[n:]
    pad.zero_()
    if cols == PRE_COLS:
        pad[:, DST] = -1
    else:
        k1 = (cols - 2) // POST_FIELDS
        for j in range(k1):
            pad[:, 2 + POST_FIELDS * j : 2 + POST_FIELDS * j + 3] = -1
    return out


def native_pre_plan(manager, request_ids: Sequence[str], num_accepted: Sequence[int]) -> torch.Tensor:
    """This step's pre-forward plan, built by the manager from its own block
    tables in one native call: int32 ``(N, 5)``, same format as
    ``plan_from_block_tables``. Advances the manager's running-state indices."""
    raw = manager.mamba_pre_copy_plan(list(request_ids), [int(a) for a in num_accepted])
    return torch.frombuffer(raw, dtype=torch.int32).reshape(-1, PRE_COLS) if raw else torch.empty((0, PRE_COLS), dtype=torch.int32)


def native_post_plan(manager, request_ids: Sequence[str], num_draft: Sequence[int]) -> torch.Tensor:
    """The post-verification plan from the manager's own tables: int32
    ``(N, 2 + 5*(k+1))``, same format as ``post_plan_from_block_tables``."""
    raw, cols = manager.mamba_post_select_plan(list(request_ids), [int(d) for d in num_draft])
    if not raw:
        return torch.empty((0, cols), dtype=torch.int32)
    return torch.frombuffer(raw, dtype=torch.int32).reshape(-1, cols)
