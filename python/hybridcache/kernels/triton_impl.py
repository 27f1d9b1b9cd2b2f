"""Triton implementation (CUDA; also runs under Triton's CPU interpreter).

One launch per call, 1-D grid of ``N * Lg * (n_temp_chunks + has_conv)``
programs, ``pid -> (plan row, layer in group, item)``:

* temporal items: one ``chunk_bytes`` slice of the layer's temporal state
  (large states are split across many CTAs);
* the conv item: the whole shifted conv window, ``(R - BIAS) * row`` bytes, in
  one CTA with a barrier between each tile's loads and stores, so the in-place
  shift (``CONV_SRC == DST``) is a correct forward move.

Copies are in 4-byte words with 16-byte alignment hints (``ld/st.global.v4``)
when every base address, page stride, conv row and state size is a multiple
of 16 bytes; otherwise in the widest word that divides them all.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hybridcache.kernels._common import Layout, byte_alignment, check_layout, check_plan

# Tuning (bytes). chunk is chosen per launch in [CHUNK_MIN, CHUNK_MAX] so that
# the grid has at least TARGET_CTAS_PER_SM * num_SMs programs when possible.
TUNING = {
    "chunk_max": int(os.environ.get("HYBRIDCACHE_MAMBA_CHUNK_MAX", 64 * 1024)),
    "chunk_min": int(os.environ.get("HYBRIDCACHE_MAMBA_CHUNK_MIN", 16 * 1024)),
    "block_bytes": int(os.environ.get("HYBRIDCACHE_MAMBA_BLOCK_BYTES", 8 * 1024)),
    "num_warps": int(os.environ.get("HYBRIDCACHE_MAMBA_NUM_WARPS", 4)),
    "target_ctas_per_sm": int(os.environ.get("HYBRIDCACHE_MAMBA_CTAS_PER_SM", 8)),
}


def _mamba_copy_kernel(
    plan_ptr,
    plan_cols,
    acc_ptr,
    out_ptr,
    conv_addr_ptr,
    temp_addr_ptr,
    conv_page,
    conv_row,
    conv_rows,
    temp_page,
    temp_bytes,
    chunk_bytes,
    n_temp_items,
    n_conv_items,
    layers_per_group,
    k1,
    POST: tl.constexpr,
    WT: tl.constexpr,
    WORD: tl.constexpr,
    HINT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    items = n_temp_items + n_conv_items
    per_row = layers_per_group * items
    e = pid // per_row
    r = pid - e * per_row
    li = r // items
    t = r - li * items
    row = plan_ptr + e * plan_cols
    group = tl.load(row).to(tl.int64)
    if POST:
        req = tl.load(row + 1)
        j = tl.load(acc_ptr + req).to(tl.int64) - 1
        valid = (j >= 0) & (j < k1)
        cand = row + 2 + 5 * tl.where(valid, j, 0)
        dst = tl.where(valid, tl.load(cand).to(tl.int64), -1)
        csrc = tl.load(cand + 1).to(tl.int64)
        tsrc = tl.load(cand + 2).to(tl.int64)
        bias = tl.load(cand + 3).to(tl.int64)
        reset = tl.load(cand + 4)
        if valid & (reset != 0) & (r == 0):
            tl.store(out_ptr + req, 1)
    else:
        dst = tl.load(row + 1).to(tl.int64)
        csrc = tl.load(row + 2).to(tl.int64)
        tsrc = tl.load(row + 3).to(tl.int64)
        bias = tl.load(row + 4).to(tl.int64)
    if dst >= 0:
        layer = group * layers_per_group + li
        is_conv = t >= n_temp_items
        if is_conv:
            base = tl.load(conv_addr_ptr + layer)
            src_a = base + csrc * conv_page + bias * conv_row
            dst_a = base + dst * conv_page
            nbytes = (conv_rows - bias) * conv_row
        else:
            base = tl.load(temp_addr_ptr + layer)
            off = t * chunk_bytes
            src_a = base + tsrc * temp_page + off
            dst_a = base + dst * temp_page + off
            nbytes = tl.minimum(temp_bytes - off, chunk_bytes)
        s = tl.multiple_of(src_a.to(tl.pointer_type(WT)), HINT)
        d = tl.multiple_of(dst_a.to(tl.pointer_type(WT)), HINT)
        nw = tl.multiple_of(nbytes // WORD, HINT // WORD)
        offs = tl.arange(0, BLOCK)
        for i in range(0, nw, BLOCK):
            o = i + offs
            m = o < nw
            x = tl.load(s + o, mask=m)
            if is_conv:
                # all loads of this tile land before any store: in-place shift is a forward move
                tl.debug_barrier()
            tl.store(d + o, x, mask=m)


_NO_SPECIALIZE = [
    "plan_cols", "conv_page", "conv_row", "conv_rows", "temp_page", "temp_bytes", "chunk_bytes",
    "n_temp_items", "n_conv_items", "layers_per_group", "k1",
]
_kernels: dict[bool, object] = {}


def get_kernel(interpret: bool = False):
    """The kernel, compiled (``triton.jit``) or interpreted on CPU tensors."""
    if interpret not in _kernels:
        if interpret:
            from triton.runtime.interpreter import InterpretedFunction

            _kernels[interpret] = InterpretedFunction(_mamba_copy_kernel, do_not_specialize=_NO_SPECIALIZE)
        else:
            _kernels[interpret] = triton.jit(_mamba_copy_kernel, do_not_specialize=_NO_SPECIALIZE)
    return _kernels[interpret]


@dataclass
class _Prepared:
    lay: Layout
    conv_addrs: torch.Tensor
    temp_addrs: torch.Tensor
    word: int
    hint: int


_prepared: OrderedDict = OrderedDict()
_num_sms: dict = {}


def _prepare(conv_states, temporal_states, num_groups: int) -> _Prepared:
    t0 = (conv_states or temporal_states)[0]
    key = (
        num_groups,
        tuple(x.data_ptr() for x in conv_states),
        tuple(x.data_ptr() for x in temporal_states),
        tuple(conv_states[0].shape) if conv_states else None,
        conv_states[0].stride() if conv_states else None,
        tuple(temporal_states[0].shape) if temporal_states else None,
        temporal_states[0].stride() if temporal_states else None,
        t0.device,
    )
    hit = _prepared.get(key)
    if hit is not None:
        _prepared.move_to_end(key)
        return hit
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "hybridcache mamba copy: first call with these state tensors happened during CUDA graph "
            "capture; call the op once eagerly (warm-up) before capturing"
        )
    lay = check_layout(conv_states, temporal_states, num_groups)
    conv_ptrs = [x.data_ptr() for x in conv_states]
    temp_ptrs = [x.data_ptr() for x in temporal_states]
    align = byte_alignment(
        conv_ptrs + temp_ptrs
        + [lay.conv_page_bytes, lay.conv_row_bytes, lay.temp_page_bytes, lay.temp_bytes]
    )
    word = min(align, 4) if align != 8 else 8
    hint = align if align == 16 else word
    dev = t0.device
    ca = torch.tensor(conv_ptrs or [0], dtype=torch.int64, device=dev)
    ta = torch.tensor(temp_ptrs or [0], dtype=torch.int64, device=dev)
    prep = _Prepared(lay, ca, ta, word, hint)
    _prepared[key] = prep
    while len(_prepared) > 32:
        _prepared.popitem(last=False)
    return prep


def _sm_count(dev: torch.device) -> int:
    if dev.type != "cuda":
        return 4
    n = _num_sms.get(dev.index)
    if n is None:
        n = torch.cuda.get_device_properties(dev).multi_processor_count
        _num_sms[dev.index] = n
    return n


def choose_chunk(rows: int, lay, num_sms: int, tuning=None) -> int:
    tu = tuning or TUNING
    chunk = tu["chunk_max"]
    if lay.temp_bytes == 0:
        return chunk
    has_conv = 1 if lay.conv_rows else 0
    target = tu["target_ctas_per_sm"] * num_sms
    while chunk > tu["chunk_min"] and rows * lay.layers_per_group * (-(-lay.temp_bytes // chunk) + has_conv) < target:
        chunk //= 2
    return chunk


def launch(
    conv_states, temporal_states, plan, num_groups: int,
    num_accepted=None, num_accepted_out=None, *, interpret: bool = False, tuning=None,
) -> None:
    """Runs the pre copy (``num_accepted is None``) or the post selection.
    ``interpret=True``: Triton's CPU interpreter, CPU tensors only (tests)."""
    tu = tuning or TUNING
    post = num_accepted is not None
    prep = _prepare(conv_states, temporal_states, num_groups)
    lay = prep.lay
    dev = (conv_states or temporal_states)[0].device
    k1 = check_plan(plan, post, dev)
    if interpret != (dev.type == "cpu"):
        raise ValueError("the compiled kernel needs CUDA tensors; the interpreter needs CPU tensors")
    if post:
        if num_accepted.device != dev or num_accepted_out.device != dev:
            raise ValueError("num_accepted / num_accepted_out must be on the states' device")
        n = num_accepted.numel()
        num_accepted_out[:n].copy_(num_accepted)
    rows = plan.shape[0]
    if rows == 0:
        return
    chunk = choose_chunk(rows, lay, _sm_count(dev), tu)
    if chunk % 16:
        raise ValueError("chunk size must be a multiple of 16 bytes")
    n_temp = -(-lay.temp_bytes // chunk) if lay.temp_bytes else 0
    n_conv = 1 if lay.conv_rows else 0
    grid = rows * lay.layers_per_group * (n_temp + n_conv)
    if grid >= 2**31:
        raise ValueError("plan too large for one launch")
    word = prep.word
    wt = {1: tl.int8, 2: tl.int16, 4: tl.int32, 8: tl.int64}[word]
    block = max(1, tu["block_bytes"] // word)
    kernel = get_kernel(interpret)
    acc = num_accepted if post else plan
    out = num_accepted_out if post else plan
    args = (
        plan, plan.shape[1], acc, out, prep.conv_addrs, prep.temp_addrs,
        lay.conv_page_bytes, lay.conv_row_bytes, lay.conv_rows, lay.temp_page_bytes, lay.temp_bytes,
        chunk, n_temp, n_conv, lay.layers_per_group, k1,
    )
    meta = dict(POST=post, WT=wt, WORD=word, HINT=prep.hint, BLOCK=block)
    if interpret:
        kernel[(grid,)](*args, **meta)
    else:
        with torch.cuda.device(dev):
            kernel[(grid,)](*args, **meta, num_warps=tu["num_warps"])
