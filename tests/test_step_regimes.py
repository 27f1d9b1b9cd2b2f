"""benchmarks/step_regimes.py: each regime runs the variants it names, and
each ratio is that regime's own p50 over the floor's from the same run."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("step_regimes", ROOT / "benchmarks/step_regimes.py")
assert spec is not None and spec.loader is not None
step_regimes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(step_regimes)


class Cfg:
    layout, running, steps = "full", 8, 3


def test_each_regime_runs_its_variants_and_divides_by_its_own_floor() -> None:
    """A fake `timed_run`: a variant's step costs its base, plus 10 us for
    every other variant run beside it (what ran before it)."""
    base = {"stock": 900, "hybridcache": 110, "hc+native": 90, "floor": 100}
    runs: list[tuple[str, ...]] = []

    def timed(cfg: Any, variants: tuple[str, ...], recording: Any) -> dict[str, list[int]]:
        assert recording == "rec"
        runs.append(tuple(variants))
        return {v: [1000 * (base[v] + 10 * (len(variants) - 1))] * 3 for v in variants}

    out = step_regimes.measure(Cfg(), timed, "rec")
    assert sorted(runs) == sorted([("stock", "hybridcache", "hc+native", "floor"), ("floor",),
                                   ("hybridcache", "floor"), ("hybridcache",),
                                   ("hc+native", "floor"), ("hc+native",)])
    assert out["lockstep"]["hybridcache"] == {"p50_us": 140, "floor_us": 130, "ratio": 140 / 130}
    assert out["pair"]["hc+native"] == {"p50_us": 100, "floor_us": 110, "ratio": 100 / 110}
    assert out["solo"]["hybridcache"] == {"p50_us": 110, "floor_us": 100, "ratio": 1.1}
    table = step_regimes.format_table(Cfg(), out)
    assert "lockstep" in table and "1.100" in table and "0.909" in table


def test_a_tiny_run_against_the_installed_vllm() -> None:
    from hybridcache_dev.oracle import vllm_missing

    from hybridcache import releases

    if vllm_missing("step_regimes", accepted=releases.RELEASES) is not None:
        pytest.skip("needs an installed vLLM release hybridcache supports")
    from hybridcache_dev.step_bench import StepConfig, record_stock, timed_run

    cfg = StepConfig("full+3xmamba-align", running=8, steps=4, warmup=4, prompt_len=(20, 90), max_tokens=(4, 30))
    out = step_regimes.measure(cfg, timed_run, record_stock(cfg))
    for regime in step_regimes.REGIMES:
        for v in step_regimes.MEASURED:
            c = out[regime][v]
            assert c["p50_us"] > 0 and c["ratio"] == c["p50_us"] / c["floor_us"]
