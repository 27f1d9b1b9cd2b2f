"""Vectorised torch-indexing implementation: the CPU kernel of the ops (and
the fallback on any device without Triton). Bit-exact: copies go through
same-size integer views."""

from __future__ import annotations

import torch

from hybridcache.kernels._common import Layout, as_int, check_layout, check_plan
from hybridcache.kernels.plan import BIAS, CONV_SRC, DST, GROUP, POST_FIELDS, TEMP_SRC


def _apply(conv_states, temporal_states, lay: Layout, num_groups: int, p: torch.Tensor) -> None:
    """``p``: int64 (N, 5) pre-plan rows, inert rows allowed."""
    p = p[p[:, DST] >= 0]
    if p.numel() == 0:
        return
    for g in range(num_groups):
        pg = p[p[:, GROUP] == g]
        if pg.numel() == 0:
            continue
        dst, csrc, tsrc, bias = pg[:, DST], pg[:, CONV_SRC], pg[:, TEMP_SRC], pg[:, BIAS]
        by_bias = [(b, bias == b) for b in torch.unique(bias).tolist()] if conv_states else []
        for l in range(g * lay.layers_per_group, (g + 1) * lay.layers_per_group):
            if temporal_states:
                t = as_int(temporal_states[l])
                t[dst] = t[tsrc]  # gathers all sources before writing
            if conv_states:
                c = as_int(conv_states[l])
                r = c.shape[1]
                for b, m in by_bias:
                    c[dst[m], : r - b] = c[csrc[m], b:]


def pre_copy_torch(conv_states, temporal_states, plan: torch.Tensor, num_groups: int) -> None:
    lay = check_layout(conv_states, temporal_states, num_groups)
    check_plan(plan, False, (conv_states or temporal_states)[0].device)
    if plan.shape[0]:
        _apply(conv_states, temporal_states, lay, num_groups, plan.long())


def post_select_torch(
    conv_states, temporal_states, plan: torch.Tensor, num_groups: int,
    num_accepted: torch.Tensor, num_accepted_out: torch.Tensor,
) -> None:
    lay = check_layout(conv_states, temporal_states, num_groups)
    k1 = check_plan(plan, True, (conv_states or temporal_states)[0].device)
    n = num_accepted.numel()
    num_accepted_out[:n].copy_(num_accepted)
    rows = plan.shape[0]
    if rows == 0:
        return
    p = plan.long()
    req = p[:, 1]
    j = num_accepted.long()[req] - 1
    valid = (j >= 0) & (j < k1)
    cand = p[:, 2:].view(rows, k1, POST_FIELDS)[torch.arange(rows, device=p.device), j.clamp(0, k1 - 1)]
    reset = valid & (cand[:, 4] != 0)
    num_accepted_out[req[reset]] = 1
    dst = torch.where(valid, cand[:, 0], torch.full_like(cand[:, 0], -1))
    pre = torch.stack([p[:, 0], dst, cand[:, 1], cand[:, 2], cand[:, 3]], dim=1)
    _apply(conv_states, temporal_states, lay, num_groups, pre)
