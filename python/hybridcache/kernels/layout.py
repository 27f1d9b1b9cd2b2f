"""vLLM's Mamba state views over a raw page buffer
(``gpu_model_runner.py:7135-7157``), for tests, benchmarks and callers."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def vllm_state_views(
    raw: torch.Tensor,
    num_blocks: int,
    page_size_bytes: int,
    shapes: Sequence[Sequence[int]],
    dtypes: Sequence[torch.dtype],
) -> list[torch.Tensor]:
    """``[as_strided((num_blocks, *shape))]`` per state, as vLLM builds them:
    page stride ``page_size_bytes / elsize``, states packed from byte 0 of
    the page in order, the rest of the page is padding."""
    if raw.dtype != torch.int8 or raw.dim() != 1:
        raise ValueError("raw must be a 1-D int8 buffer")
    if raw.numel() < num_blocks * page_size_bytes:
        raise ValueError("raw buffer smaller than num_blocks pages")
    views = []
    offset = 0
    for shape, dtype in zip(shapes, dtypes, strict=True):
        elsize = torch.empty((), dtype=dtype).element_size()
        if page_size_bytes % elsize or offset % elsize:
            raise ValueError("page size and state offsets must be multiples of the element size")
        target = (num_blocks, *shape)
        stride = torch.empty(target, device="meta").stride()
        views.append(
            torch.as_strided(
                raw.view(dtype),
                size=target,
                stride=(page_size_bytes // elsize, *stride[1:]),
                storage_offset=offset // elsize,
            )
        )
        offset += stride[0] * elsize
    if offset > page_size_bytes:
        raise ValueError(f"states need {offset} bytes > page size {page_size_bytes}")
    return views


def byte_views(states: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """int8 views of state tensors (same pages, rows of ``stride(1)*elsize``
    bytes): what to hand the ops from inside ``torch.compile``."""
    return [t.view(torch.int8) for t in states]
