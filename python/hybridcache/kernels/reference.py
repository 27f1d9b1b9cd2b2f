"""Plain per-row reference of the two ops (slow; the oracle for the tests)."""

from __future__ import annotations

import torch

from hybridcache.kernels._common import as_int, check_layout, check_plan
from hybridcache.kernels.plan import POST_FIELDS


def _copy_row(conv_states, temporal_states, lay, g, dst, csrc, tsrc, bias):
    for l in range(g * lay.layers_per_group, (g + 1) * lay.layers_per_group):
        if conv_states:
            c = as_int(conv_states[l])
            r = c.shape[1]
            c[dst, : r - bias].copy_(c[csrc, bias:].clone())
        if temporal_states:
            t = as_int(temporal_states[l])
            t[dst].copy_(t[tsrc].clone())


def pre_copy_reference(conv_states, temporal_states, plan: torch.Tensor, num_groups: int) -> None:
    lay = check_layout(conv_states, temporal_states, num_groups)
    dev = (conv_states or temporal_states)[0].device
    check_plan(plan, False, dev)
    for g, dst, csrc, tsrc, bias in plan.tolist():
        if dst >= 0:
            _copy_row(conv_states, temporal_states, lay, g, dst, csrc, tsrc, bias)


def post_select_reference(
    conv_states, temporal_states, plan: torch.Tensor, num_groups: int,
    num_accepted: torch.Tensor, num_accepted_out: torch.Tensor,
) -> None:
    lay = check_layout(conv_states, temporal_states, num_groups)
    dev = (conv_states or temporal_states)[0].device
    k1 = check_plan(plan, True, dev)
    acc = num_accepted.tolist()
    out = list(acc)
    for row in plan.tolist():
        g, req = row[0], row[1]
        j = acc[req] - 1
        if not 0 <= j < k1:
            continue
        dst, csrc, tsrc, bias, reset = row[2 + POST_FIELDS * j : 2 + POST_FIELDS * (j + 1)]
        if reset:
            out[req] = 1
        if dst >= 0:
            _copy_row(conv_states, temporal_states, lay, g, dst, csrc, tsrc, bias)
    num_accepted_out[: len(out)].copy_(torch.tensor(out, dtype=num_accepted_out.dtype))
