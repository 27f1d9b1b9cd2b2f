"""vLLM's real engine, stock against hybridcache: identical generated tokens
and identical vLLM counters (prefix-cache queries and hits, preemptions,
speculative drafts, accepted tokens per draft position), in each
configuration below, and hybridcache's one install line in every engine
process where it took effect.

Each side runs in its own process (`hybridcache.verify.run_side`); greedy
decoding with the engine's fixed seed is deterministic on one machine, so the
two sides are compared with each other, never with stored tokens. Workloads
are the verify command's built-in waves, kept small: each engine start costs
15-40 s on two cores.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hybridcache import releases
from hybridcache.verify import Side, first_divergence, run_side
from hybridcache.verify_workload import builtin

pytestmark = [pytest.mark.vllm(), pytest.mark.engine]

# Small engines: dummy weights (random from the engine's seed), no
# torch.compile, a small KV-cache allocation, small batches.
BASE: dict[str, Any] = {"load_format": "dummy", "enforce_eager": True, "kv_cache_memory_bytes": 64 << 20,
                        "max_num_batched_tokens": 512, "max_num_seqs": 16, "max_model_len": 256,
                        "enable_prefix_caching": True}
INSTALL_LINE = re.compile(r"hybridcache is on: vLLM (\S+)'s Scheduler builds ([\w.]+)")
STOCK = "vllm.v1.core.kv_cache_manager.KVCacheManager"
NGRAM = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def facade_of(release: str) -> str | None:
    """The facade class `install()` binds for `release`, as `hybridcache.releases` names it."""
    r = releases.find(release)
    if r is None:
        return None
    cls = r.facade_class()
    return f"{cls.__module__}.{cls.__qualname__}"


def compare(model: Path, engine_args: dict[str, Any], tmp: Path, env: dict[str, str], requests: int = 12,
            max_tokens: int = 16, multiprocess: bool = False) -> tuple[Side, Side]:
    """Both sides on the built-in workload; asserts they are identical."""
    waves = builtin(requests, max_tokens)
    stock, ours = (run_side(side, str(model), {**BASE, **engine_args}, waves, tmp, multiprocess=multiprocess,
                            preload="cpu_gaps", env=env) for side in ("stock", "hybridcache"))
    assert first_divergence(stock, ours) is None
    assert stock.result["tokens"] == ours.result["tokens"]
    assert stock.result["counters"] == ours.result["counters"]
    assert sum(map(len, stock.result["tokens"])) > 0
    return stock, ours


def managers(side: Side) -> set[str]:
    """The KV-cache manager classes the side's schedulers built."""
    return {p["manager"] for p in side.result["processes"] if p["manager"]}


def check_install_lines(stock: Side, ours: Side) -> str:
    """hybridcache's line is logged once in every engine process of its side
    (each process counts it), naming the release and its facade, the class
    the side's scheduler built; never on the stock side. Returns the facade."""
    assert not INSTALL_LINE.search(stock.log)
    assert all(p["install_lines"] == 0 for p in stock.result["processes"])
    assert all(p["install_lines"] == 1 for p in ours.result["processes"]), ours.result["processes"]
    lines = [INSTALL_LINE.search(line) for line in ours.log.splitlines()]
    found = {m.groups() for m in lines if m}
    assert sum(1 for m in lines if m) == len(ours.result["processes"]), found
    assert len(found) == 1, found
    release, facade = found.pop()
    assert facade_of(release) == facade and managers(ours) == {facade}, (release, facade, managers(ours))
    assert managers(stock) == {STOCK}
    return facade


def test_verify_command_dense_prefix_cache_and_preemption(engine_platform: str, models: dict[str, Path],
                                                          tmp_path: Path, engine_env: dict[str, str]) -> None:
    """`hybridcache verify` on the tiny dense model with a 24-block pool:
    prefix-cache hits across waves, preemptions in the last wave; exit 0 and
    the figures side by side."""
    import os

    out = subprocess.run(
        [sys.executable, "-m", "hybridcache", "verify", str(models["llama"]), "--engine-args", json.dumps(BASE),
         "--engine-arg", "block_size=16", "--requests", "12", "--max-tokens", "16", "--num-blocks", "24",
         "--preload", "cpu_gaps", "--workdir", str(tmp_path)],
        capture_output=True, text=True, env={**os.environ, **engine_env}, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "identical: 12 requests" in out.stdout
    for figure in ("scheduler time per step (us)", "output tokens/s", "time to first token, mean (ms)"):
        assert figure in out.stdout
    assert "[hybridcache] wave 3/3, 12/12 requests done" in out.stderr
    stock, ours = (Side(s, json.loads((tmp_path / s / "result.json").read_text()),
                        (tmp_path / s / "log.txt").read_text()) for s in ("stock", "hybridcache"))
    c = stock.result["counters"]
    assert c["prefix_cache_hits"] > 0 and c["num_preemptions"] > 0, c
    check_install_lines(stock, ours)


def test_multiprocess_plugin_ngram_drafts(engine_platform: str, models: dict[str, Path], tmp_path: Path,
                                          engine_env: dict[str, str]) -> None:
    """The engine core and the worker in their own processes, hybridcache
    enabled by HYBRIDCACHE_ENABLE=1 (vLLM's plugin entry point, in every
    process): the engine core built hybridcache's manager; ngram drafts of
    varying length (k=3) on the dense model."""
    stock, ours = compare(models["llama"], {"block_size": 16, "speculative_config": {**NGRAM, "num_speculative_tokens": 3}},
                          tmp_path, engine_env, multiprocess=True)
    facade = check_install_lines(stock, ours)
    core = [p for p in ours.result["processes"] if p["manager"]]
    assert len(core) == 1 and core[0]["process"] != "MainProcess" and core[0]["manager"] == facade, core
    assert len(ours.result["processes"]) >= 3  # front end, engine core, worker
    c = stock.result["counters"]
    assert c["spec_decode_num_drafts"] > 0
    assert c["spec_decode_num_draft_tokens"] < 3 * c["spec_decode_num_drafts"]  # drafts of varying length
    assert len(c["spec_decode_num_accepted_tokens_per_pos"]) == 3


def test_sliding_window_ngram_drafts(engine_platform: str, models: dict[str, Path], tmp_path: Path,
                                     engine_env: dict[str, str]) -> None:
    """Gemma2 (a 64-token sliding window every other layer), ngram k=5, a
    tight pool: hits, drafts and preemptions alike."""
    stock, ours = compare(models["gemma2"], {"block_size": 16, "num_gpu_blocks_override": 40,
                                             "speculative_config": {**NGRAM, "num_speculative_tokens": 5}},
                          tmp_path, engine_env)
    c = stock.result["counters"]
    assert c["prefix_cache_hits"] > 0 and c["spec_decode_num_drafts"] > 0 and c["num_preemptions"] > 0, c
    assert c["spec_decode_num_draft_tokens"] < 5 * c["spec_decode_num_drafts"]  # drafts of varying length
    check_install_lines(stock, ours)


def test_hybrid_align_prefix_cache_and_evictions(engine_platform: str, models: dict[str, Path], tmp_path: Path,
                                                 engine_env: dict[str, str]) -> None:
    """Qwen3-Next (Gated-DeltaNet layers as Mamba groups, one attention
    layer) in align mode with prefix caching and a pool tight enough to
    preempt and evict cached blocks."""
    stock, ours = compare(models["qwen3_next"], {"mamba_cache_mode": "align", "mamba_ssm_cache_dtype": "float32",
                                                 "block_size": 32, "max_model_len": 160,
                                                 "num_gpu_blocks_override": 32}, tmp_path, engine_env)
    c = stock.result["counters"]
    assert c["prefix_cache_hits"] > 0 and c["num_preemptions"] > 0, c
    check_install_lines(stock, ours)


def test_hybrid_with_ngram_drafts_needs_a_gpu(engine_platform: str, models: dict[str, Path], tmp_path: Path,
                                              engine_env: dict[str, str]) -> None:
    """Hybrid model + speculative decoding (drafts of varying length over
    Mamba groups in align mode)."""
    if engine_platform == "cpu":
        pytest.skip("hybrid + speculative decoding needs a GPU engine: vLLM's CPU Gated-DeltaNet path asserts "
                    "that speculative decoding is unsupported")
    stock, _ = compare(models["qwen3_next"], {"mamba_cache_mode": "align", "num_gpu_blocks_override": 16,
                                              "speculative_config": {**NGRAM, "num_speculative_tokens": 3}},
                       tmp_path, engine_env)
    assert stock.result["counters"]["spec_decode_num_drafts"] > 0
