"""How vLLM 0.34.0's own tests are run against hybridcache, for
scripts/run_vllm_peer_tests.py (see its docstring for what each table means).
The files come from scripts/vllm_tests/vllm-0.34.0.sha256: 0.33.0's ten
(tests/v1/core; same file names, 901 cases, 0.33.0's 865 with new and
re-parametrised ones) and test_prompt_block_hash_vectors.py (1 case, vLLM's
hashing only).

0.33.0's tables (peer_0_33_0.py) are read and only the differences are
stated here: every case named there still exists in 0.34.0's files.
Measured against vLLM 0.34.0's own manager
(`run_vllm_peer_tests.py --against-vllm`, CPU, offline, this file's
HF_MODELS, the triton-cpu plugin): 833 of 902 pass (832 of the ten files'
901); the 69 others are OFFLINE below. The swap builds the release's facade
(hybridcache.releases: `VllmKVCacheManager034`); the INTERNALS / BAD_INPUT /
UNSUPPORTED_FEATURES rows are 0.33.0's, which the facade keeps, plus one new
GC-internal case. Against hybridcache (2026-12-06): 741 of 902 pass, 0
divergences; of the 161 others: 69 OFFLINE, 72 HiSparse (UNSUPPORTED_FEATURES),
9 reach internals (8 as for 0.33.0, `test_reset_prefix_cache`), 4 CACHE_POP,
1 kv_event_queue, 6 BAD_INPUT.
"""

import importlib.util
from pathlib import Path
from types import ModuleType


def _tables(stem: str) -> ModuleType:
    """A sibling release's tables, loaded from its file as the runner loads
    this one (scripts/vllm_tests is not a package)."""
    path = Path(__file__).with_name(f"{stem}.py")
    spec = importlib.util.spec_from_file_location(stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_BASE = _tables("peer_0_33_0")

# As for 0.33.0: no device is inferred on a machine without a GPU. Building a
# VllmConfig also needs the triton-cpu plugin (tests/vllm_cpu_triton.py),
# which the runner loads for every release.
ENV: dict[str, str] = _BASE.ENV
# Qwen/Qwen3-0.6B serves the Mamba decode-checkpoint publication cases of
# test_scheduler.py (8).
HF_MODELS: tuple[str, ...] = (*_BASE.HF_MODELS, "Qwen/Qwen3-0.6B")
SWAP_SCHEDULER = _BASE.SWAP_SCHEDULER

LLAVA = _BASE.LLAVA
# 0.33.0's test_async_scheduling_pp_allows_rescheduling_with_output_placeholders
# (the CPU platform rejected async scheduling with pipeline parallelism)
# passes under 0.34.0.
_RUNS_NOW = ("test_scheduler::test_async_scheduling_pp_allows_rescheduling_with_output_placeholders",)
OFFLINE: dict[str, str] = {
    **{case: why for case, why in _BASE.OFFLINE.items() if case not in _RUNS_NOW},
    # New in 0.34.0: encoder-cache pressure and mm chunking after a hit inside an item.
    "test_scheduler::test_encoder_cache_pressure_respects_disabled_chunked_prefill": LLAVA,
    "test_scheduler::test_no_mm_input_chunking_after_prefix_cache_hit_inside_item": LLAVA,
}

CACHE_POP = _BASE.CACHE_POP
INTERNALS: dict[str, tuple[str, tuple[str, ...]]] = {
    **_BASE.INTERNALS,
    # New in 0.34.0: after the reset, `gc.is_tracked(cached_block_hash_to_block._cache)`
    # is false. `_cache` is vLLM's Python dict of the prefix map; hybridcache's
    # map lives in the native core (no Python object for the cyclic GC to
    # track) and its view offers no `_cache` to ask about.
    "test_reset_prefix_cache": (
        "reads vLLM's GC internal cached_block_hash_to_block._cache (the map is native here)",
        ("cached_block_hash_to_block",),
    ),
}
# 0.33.0's, unchanged: see peer_0_33_0.py for why each case is there.
FABRICATED_HIT = _BASE.FABRICATED_HIT
BAD_INPUT: dict[str, tuple[str, str]] = _BASE.BAD_INPUT
UNSUPPORTED: dict[str, str] = _BASE.UNSUPPORTED
IDENTITY: dict[str, str | tuple[str, str]] = _BASE.IDENTITY
VIEWS: dict[str, str] = _BASE.VIEWS
NOT_IMPLEMENTED: tuple[str, ...] = _BASE.NOT_IMPLEMENTED
UNSUPPORTED_FEATURES: tuple[str, ...] = _BASE.UNSUPPORTED_FEATURES
INTERNAL_MARK = _BASE.INTERNAL_MARK
