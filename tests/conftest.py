"""Shared test setup: offline Hugging Face hub, vLLM helpers, source-tree imports."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

# vLLM must never try to reach the hub from the tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Test the source tree when the package is not installed (maturin develop puts
# the native module next to the Python sources, so this finds it too).
if importlib.util.find_spec("hybridcache") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def _vllm_importable() -> bool:
    try:
        import vllm.v1.core.kv_cache_manager  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="session")
def vllm_available() -> bool:
    """Skips the requesting test when vLLM (the reference) is not installed."""
    if not _vllm_importable():
        pytest.skip("vLLM 0.23.0 is not installed")
    return True


def _make_vllm_kv_cache_config(num_blocks: int, block_size: int):
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )

    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)],
    )


@pytest.fixture(scope="session")
def make_vllm_kv_cache_config(vllm_available):
    """Builder of a one-group full-attention vLLM KVCacheConfig."""
    return _make_vllm_kv_cache_config
