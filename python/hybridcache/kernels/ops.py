"""``torch.library`` registration: ``hybridcache::mamba_pre_copy`` and
``hybridcache::mamba_post_select``. Default kernel (CPU and any device):
torch indexing; CUDA: one Triton launch (falls back to torch indexing when
Triton is not importable)."""

from __future__ import annotations

import torch

from hybridcache.kernels.torch_impl import post_select_torch, pre_copy_torch


@torch.library.custom_op("hybridcache::mamba_pre_copy", mutates_args=("conv_states", "temporal_states"))
def mamba_pre_copy(
    conv_states: list[torch.Tensor], temporal_states: list[torch.Tensor], plan: torch.Tensor, num_groups: int
) -> None:
    """Pre-forward copy of every plan row for all layers of its group (see the
    package docstring for the plan format)."""
    pre_copy_torch(conv_states, temporal_states, plan, num_groups)


@torch.library.custom_op(
    "hybridcache::mamba_post_select", mutates_args=("conv_states", "temporal_states", "num_accepted_out")
)
def mamba_post_select(
    conv_states: list[torch.Tensor],
    temporal_states: list[torch.Tensor],
    plan: torch.Tensor,
    num_groups: int,
    num_accepted: torch.Tensor,
    num_accepted_out: torch.Tensor,
) -> None:
    """Post-verification accepted-state selection (vLLM's
    ``postprocess_mamba_fused_kernel``) driven by the device-side
    ``num_accepted``; writes ``num_accepted_out[:len(num_accepted)]``."""
    post_select_torch(conv_states, temporal_states, plan, num_groups, num_accepted, num_accepted_out)


def _triton_or_none():
    try:
        from hybridcache.kernels import triton_impl
    except ImportError:  # no Triton: CUDA falls back to torch indexing
        return None
    return triton_impl


@mamba_pre_copy.register_kernel("cuda")
def _pre_cuda(conv_states, temporal_states, plan, num_groups):
    ti = _triton_or_none()
    if ti is None:
        pre_copy_torch(conv_states, temporal_states, plan, num_groups)
    else:
        ti.launch(conv_states, temporal_states, plan, num_groups)


@mamba_post_select.register_kernel("cuda")
def _post_cuda(conv_states, temporal_states, plan, num_groups, num_accepted, num_accepted_out):
    ti = _triton_or_none()
    if ti is None:
        post_select_torch(conv_states, temporal_states, plan, num_groups, num_accepted, num_accepted_out)
    else:
        ti.launch(conv_states, temporal_states, plan, num_groups, num_accepted, num_accepted_out)


@mamba_pre_copy.register_fake
def _pre_fake(conv_states, temporal_states, plan, num_groups):
    return None


@mamba_post_select.register_fake
def _post_fake(conv_states, temporal_states, plan, num_groups, num_accepted, num_accepted_out):
    return None
