"""The batched step API against vLLM's per-request calls: one decode step of
N running requests is `allocate_slots` N times in vLLM (plus the
scheduler's `get_block_ids` of each result) and one call in hybridcache:
`allocate_decode_batch` (request objects and lists) or
`allocate_decode_arrays` (request handles and uint32 arrays, as a serving
loop that keeps its counts in arrays holds them). Each runs on its own
copy of the same requests, the three alternating in turn, and every step's
new block ids must be identical to vLLM's. `hybridcache bench` adds these rows
where this package is installed and the release's scheduler allocates decodes
one request at a time."""

from __future__ import annotations

import random
import time
from array import array
from collections.abc import Sequence
from typing import Any, Callable

from hybridcache import KVCacheManager, releases
from hybridcache.request import Request

from .bench_trace import Workload, hybridcache_kv_cache_config, vllm_kv_cache_config

BS = 16
BATCHED_NOTE = ("batched decode API: not run on vLLM {} (it is hybridcache's own extension, timed against "
                "a release's per-request decode calls; this release's scheduler does not call it)")


def _decode_step_vllm(m: Any, reqs: list[Request], counts: list[int]) -> list[Any]:
    out: list[Any] = []
    for r, n in zip(reqs, counts):
        blocks = m.allocate_slots(r, n, num_lookahead_tokens=0)
        out.append(None if blocks is None else blocks.get_block_ids(allow_none=True))
    return out


def _unpack(batch: tuple[list[bool], list[int], list[int]], groups: int) -> list[Any]:
    """Per-request results from the compact arrays (outside the timed call:
    a serving loop consumes the arrays as they are)."""
    ok, offsets, ids = batch
    out: list[Any] = []
    for i, good in enumerate(ok):
        if not good:
            out.append(None)
            continue
        per_group = tuple(ids[offsets[i * groups + g] : offsets[i * groups + g + 1]] for g in range(groups))
        out.append(per_group if any(per_group) else None)
    return out


def _unpack_arrays(batch: tuple[bytes, bytes, bytes], groups: int) -> list[Any]:
    ok, offsets, ids = batch
    return _unpack(([b != 0 for b in ok], array("I", offsets).tolist(), array("I", ids).tolist()), groups)


def pool_blocks(running: int, steps: int) -> int:
    """Room for every request: prompt, growth, and Mamba state + speculative blocks."""
    return running * (8 + 5 * steps // BS + 4 * 20) + 10


def random_prompts(rng: random.Random, running: int) -> list[list[int]]:
    return [[rng.randrange(1000) for _ in range(rng.randrange(32, 64))] for _ in range(running)]


def start_decoding(m: Any, reqs: list[Request]) -> None:
    """Prefills every request in one call each, then makes it a decode with
    one sampled token."""
    for r in reqs:
        if m.allocate_slots(r, r.num_tokens - r.num_computed_tokens) is None:
            raise RuntimeError("batched bench: pool too small for the prompts")
    for r in reqs:
        r.num_computed_tokens = r.num_tokens
        r.append_output_token_ids([1])


def accept_drafts(reqs: list[Request], drafts: list[int], rng: random.Random) -> None:
    """A step's outputs: each request keeps a random number of its drafts."""
    for r, d in zip(reqs, drafts):
        accepted = rng.randint(0, d)
        r.num_computed_tokens += 1 + accepted
        r.append_output_token_ids([7] * (1 + accepted))


def decoding_manager(config: str, running: int, steps: int, seed: int) -> tuple[Any, list[Request], random.Random]:
    """A hybridcache manager of the bench's `config` with `running` requests
    decoding (for profiles and training runs, without vLLM)."""
    w = Workload(config=config, running=1, steps=1, seed=seed)
    kwargs = w.manager_kwargs()
    kwargs.update(log_stats=False, enable_kv_cache_events=False)
    m = KVCacheManager(hybridcache_kv_cache_config(w, pool_blocks(running, steps)), **kwargs)
    rng = random.Random(seed)
    reqs = [Request(f"r{i}", p, BS) for i, p in enumerate(random_prompts(rng, running))]
    start_decoding(m, reqs)
    return m, reqs, rng


def run_batched(
    config: str,
    running: int,
    steps: int,
    make_configs: Callable[[str, int], tuple[Any, Any]],
    manager_kwargs: dict[str, Any],
    seed: int = 0,
) -> dict[str, Any]:
    """µs per decode step (median): vLLM per-request vs hybridcache batched."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager

    rng = random.Random(seed)
    hc_cfg, v_cfg = make_configs(config, pool_blocks(running, steps))
    hc = KVCacheManager(hc_cfg, **manager_kwargs)
    ha = KVCacheManager(hc_cfg, **manager_kwargs)
    vm = VllmManager(v_cfg, **manager_kwargs)
    groups = hc.num_kv_cache_groups
    prompts = random_prompts(rng, running)
    hc_reqs = [Request(f"r{i}", p, BS) for i, p in enumerate(prompts)]
    ha_reqs = [Request(f"r{i}", p, BS) for i, p in enumerate(prompts)]
    v_reqs = [Request(f"r{i}", p, BS) for i, p in enumerate(prompts)]
    for m, reqs in ((hc, hc_reqs), (ha, ha_reqs), (vm, v_reqs)):
        start_decoding(m, reqs)
    handles = array("Q", [ha.request_handle(r.request_id) for r in ha_reqs])
    names = ("vllm", "hybridcache", "arrays")
    times: dict[str, list[int]] = {name: [] for name in names}
    for step in range(steps):
        drafts = [rng.choice([0, 0, 1, 2, 4]) for _ in range(running)]
        counts = [1 + d for d in drafts]
        order = names[step % 3 :] + names[: step % 3]
        # A serving loop that uses the batch API tracks these counts itself.
        computed = [r.num_computed_tokens for r in hc_reqs]
        totals = [r.num_tokens for r in hc_reqs]
        arrays = (array("I", counts), array("I", computed), array("I", totals))
        results: dict[str, Any] = {}
        for name in order:
            if name == "vllm":
                t0 = time.perf_counter_ns()
                results[name] = _decode_step_vllm(vm, v_reqs, counts)
            elif name == "hybridcache":
                t0 = time.perf_counter_ns()
                results[name] = hc.allocate_decode_batch(hc_reqs, counts, 0, computed, totals)
            else:
                t0 = time.perf_counter_ns()
                new_b, comp_b, tot_b = (a.tobytes() for a in arrays)
                results[name] = ha.allocate_decode_arrays(handles.tobytes(), new_b, comp_b, tot_b, 0, ha_reqs)
            times[name].append(time.perf_counter_ns() - t0)
        norm = [None if x is None else tuple(list(g) for g in x) for x in results["vllm"]]
        for name, unpack in (("hybridcache", _unpack), ("arrays", _unpack_arrays)):
            mine = [None if x is None else tuple(list(g) for g in x) for x in unpack(results[name], groups)]
            if norm != mine:
                raise AssertionError(f"batched bench ({name}): step {step} differs from vLLM's per-request calls")
        for reqs in (hc_reqs, ha_reqs, v_reqs):
            accept_drafts(reqs, drafts, random.Random(step))
        hc.new_step_starts()
        ha.new_step_starts()
        vm.new_step_starts()
    med = {k: sorted(v)[len(v) // 2] / 1000 for k, v in times.items()}
    return {
        "config": config,
        "running": running,
        "steps": steps,
        "vllm_us_per_step": med["vllm"],
        "hybridcache_batched_us_per_step": med["hybridcache"],
        "ratio": med["vllm"] / med["hybridcache"] if med["hybridcache"] else None,
        "hybridcache_arrays_us_per_step": med["arrays"],
        "arrays_ratio": med["vllm"] / med["arrays"] if med["arrays"] else None,
        "verified": True,
    }


def format_batched(rows: list[dict[str, Any]], vllm_version: str) -> str:
    lines = [
        "batched decode API: one call per step vs vLLM's per-request allocate_slots (+get_block_ids);",
        "  batch = allocate_decode_batch(requests, lists); arrays = allocate_decode_arrays(handles, uint32 arrays)",
        f"  {'config':22s} {'running':>7s} {'vLLM µs/step':>13s} {'batch µs/step':>14s} {'x':>7s}"
        f" {'arrays µs/step':>15s} {'x':>7s}",
    ]
    for r in rows:
        lines.append(
            f"  {r['config']:22s} {r['running']:7d} {r['vllm_us_per_step']:13,.1f} "
            f"{r['hybridcache_batched_us_per_step']:14,.1f} {r['ratio']:6.1f}x"
            f" {r['hybridcache_arrays_us_per_step']:15,.1f} {r['arrays_ratio']:6.1f}x"
        )
    lines.append(f"  verified: every step's new block ids identical to vLLM {vllm_version}'s")
    return "\n".join(lines)


def batched_rows(configs: Sequence[str], runnings: Sequence[int], steps: int, seed: int) -> list[dict[str, Any]]:
    """`run_batched` for every configuration and running count (the bench's rows)."""

    def make_configs(config: str, num_blocks: int) -> tuple[Any, Any]:
        w = Workload(config=config, running=1, steps=1, seed=seed)
        return hybridcache_kv_cache_config(w, num_blocks), vllm_kv_cache_config(w, num_blocks)

    rows = []
    for config in configs:
        kwargs = Workload(config=config, running=1, steps=1, seed=seed).manager_kwargs()
        kwargs.update(log_stats=False, enable_kv_cache_events=False)
        for running in runnings:
            rows.append(run_batched(config, running, steps, make_configs, kwargs, seed))
    return rows


def batched_section(release: releases.Release, configs: Sequence[str], runnings: Sequence[int], steps: int,
                    seed: int) -> tuple[list[dict[str, Any]] | None, str | None]:
    """(rows, note) of `hybridcache bench`: the rows where `release`'s
    scheduler allocates decodes one request at a time, else why none."""
    if not release.per_request_decode:
        return None, BATCHED_NOTE.format(release.version)
    return batched_rows(configs, runnings, steps, seed), None
