"""Layout checks shared by the implementations."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hybridcache.kernels.plan import POST_FIELDS, PRE_COLS

_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_int(t: torch.Tensor) -> torch.Tensor:
    """Same-size integer view, so copies are bit-exact whatever the dtype."""
    if t.dtype in _INT_OF_SIZE.values() or t.dtype == torch.uint8:
        return t
    return t.view(_INT_OF_SIZE[t.element_size()])


@dataclass(frozen=True)
class Layout:
    num_layers: int
    layers_per_group: int
    conv_rows: int  # R (0 without conv states)
    conv_row_bytes: int
    conv_page_bytes: int
    temp_bytes: int  # natural temporal state bytes (0 without temporal states)
    temp_page_bytes: int


def _check_list(states: list[torch.Tensor], name: str) -> torch.Tensor | None:
    if not states:
        return None
    t0 = states[0]
    if t0.dim() < 2:
        raise ValueError(f"{name}[0]: expected (num_blocks, ...) with at least 2 dims, got {tuple(t0.shape)}")
    if t0.element_size() not in _INT_OF_SIZE:
        raise ValueError(f"{name}: unsupported dtype {t0.dtype}")
    if not t0[0].is_contiguous():
        raise ValueError(f"{name}[0]: each block's state must be contiguous within its page")
    if t0.stride(0) * t0.element_size() < t0[0].numel() * t0.element_size():
        raise ValueError(f"{name}[0]: page stride smaller than the state")
    for i, t in enumerate(states):
        if (t.shape, t.stride(), t.dtype, t.device) != (t0.shape, t0.stride(), t0.dtype, t0.device):
            raise ValueError(f"{name}[{i}]: shape/stride/dtype/device differ from {name}[0]")
    return t0


def check_layout(conv_states, temporal_states, num_groups: int) -> Layout:
    c0 = _check_list(conv_states, "conv_states")
    t0 = _check_list(temporal_states, "temporal_states")
    if c0 is None and t0 is None:
        raise ValueError("conv_states and temporal_states are both empty")
    if c0 is not None and t0 is not None:
        if len(conv_states) != len(temporal_states):
            raise ValueError("conv_states and temporal_states must have one entry per layer each")
        if c0.device != t0.device:
            raise ValueError("conv and temporal states on different devices")
    num_layers = len(conv_states) or len(temporal_states)
    if num_groups < 1 or num_layers % num_groups:
        raise ValueError(f"{num_layers} layers cannot be split into {num_groups} groups")
    if c0 is not None:
        es = c0.element_size()
        conv = (c0.shape[1], c0.stride(1) * es, c0.stride(0) * es)
    else:
        conv = (0, 0, 0)
    if t0 is not None:
        temp = (t0[0].numel() * t0.element_size(), t0.stride(0) * t0.element_size())
    else:
        temp = (0, 0)
    return Layout(num_layers, num_layers // num_groups, *conv, *temp)


def check_plan(plan: torch.Tensor, post: bool, device: torch.device) -> int:
    """Validates the plan tensor; returns K1 for post plans (0 for pre)."""
    if plan.dtype != torch.int32 or plan.dim() != 2 or not plan.is_contiguous():
        raise ValueError("plan must be a contiguous 2-D int32 tensor")
    if plan.device != device:
        raise ValueError(f"plan on {plan.device}, states on {device}")
    cols = plan.shape[1]
    if not post:
        if cols != PRE_COLS:
            raise ValueError(f"pre-copy plan must have {PRE_COLS} columns, got {cols}")
        return 0
    if cols < 2 + POST_FIELDS or (cols - 2) % POST_FIELDS:
        raise ValueError(f"post plan must have 2 + {POST_FIELDS}*K1 columns, got {cols}")
    return (cols - 2) // POST_FIELDS


def byte_alignment(values) -> int:
    """Largest power of two <= 16 dividing every value."""
    g = 16
    for v in values:
        g = math.gcd(g, int(v))
    return g
