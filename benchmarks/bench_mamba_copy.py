"""Mamba align-mode state copy benchmark (hybridcache issue 5).

One call on a GPU machine (H200 intended):

    python benchmarks/bench_mamba_copy.py [--json] [--json-out FILE] [--sweep]

For Qwen3-Next-, Nemotron-H-8B- and Qwen3.5-35B-like layouts (vLLM 0.23.0
page layout: as_strided views into padded int8 pages, groups sharing raw
buffers) at batch 1/8/64/256, every request copying (the lock-step worst
case; bias 0, k = 0, as in mamba-align-gpu.md), it measures the device time of:

  ceiling     one contiguous copy of the same bytes (torch copy_)
  naive       per-layer torch indexing (gather + scatter per state per layer)
  vllm023     vLLM 0.23.0's batch_memcpy_kernel (re-implemented verbatim:
              byte-wise, one CTA per (layer, state, request), 1 KiB steps)
  ours        torch.ops.hybridcache.mamba_pre_copy (Triton), eager launch
  ours-graph  the same op replayed from a CUDA graph

Device time: CUDA events around one launch, L2 flushed before each
iteration, the GPU kept busy (torch.cuda._sleep) while the host enqueues so
host overhead is excluded; "host us" is the separate host enqueue cost of an
eager call. GB/s counts read + write. Every method's result is checked
byte-exact (destinations poisoned first, page padding must stay poisoned).

Host planning per step: vLLM's Python table build (collect_mamba_copy_meta
re-implemented: 2L entries per request, tensor indexing + data_ptr), the
Python planner (hybridcache.kernels.plan_from_block_tables), and a native
planner when ``hybridcache._native`` has one (see NATIVE_PLANNER_NAMES; it is
called with plan_from_block_tables' arguments and must return the same
(N, 5) int32 plan), else that row is skipped.

Before timing, a GPU self-test compares the Triton kernels (pre and post,
bias > 0, in-place shifts, fp32/bf16, unaligned fallback, CUDA graph with a
device-side num_accepted) with the CPU implementation, bit for bit.

``--cpu-smoke``: tiny shapes on CPU (op CPU kernel, Triton interpreter for
ours and vLLM's kernel), so the script is known to work without a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch-only rows still run
    triton = tl = None

try:
    import hybridcache.kernels as K
except ImportError:  # run from a source checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    import hybridcache.kernels as K

from hybridcache.kernels import plan_from_block_tables, vllm_state_views

NATIVE_PLANNER_NAMES = ("mamba_copy_plan", "plan_mamba_copies", "mamba_pre_copy_plan")
POISON = 0x5A


@dataclass
class Model:
    name: str
    layers: int
    groups: int
    conv: tuple
    conv_dtype: torch.dtype
    temporal: tuple
    temporal_dtype: torch.dtype
    page: int  # padded page bytes (mamba-align-gpu.md table (c))
    block_size: int


MODELS = [
    Model("qwen3-next", 36, 3, (3, 8192), torch.bfloat16, (32, 128, 128), torch.bfloat16, 1_114_112, 544),
    Model("nemotron-h-8b", 24, 6, (3, 10240), torch.bfloat16, (128, 64, 128), torch.float32, 4_259_840, 1040),
    Model("qwen3.5-35b", 30, 3, (3, 8192), torch.bfloat16, (32, 128, 128), torch.float32, 2_162_688, 1056),
]
SMOKE_MODELS = [
    Model("tiny-hybrid", 6, 3, (3, 64), torch.bfloat16, (2, 8, 16), torch.float32, 384 + 1024 + 64, 16),
    Model("tiny-bf16", 4, 2, (3, 40), torch.bfloat16, (2, 8, 8), torch.bfloat16, 1024, 16),
]


def _esize(dt):
    return torch.empty((), dtype=dt).element_size()


# ----------------------------------------------------------------------------- vLLM 0.23.0 kernel (verbatim)

def _batch_memcpy_kernel_src(src_ptrs, dst_ptrs, sizes, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)

    src_ptr = tl.load(src_ptrs + pid)
    dst_ptr = tl.load(dst_ptrs + pid)
    size = tl.load(sizes + pid)

    offsets = tl.arange(0, BLOCK_SIZE)
    for i in range(0, size, BLOCK_SIZE):
        mask = (i + offsets) < size

        curr_src_ptr = (src_ptr + i + offsets).to(tl.pointer_type(tl.uint8))
        curr_dst_ptr = (dst_ptr + i + offsets).to(tl.pointer_type(tl.uint8))

        data = tl.load(curr_src_ptr, mask=mask)
        tl.store(curr_dst_ptr, data, mask=mask)


_vllm_kernels: dict = {}


def vllm_batch_memcpy(src_ptrs, dst_ptrs, sizes, interpret=False):
    if interpret not in _vllm_kernels:
        if interpret:
            from triton.runtime.interpreter import InterpretedFunction

            _vllm_kernels[interpret] = InterpretedFunction(_batch_memcpy_kernel_src)
        else:
            _vllm_kernels[interpret] = triton.jit(_batch_memcpy_kernel_src)
    _vllm_kernels[interpret][(src_ptrs.shape[0],)](src_ptrs, dst_ptrs, sizes, BLOCK_SIZE=1024)


# ----------------------------------------------------------------------------- setup

class Setup:
    """States for ``max_b`` requests of one model: Lg raw page buffers
    (slot li is shared by layer li of every group, as in vLLM); per request
    and group a distinct source and destination block, shuffled."""

    def __init__(self, m: Model, max_b: int, device, seed=0):
        self.m = m
        self.lg = m.layers // m.groups
        self.conv_bytes = math.prod(m.conv) * _esize(m.conv_dtype)
        self.temp_bytes = math.prod(m.temporal) * _esize(m.temporal_dtype)
        self.state_bytes = self.conv_bytes + self.temp_bytes
        assert self.state_bytes <= m.page
        self.num_blocks = 1 + 2 * max_b * m.groups
        g = torch.Generator(device="cpu").manual_seed(seed)
        perm = torch.randperm(self.num_blocks - 1, generator=g) + 1
        # src[r, g], dst[r, g]
        self.src = perm[: max_b * m.groups].view(max_b, m.groups)
        self.dst = perm[max_b * m.groups :].view(max_b, m.groups)
        self.raws = []
        for _ in range(self.lg):
            raw = torch.empty(self.num_blocks * m.page, dtype=torch.int8, device=device)
            raw.view(torch.int32).random_() if raw.numel() % 4 == 0 else raw.random_()
            self.raws.append(raw)
        views = [
            vllm_state_views(r, self.num_blocks, m.page, [m.conv, m.temporal], [m.conv_dtype, m.temporal_dtype])
            for r in self.raws
        ]
        self.conv = [views[li][0] for _ in range(m.groups) for li in range(self.lg)]
        self.temp = [views[li][1] for _ in range(m.groups) for li in range(self.lg)]
        self.device = torch.device(device)

    def copied_bytes(self, b):
        return b * self.m.layers * self.state_bytes

    def plan(self, b):
        rows = []
        for r in range(b):
            for g in range(self.m.groups):
                s, d = int(self.src[r, g]), int(self.dst[r, g])
                rows.append((g, d, s, s, 0))
        return torch.tensor(rows, dtype=torch.int32, device=self.device)

    def poison(self, b):
        d = self.dst[:b].reshape(-1).to(self.device)
        for raw in self.raws:
            raw.view(self.num_blocks, self.m.page).index_fill_(0, d, POISON)

    def check(self, b) -> bool:
        """Destination state bytes == source state bytes, padding poisoned."""
        ok = True
        for g in range(self.m.groups):
            s = self.src[:b, g].to(self.device)
            d = self.dst[:b, g].to(self.device)
            for raw in self.raws:
                pages = raw.view(self.num_blocks, self.m.page)
                for i in range(0, b, 64):
                    ps, pd = pages[s[i : i + 64]], pages[d[i : i + 64]]
                    ok &= bool(torch.equal(ps[:, : self.state_bytes], pd[:, : self.state_bytes]))
                    ok &= bool((pd[:, self.state_bytes :] == POISON).all())
        return ok

    def vllm_tables(self, b):
        """vLLM 0.23.0's collect_mamba_copy_meta, per request, group, layer,
        state: (src ptr, dst ptr, bytes) into pinned-style numpy tables."""
        n = b * self.m.layers * 2
        src = np.zeros(n, dtype=np.int64)
        dst = np.zeros(n, dtype=np.int64)
        size = np.zeros(n, dtype=np.int32)
        off = 0
        bias = 0
        for r in range(b):
            for g in range(self.m.groups):
                block_ids = {0: int(self.src[r, g]), 1: int(self.dst[r, g])}
                src_idx, dst_idx = 0, 1
                dest_block_id = block_ids[dst_idx]
                for li in range(self.lg):
                    layer = g * self.lg + li
                    for state, is_conv in ((self.conv[layer], True), (self.temp[layer], False)):
                        if is_conv:  # get_conv_copy_spec
                            src_state = state[block_ids[src_idx], bias:]
                        else:  # get_temporal_copy_spec
                            src_state = state[block_ids[src_idx + bias]]
                        src[off] = src_state.data_ptr()
                        dst[off] = state[dest_block_id].data_ptr()
                        size[off] = src_state.numel() * state.element_size()
                        off += 1
        return src, dst, size

    def worker_inputs(self, b):
        """Worker-style planner inputs for an all-copy step (k = 0)."""
        B, m = self.m.block_size, 4
        tables = []
        for r in range(b):
            per_group = []
            for g in range(self.m.groups):
                ids = [0] * (m - 1) + [int(self.src[r, g]), int(self.dst[r, g])]
                per_group.append(ids)
            tables.append(per_group)
        return (tables, [B * m] * b, [1] * b, [1] * b, [m - 1] * b, B, 0)

    def free(self):
        self.raws = self.conv = self.temp = None


# ----------------------------------------------------------------------------- timing

class Timer:
    def __init__(self, device, iters, flush_mb=256):
        self.cuda = device.type == "cuda"
        self.iters = iters
        self.flush = torch.empty(flush_mb << 20, dtype=torch.int8, device=device) if self.cuda else None

    def device_us(self, fn) -> float:
        fn()  # warm (compiles)
        if not self.cuda:
            ts = []
            for _ in range(self.iters):
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
            return statistics.median(ts) * 1e6
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        host = time.perf_counter() - t  # upper bound of the host enqueue time
        torch.cuda.synchronize()
        # keep the GPU busy (~2 cycles/ns) for 2x the host enqueue time: events time device work only
        sleep_cycles = int(2e3 * (2 * host * 1e6 + 200))
        ts = []
        for _ in range(self.iters):
            self.flush.zero_()  # cold L2, as in a real step
            torch.cuda._sleep(sleep_cycles)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            torch.cuda.synchronize()
            ts.append(e0.elapsed_time(e1) * 1e3)
        return statistics.median(ts)

    def host_us(self, fn, n=20) -> float:
        if not self.cuda:
            n = 1  # smoke: interpreted kernels are slow
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda._sleep(50_000_000)  # host enqueues while the GPU is busy: no back-pressure
        t = time.perf_counter()
        for _ in range(n):
            fn()
        dt = (time.perf_counter() - t) / n * 1e6
        if self.cuda:
            torch.cuda.synchronize()
        return dt


def capture_graph(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


# ----------------------------------------------------------------------------- GPU self-test

def gpu_selftest(device, interpret=False) -> list[dict]:
    """Triton (CUDA) vs the CPU implementation, bit for bit, on small random
    layouts with every row kind; plus the post op under a CUDA graph.
    (``interpret=True`` on CPU: the Triton interpreter stands in, no graph.)"""
    from hybridcache.kernels import triton_impl
    from hybridcache.kernels.plan import POST_FIELDS

    if interpret:
        def pre_op(c, t, plan, groups):
            triton_impl.launch(c, t, plan, groups, interpret=True)

        def post_op(c, t, plan, groups, acc, out):
            triton_impl.launch(c, t, plan, groups, acc, out, interpret=True)
    else:
        pre_op, post_op = torch.ops.hybridcache.mamba_pre_copy, torch.ops.hybridcache.mamba_post_select

    results = []
    rng = np.random.default_rng(1)
    cases = [
        ("bf16/fp32 k=2", (5, 256), torch.bfloat16, (4, 16, 32), torch.float32, 64, 3, 2),
        ("bf16 k=0", (3, 512), torch.bfloat16, (8, 64, 64), torch.bfloat16, 0, 1, 4),
        ("fp32 big temporal", (5, 128), torch.float32, (16, 64, 128), torch.float32, 4096, 2, 2),
        ("unaligned bf16", (3, 13), torch.bfloat16, (3, 5), torch.bfloat16, 6, 2, 1),
    ]
    for name, conv, cdt, temporal, tdt, pad, groups, lg in cases:
        conv_bytes = math.prod(conv) * _esize(cdt)
        page = conv_bytes + math.prod(temporal) * _esize(tdt) + pad
        nb, R, k1 = 160, conv[0], 3
        raw_cpu = [torch.randint(-128, 128, (nb * page,), dtype=torch.int8) for _ in range(lg)]

        def views(raws):
            v = [vllm_state_views(r, nb, page, [conv, temporal], [cdt, tdt]) for r in raws]
            return [v[li][0] for _ in range(groups) for li in range(lg)], [v[li][1] for _ in range(groups) for li in range(lg)]

        ids = iter((rng.permutation(nb - 1) + 1).tolist())
        pre_rows = []
        for e in range(9):
            d = next(ids)
            kind = e % 4
            cs = d if kind == 1 else next(ids)
            ts = d if kind == 2 else next(ids)
            bias = int(rng.integers(1 if kind == 1 and R > 1 else 0, R))
            pre_rows.append((e % groups, d, cs, ts, bias))
        pre_rows.append((0, -1, 0, 0, 0))
        post_rows = []
        for req in range(4):
            for g in range(groups):
                row = [g, req]
                for _j in range(k1):
                    if rng.random() < 0.3:
                        row += [-1, -1, -1, 0, int(rng.integers(0, 2))]
                    else:
                        d = next(ids)
                        inplace = rng.random() < 0.3 and R > 1
                        row += [d, d if inplace else next(ids), next(ids), int(rng.integers(1 if inplace else 0, R)),
                                int(inplace)]
                post_rows.append(row)
        pre = torch.tensor(pre_rows, dtype=torch.int32)
        post = torch.tensor(post_rows, dtype=torch.int32)
        assert post.shape[1] == 2 + POST_FIELDS * k1
        acc = torch.tensor(rng.integers(0, k1 + 2, 6), dtype=torch.int32)

        ref = [r.clone() for r in raw_cpu]
        c, t = views(ref)
        out_ref = torch.zeros(8, dtype=torch.int32)
        torch.ops.hybridcache.mamba_pre_copy(c, t, pre, groups)
        torch.ops.hybridcache.mamba_post_select(c, t, post, groups, acc, out_ref)

        for mode in ("eager",) if interpret else ("eager", "graph"):
            gpu = [r.to(device) for r in raw_cpu]
            c, t = views(gpu)
            pre_d, post_d, acc_d = pre.to(device), post.to(device), acc.to(device)
            out_d = torch.zeros(8, dtype=torch.int32, device=device)
            if mode == "eager":
                pre_op(c, t, pre_d, groups)
                post_op(c, t, post_d, groups, acc_d, out_d)
            else:
                acc_live = torch.zeros_like(acc_d)  # num_accepted: device-side, filled after capture
                graph = capture_graph(lambda: (
                    pre_op(c, t, pre_d, groups),
                    post_op(c, t, post_d, groups, acc_live, out_d),
                ))
                # capture_graph's eager warm-up ran the ops once: restore the states, then replay
                for r, r0 in zip(gpu, raw_cpu):
                    r.copy_(r0)
                out_d.zero_()
                acc_live.copy_(acc_d)
                graph.replay()
            if device.type == "cuda":
                torch.cuda.synchronize()
            ok = all(torch.equal(a.cpu(), b) for a, b in zip(gpu, ref)) and torch.equal(out_d.cpu(), out_ref)
            results.append({"selftest": f"{name} {mode}", "correct": bool(ok)})
    return results


# ----------------------------------------------------------------------------- main

def bench_model(m: Model, batches, device, timer, smoke, sweep, out):
    interp = device.type == "cpu"
    st = Setup(m, max(batches), device)
    total_max = st.copied_bytes(max(batches))
    ceil_src = torch.empty(total_max, dtype=torch.int8, device=device)
    ceil_dst = torch.empty_like(ceil_src)
    ceil_src.random_()
    try:
        from hybridcache.kernels import triton_impl
    except ImportError:
        triton_impl = None

    for b in batches:
        nbytes = st.copied_bytes(b)
        moved = 2 * nbytes
        plan = st.plan(b)
        rows = []

        def record(method, us, correct=None, host=None, **extra):
            r = {"model": m.name, "b": b, "method": method, "us": us, "bytes_copied": nbytes,
                 "GBps": moved / (us * 1e-6) / 1e9 if us else None, "host_us": host, **extra}
            if correct is not None:
                r["correct"] = bool(correct)
            rows.append(r)

        # ceiling
        cs, cd = ceil_src[:nbytes], ceil_dst[:nbytes]
        us = timer.device_us(lambda: cd.copy_(cs))
        record("ceiling", us, bool(torch.equal(cs, cd)))
        ceiling = us

        # naive per-layer torch indexing
        idx = [(st.src[:b, g].to(device), st.dst[:b, g].to(device)) for g in range(m.groups)]

        def naive():
            for g, (s, d) in enumerate(idx):
                for li in range(st.lg):
                    layer = g * st.lg + li
                    st.conv[layer][d] = st.conv[layer][s]
                    st.temp[layer][d] = st.temp[layer][s]

        st.poison(b)
        naive()
        ok = st.check(b)
        record("naive", timer.device_us(naive), ok, timer.host_us(naive, 3))

        # vLLM 0.23 batch_memcpy (tables built on the host, uploaded before timing)
        def vllm_row():
            src, dst, size = st.vllm_tables(b)
            tabs = [torch.from_numpy(x).to(device) for x in (src, dst, size)]

            def vllm():
                vllm_batch_memcpy(*tabs, interpret=interp)

            st.poison(b)
            vllm()
            ok = st.check(b)
            record("vllm023", timer.device_us(vllm), ok, timer.host_us(vllm, 5))

        guarded(vllm_row, "vllm023", record)

        # ours
        def ours():
            torch.ops.hybridcache.mamba_pre_copy(st.conv, st.temp, plan, m.groups)

        st.poison(b)
        ours()
        ok = st.check(b)
        chunk = None
        if triton_impl is not None and not interp:
            lay = triton_impl._prepare(st.conv, st.temp, m.groups).lay
            chunk = triton_impl.choose_chunk(plan.shape[0], lay, triton_impl._sm_count(device))
        record("ours", timer.device_us(ours), ok, timer.host_us(ours), chunk=chunk)
        if interp:
            def interp_row():
                def ours_interp():
                    triton_impl.launch(st.conv, st.temp, plan, m.groups, interpret=True)

                st.poison(b)
                ours_interp()
                record("ours-triton-interp", timer.device_us(ours_interp), st.check(b))

            guarded(interp_row, "ours-triton-interp", record)
        else:
            graph = capture_graph(ours)
            st.poison(b)
            graph.replay()
            torch.cuda.synchronize()
            ok = st.check(b)
            record("ours-graph", timer.device_us(graph.replay), ok)
            if sweep:
                for chunk_max in (16 << 10, 32 << 10, 64 << 10, 128 << 10):
                    for warps in (4, 8):
                        for blk in (8 << 10, 16 << 10):
                            tu = dict(triton_impl.TUNING, chunk_max=chunk_max, chunk_min=chunk_max,
                                      num_warps=warps, block_bytes=blk)
                            fn = lambda tu=tu: triton_impl.launch(st.conv, st.temp, plan, m.groups, tuning=tu)  # noqa: E731
                            st.poison(b)
                            fn()
                            ok = st.check(b)
                            record(f"sweep chunk={chunk_max >> 10}K warps={warps} blk={blk >> 10}K",
                                   timer.device_us(fn), ok)
        for r in rows:
            r["pct_ceiling"] = 100.0 * ceiling / r["us"] if r["us"] else None
        out["results"].extend(rows)

        # host planning
        args = st.worker_inputs(b)
        reps = 3 if smoke else max(3, min(50, 2000 // b))

        def t_host(fn):
            fn()
            t = time.perf_counter()
            for _ in range(reps):
                res = fn()
            return (time.perf_counter() - t) / reps * 1e6, res

        us_v, _ = t_host(lambda: st.vllm_tables(b))
        us_p, pyplan = t_host(lambda: plan_from_block_tables(*args))
        plans = [{"model": m.name, "b": b, "method": "vllm023-python-tables", "us": us_v, "entries": b * m.layers * 2},
                 {"model": m.name, "b": b, "method": "hybridcache-python-planner", "us": us_p,
                  "entries": pyplan.plan.shape[0]}]
        native = find_native_planner()
        if native is None:
            plans.append({"model": m.name, "b": b, "method": "native-planner", "us": None,
                          "skipped": "hybridcache._native has no " + "/".join(NATIVE_PLANNER_NAMES)})
        else:
            us_n, nplan = t_host(lambda: native(*args))
            same = np.array_equal(np.asarray(getattr(nplan, "plan", nplan), dtype=np.int32).reshape(-1, 5),
                                  pyplan.plan.numpy())
            plans.append({"model": m.name, "b": b, "method": "native-planner", "us": us_n,
                          "entries": pyplan.plan.shape[0], "correct": bool(same)})
        out["planning"].extend(plans)
    st.free()
    del ceil_src, ceil_dst
    if device.type == "cuda":
        torch.cuda.empty_cache()


def guarded(fn, method, record):
    """Runs one Triton-dependent row; a missing Triton or a CPU interpreter
    that cannot run here (reported with numpy 2.x) skips the row instead."""
    if triton is None:
        record(method, None, skipped="triton not installed")
        return
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        if torch.cuda.is_available():
            raise
        record(method, None, skipped=f"{type(e).__name__}: {str(e)[:160]}")


def find_native_planner():
    try:
        import hybridcache._native as native
    except ImportError:
        return None
    for name in NATIVE_PLANNER_NAMES:
        fn = getattr(native, name, None)
        if fn is not None:
            return fn
    return None


def print_tables(out):
    print(f"# {out['device']}  torch {out['torch']}  triton {out['triton']}")
    for r in out.get("selftest", []):
        print(f"selftest {r['selftest']:<28} {'OK' if r['correct'] else 'MISMATCH'}")
    print(f"{'model':<14} {'b':>4} {'method':<34} {'us':>10} {'GB/s':>8} {'%ceil':>6} {'host us':>8} ok")
    for r in out["results"]:
        gb = f"{r['GBps']:.0f}" if r.get("GBps") else "-"
        pc = f"{r['pct_ceiling']:.0f}" if r.get("pct_ceiling") else "-"
        host = f"{r['host_us']:.0f}" if r.get("host_us") is not None else "-"
        ok = {True: "yes", False: "NO"}.get(r.get("correct"), "-")
        us = f"{r['us']:.1f}" if r.get("us") is not None else "skipped"
        print(f"{r['model']:<14} {r['b']:>4} {r['method']:<34} {us:>10} {gb:>8} {pc:>6} {host:>8} {ok}"
              + (f"  ({r['skipped']})" if r.get("skipped") else ""))
    print(f"\n{'model':<14} {'b':>4} {'host planning':<34} {'us':>10} {'entries':>8}")
    for r in out["planning"]:
        us = f"{r['us']:.1f}" if r.get("us") is not None else "skipped"
        print(f"{r['model']:<14} {r['b']:>4} {r['method']:<34} {us:>10} {r.get('entries', '-')!s:>8}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on CPU (no GPU needed)")
    ap.add_argument("--json", action="store_true", help="also print the results as JSON")
    ap.add_argument("--json-out", help="write the JSON to this file")
    ap.add_argument("--models", help="comma-separated subset of: " + ",".join(m.name for m in MODELS))
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,8,64,256)")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--sweep", action="store_true", help="also sweep the Triton tuning knobs")
    ap.add_argument("--no-selftest", action="store_true")
    a = ap.parse_args(argv)

    if a.cpu_smoke:
        device = torch.device("cpu")
        models = SMOKE_MODELS
        batches = [int(x) for x in (a.batches or "1,3").split(",")]
        iters = a.iters or 1
    else:
        if not torch.cuda.is_available():
            ap.error("no CUDA device: use --cpu-smoke")
        device = torch.device("cuda")
        models = MODELS
        batches = [int(x) for x in (a.batches or "1,8,64,256").split(",")]
        iters = a.iters or 10
    if a.models:
        want = set(a.models.split(","))
        models = [m for m in models if m.name in want]
    try:
        import triton

        tver = triton.__version__
    except ImportError:
        tver = None
    out = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else f"cpu ({platform.processor() or 'cpu'})",
        "torch": torch.__version__, "triton": tver, "numpy": np.__version__,
        "batches": batches, "results": [], "planning": [],
    }
    if device.type == "cuda" and not a.no_selftest:
        out["selftest"] = gpu_selftest(device)
    timer = Timer(device, iters)
    threads = torch.get_num_threads()
    if a.cpu_smoke:
        torch.set_num_threads(1)  # tiny shapes: OpenMP only adds spin-waits (and ms stalls on a busy machine)
    try:
        for m in models:
            bench_model(m, batches, device, timer, a.cpu_smoke, a.sweep and not a.cpu_smoke, out)
    finally:
        torch.set_num_threads(threads)
    print_tables(out)
    if a.json:
        print(json.dumps(out, indent=1))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    res = main()
    bad = [r for r in res["results"] + res["planning"] + res.get("selftest", []) if r.get("correct") is False]
    sys.exit(1 if bad else 0)
