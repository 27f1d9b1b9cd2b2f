"""A short slice of the long differential fuzz (`python -m hybridcache_dev.fuzz`)
against vLLM 0.23.0: every spec mix, caching on and off, bad inputs
interleaved. The long run is documented in the module; this keeps it honest
on every test run (~10-20 s)."""

from __future__ import annotations

from typing import Any

import pytest

# Compares against vLLM 0.23.0 (tests/conftest.py: left to that release's venv elsewhere).
pytestmark = pytest.mark.vllm("0.23.0")

pytest.importorskip("vllm.v1.core.kv_cache_manager")

from hybridcache_dev import fuzz  # noqa: E402


def test_fuzz_slice_finds_nothing() -> None:
    f = fuzz.run_fuzz(ops=40_000, seed=20240, ops_per_setup=1000)
    assert f.reports == [], "\n\n".join(f.reports)
    assert (f.divergences, f.invariant_violations, f.bad_input_failures, f.reference_errors) == (0, 0, 0, 0)
    assert f.ops >= 40_000 and f.setups >= 2 * len(fuzz.MIXES)
    # The slice reaches the interesting paths.
    assert f.bad_inputs > 500
    assert f.allocations > 5000 and f.none_allocations > 500
    assert f.hit_tokens > 0 and f.events > 0
    assert f.preemptions > 0 and f.evictions > 0 and f.resets > 0


class _LyingAllocations:
    """Wraps hybridcache's manager; its 50th allocation reports one block id off."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._n = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def allocate_slots(self, *args: Any, **kwargs: Any) -> Any:
        out = self._inner.allocate_slots(*args, **kwargs)
        self._n += 1
        if out is not None and self._n >= 50 and out.get_block_ids()[0]:
            from hybridcache import KVCacheBlocks

            ids = out.get_block_ids()
            return KVCacheBlocks(([ids[0][0] + 1, *ids[0][1:]], *ids[1:]), self._inner)
        return out


def test_fuzz_detects_a_divergence(monkeypatch: pytest.MonkeyPatch) -> None:
    real = fuzz.build_hybridcache
    monkeypatch.setattr(fuzz, "build_hybridcache", lambda s: _LyingAllocations(real(s)))
    f = fuzz.run_fuzz(ops=3000, seed=1, mixes=("full",), caching=(True,), ops_per_setup=3000)
    assert f.divergences >= 1 and "allocate_slots" in f.reports[0]
    assert f.invariant_violations == 0 and f.bad_input_failures == 0


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert fuzz.main(["--ops", "400", "--seed", "3", "--mix", "full_sw,sw_mamba", "--caching", "on"]) == 0
    out = capsys.readouterr().out
    assert "FINAL" in out and "divergences=0" in out and "invariant_violations=0" in out
