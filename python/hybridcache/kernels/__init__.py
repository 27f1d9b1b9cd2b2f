"""Mamba state copies for vLLM's ``mamba_cache_mode="align"``, as
``torch.library`` ops (CPU + Triton/CUDA), with the copy-plan format they
consume and a pure-Python planner that mirrors vLLM's worker.

``import hybridcache`` never imports torch; ``import hybridcache.kernels``
does (Triton only on the first CUDA call).

States and layers
=================
``conv_states`` / ``temporal_states`` are lists of per-layer state tensors
exactly as vLLM's runner builds them (``gpu_model_runner.py:7135-7157``):
``torch.as_strided`` views ``(num_blocks, *shape)`` into each layer's raw int8
page buffer, ``stride(0) = page_size_bytes / element_size`` (pages may be
padded), conv state at byte 0 of the page, temporal state at ``conv_bytes``.
Conv states are ``(num_blocks, R, C)`` with ``R = conv_kernel - 1 + k`` rows of
``C`` contiguous elements (SD layout; ``R`` = ``state.size(1)``, a row is
``state.stride(1)`` elements, as in vLLM's fused kernel). Each block's state
must be contiguous inside its page. Either list may be empty (linear attention:
temporal only; short conv: conv only); otherwise both have ``L`` entries.

Layers are listed **group-major**, the order of vLLM's
``MambaSpecDecodeGPUContext``: mamba group ``g`` (``g``-th MambaSpec group of
``kv_cache_config.kv_cache_groups``, as ``get_mamba_groups`` orders them) owns
layers ``g*Lg .. g*Lg+Lg-1`` with ``Lg = L / num_groups``. All layers of all
groups have identical shapes/dtypes/page size (vLLM asserts identical specs).
Layers of different groups may share one raw buffer (they do in vLLM); their
block ids never collide because the groups share one block pool.

Copy plan (pre-forward; what ``preprocess_mamba`` does)
=======================================================
``plan``: int32, shape ``(N, 5)``, contiguous, on the states' device. One row
per (request, mamba group) whose running block changes this step::

    col 0 GROUP     mamba group index g (0..num_groups-1)
    col 1 DST       physical block id  ids_g[cur]          (< 0: inert row)
    col 2 CONV_SRC  physical block id  ids_g[prev]
    col 3 TEMP_SRC  physical block id  ids_g[prev + BIAS]
    col 4 BIAS      accepted-token offset, in conv rows: num_accepted - 1

For every layer ``l`` of group ``GROUP`` (byte-exact, dtype-agnostic)::

    conv[l][DST, 0:R-BIAS]  <- conv[l][CONV_SRC, BIAS:R]     # rows R-BIAS..R of DST untouched
    temporal[l][DST]        <- temporal[l][TEMP_SRC]        # natural state bytes, no padding

Nothing else is written (page padding, other pages, other states). ``ids_g``
is the **worker's** block-id list of group ``g`` for that request: every list
``allocate_slots`` returned, appended verbatim. It differs from the manager's
``req_blocks``, where the manager later writes the null block over slots it
frees (``remove_skipped_blocks``) or moves (spec-block reuse, ``single_type_kv_cache_manager.py``
1177-1186); the worker keeps the stale ids there, and vLLM copies from exactly
those (``ids_g[prev + BIAS]`` can be a moved spec block, even ``== DST``). A
native planner must resolve indices against that append-only view.

Emission rule = vLLM's ``preprocess_mamba`` (``v1/worker/mamba_utils.py``
640-703) + ``collect_mamba_copy_meta`` (572-608) + ``get_conv_copy_spec`` /
``get_temporal_copy_spec`` (``model_executor/layers/mamba/mamba_utils.py``
292-335; line numbers of the table's oldest release), for request ``i`` in
batch order, ``B`` = mamba block size, ``k`` = ``num_speculative_blocks``::

    prev = mamba_state_idx[req]  if known  else (num_computed - 1) // B   # -1: no state
    cur  = cdiv(num_computed + num_scheduled, B) - 1
    mamba_state_idx[req] = cur
    if prev != -1 and prev != cur:
        bias = num_accepted_cpu[i] - 1
        emit one row per mamba group: (g, ids_g[cur], ids_g[prev], ids_g[prev+bias], bias)
        num_accepted_cpu[i] = 1

(vLLM's ``src == dst and bias == 0`` early return cannot trigger here since
``prev != cur``.) Row order is free. Rows with ``DST < 0`` do nothing, so a
plan can be padded to a fixed capacity for CUDA graphs (:func:`pad_plan`).
vLLM makes ``2 * L`` (src ptr, dst ptr, size) entries per copying request in
three tables; this plan is ``G`` rows of 5 int32 (one H2D copy).

Post-verification plan (spec decode; ``postprocess_mamba_fused_kernel``)
========================================================================
The accepted count ``a`` is known only on the device, so the host precomputes
vLLM's decision for every possible ``a = j + 1``, ``j = 0..K1-1``,
``K1 = k + 1``. ``post_plan``: int32, shape ``(N, 2 + 5*K1)``::

    col 0 GROUP, col 1 REQ (row of num_accepted / num_accepted_out)
    cols 2+5j .. 6+5j : DST_j, CONV_SRC_j, TEMP_SRC_j, BIAS_j, RESET_j

Device semantics: ``out[:n] = num_accepted[:n]``; then for each row with
``a = num_accepted[REQ]``, if ``1 <= a <= K1``, ``j = a - 1``: if ``RESET_j``:
``out[REQ] = 1``; if ``DST_j >= 0``: the pre-plan copy with
``(DST_j, CONV_SRC_j, TEMP_SRC_j, BIAS_j)`` for the layers of ``GROUP``.
``a`` outside ``1..K1`` does nothing (for ``a = 0`` vLLM never copies either).
A conv copy whose ``CONV_SRC == DST`` (in-place shift, ``BIAS > 0``) is an
overlapping move and is done correctly (as vLLM's forward byte loop does).

Per candidate ``j`` (vLLM's kernel, lines 25-173, evaluated on the host), with
``running = num_computed + num_scheduled - num_draft``, ``src = mamba_state_idx``
(this step's ``cur``)::

    new = running + j ; aligned = (new // B) * B
    if j > num_draft or aligned < running:         -> DST_j = -1, RESET_j = 0
    bias = aligned - running ; dst = aligned // B - 1
    RESET_j = (src == dst)
    if src == dst and bias == 0:                   -> DST_j = -1 (no copy)
    else: DST_j = ids_g[dst], CONV_SRC_j = ids_g[src], TEMP_SRC_j = ids_g[src + bias], BIAS_j = bias

(``a <= 1 + num_draft`` always: sampled rows have ``1 + num_draft`` valid
slots.) A row is emitted for (request, g) iff some ``j`` has ``DST_j >= 0``;
its no-copy candidates are ``-1, -1, -1, 0, RESET_j``. A request whose
candidates are all no-copy gets no row: its only possible ``RESET`` needs
``src == dst`` with ``bias == 0``, i.e. ``num_draft == 0`` and ``a == 1``,
where ``out`` is 1 already. ``RESET_j`` and ``BIAS_j`` do not depend on ``g``.

Preconditions (all launches; true for vLLM's tables): within one launch no
row's destination region overlaps another row's source or destination region,
except a row with itself (``DST == TEMP_SRC`` is a no-op copy, ``DST ==
CONV_SRC`` the in-place shift). Block ids, ``GROUP`` and ``0 <= BIAS < R``
are not checked on the device. The planners return CPU tensors: move them
with ``plan.pin_memory().to(dev, non_blocking=True)`` (one H2D per op).

Ops
===
``torch.ops.hybridcache.mamba_pre_copy(conv_states, temporal_states, plan, num_groups)``
``torch.ops.hybridcache.mamba_post_select(conv_states, temporal_states, post_plan,
num_groups, num_accepted, num_accepted_out)`` (also :func:`mamba_pre_copy`,
:func:`mamba_post_select`). ``custom_op``s with fake impls (``torch.compile``);
CUDA: one Triton launch per call, no host sync, CUDA-graph capturable after one
eager call with the same state tensors (it caches a device table of layer
base addresses). CPU: torch indexing, bit-identical. ``reference`` holds the
plain per-row loop used by the tests.

The ops copy bytes, so any same-layout view works. Under ``torch.compile``,
when the states are graph inputs, pass :func:`byte_views` (int8 views):
AOTAutograd rejects mutated inputs that alias with *different* dtypes, which
vLLM's bf16 conv / fp32 temporal views of one page buffer are.
"""

from __future__ import annotations

from hybridcache.kernels.layout import byte_views, vllm_state_views
from hybridcache.kernels.ops import mamba_post_select, mamba_pre_copy
from hybridcache.kernels.plan import (
    POST_FIELDS,
    PRE_COLS,
    BIAS,
    CONV_SRC,
    DST,
    GROUP,
    REQ,
    TEMP_SRC,
    PrePlan,
    pad_plan,
    plan_from_block_tables,
    post_plan_from_block_tables,
    native_post_plan,
    native_pre_plan,
)

__all__ = [
    "BIAS",
    "CONV_SRC",
    "DST",
    "GROUP",
    "POST_FIELDS",
    "PRE_COLS",
    "REQ",
    "TEMP_SRC",
    "PrePlan",
    "byte_views",
    "mamba_post_select",
    "mamba_pre_copy",
    "native_post_plan",
    "native_pre_plan",
    "pad_plan",
    "plan_from_block_tables",
    "post_plan_from_block_tables",
    "vllm_state_views",
]
