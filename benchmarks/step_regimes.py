"""How much the step bench's ratios depend on what ran just before each
measured step (the cache state it starts in).

    python benchmarks/step_regimes.py --running 256 --layout full+3xmamba-align

`hybridcache bench --step` runs stock, hybridcache, hc+native and the floor
in one lockstep, one step of each in turn: every measured step starts right
after three other schedulers' steps, one of them stock's, whose manager
touches several times the others' data. A serving process runs one
scheduler, with the model runner's host work between its steps. This runs
the same workload (the bench's `timed_run`, schedules checked identical)
three ways and prints the p50 step and each variant's ratio to the floor:

- `lockstep`: the four variants in turn (what the bench reports);
- `pair`: the variant and the floor in turn, nothing else between;
- `solo`: each variant's steps on their own, one run after another.

Same process, same recording for the floor. Noise on a 2-core VM is a few
per cent: run it more than once before reading a difference into it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

REGIMES = ("lockstep", "pair", "solo")
MEASURED = ("hybridcache", "hc+native")


def p50_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1000.0


def measure(cfg: Any, timed: Callable[..., dict[str, list[int]]], recording: Any,
            variants: Sequence[str] = MEASURED) -> dict[str, dict[str, dict[str, float]]]:
    """{regime: {variant: {"p50_us", "floor_us", "ratio"}}}: each variant's
    p50 step and the floor's p50 from the same run, per regime. `timed` is
    the bench's `timed_run(cfg, variants, recording)`."""
    out: dict[str, dict[str, dict[str, float]]] = {r: {} for r in REGIMES}
    lockstep = timed(cfg, ("stock", *variants, "floor"), recording)
    floor_alone = p50_us(timed(cfg, ("floor",), recording)["floor"])
    for v in variants:
        pair = timed(cfg, (v, "floor"), recording)
        solo = p50_us(timed(cfg, (v,), recording)[v])
        for regime, mine, floor in (("lockstep", p50_us(lockstep[v]), p50_us(lockstep["floor"])),
                                    ("pair", p50_us(pair[v]), p50_us(pair["floor"])),
                                    ("solo", solo, floor_alone)):
            out[regime][v] = {"p50_us": mine, "floor_us": floor, "ratio": mine / floor}
    return out


def format_table(cfg: Any, result: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = [f"{cfg.layout}, {cfg.running} running, {cfg.steps} steps: p50 us per step, ratio to the floor "
             "measured in the same run",
             f"{'regime':<10}" + "".join(f"{v:>30}" for v in result["lockstep"])]
    for regime in REGIMES:
        cells = "".join(f"{c['p50_us']:>11.0f} / {c['floor_us']:>6.0f} = {c['ratio']:5.3f}"
                        for c in result[regime].values())
        lines.append(f"{regime:<10}{cells}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--layout", default="full+3xmamba-align")
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args(argv)

    from hybridcache_dev.step_bench import StepBenchUnavailable, configs, load_vllm, record_stock, timed_run

    try:
        load_vllm()
    except StepBenchUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    # The bench's own configuration (its warmup prefills the running set).
    (cfg,) = configs(False, running=[args.running], layouts=[args.layout], steps=args.steps)
    print(format_table(cfg, measure(cfg, timed_run, record_stock(cfg))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
