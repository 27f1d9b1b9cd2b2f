"""Records the default serving trace that the wheel's ``hybridcache replay``
applies (`hybridcache.tools.trace`): the replay's simulation
(`simulation.ReplaySimulation`, `replay_config.DEFAULT_CONFIG`, seed 0)
over hybridcache's facade for one vLLM release, every manager call written
down with the live requests' state before it and a digest of its answer.

  python -m hybridcache_dev.replay_trace [--release VERSION] [--check]

writes python/hybridcache/traces/replay-<release>.json.xz for the given
release (default: the installed vLLM's, else the table's oldest, which needs
no vLLM); --check compares with the file instead (exit 1 if it differs).
A release whose scheduler builds vLLM's own requests needs that vLLM.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import lzma
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybridcache import releases
from hybridcache.tools import trace
from hybridcache.tools.compare import Fanout
from hybridcache.tools.oracle import quiet_logs
from hybridcache.tools.release_api import release

from .configs import format_mix
from .replay_config import DEFAULT_CONFIG, ReplayConfig
from .simulation import ReplaySimulation

TRACES = Path(__file__).resolve().parents[2] / "python" / "hybridcache" / "traces"


class Recorder(trace.Runner):
    """A `trace.Runner` that writes every call down (`sim` is set after construction)."""

    sim: ReplaySimulation

    def __init__(self, fanout: Fanout, api: Any):
        super().__init__(fanout, api)
        self.ops: list[list[Any]] = []
        self.states: dict[int, tuple[int, int, int]] = {}

    def call(self, name: str, req: Any = None, *args: Any) -> list[Any]:
        sim, updates = self.sim, []
        seqs = sim.waiting + sim.running + sim.loading
        if req is not None:
            seqs.append(next(s for s, *_ in reversed(sim.created) if s.req is req))
        for seq in seqs:
            r = seq.req
            state = (r.num_tokens, r.num_computed_tokens, r.num_preemptions)
            if self.states.get(seq.index) != state:
                self.states[seq.index] = state
                updates.append([seq.index, *state])
        idx = -1 if req is None else seqs[-1].index
        results = super().call(name, req, *args)
        self.ops.append([name, idx, [_plain(a) for a in args], updates, trace.digest(self.answer(name, results))])
        return results


def dumps(trace: dict[str, Any]) -> bytes:
    """A trace file's bytes (deterministic: the same trace, the same bytes)."""
    text = json.dumps(trace, separators=(",", ":"), sort_keys=True)
    return lzma.compress(text.encode(), preset=9 | lzma.PRESET_EXTREME)


def _plain(arg: Any) -> Any:
    return sorted(arg) if isinstance(arg, (set, frozenset)) else arg


def record(version: str, config: ReplayConfig = DEFAULT_CONFIG, seed: int = 0) -> dict[str, Any]:
    """The trace of `config` and `seed` over hybridcache's facade for vLLM `version`."""
    api = release(version)
    manager = api.tool_facade(config.hybridcache_kv_cache_config(), config.manager_kwargs())
    fanout = Fanout([manager], ["hybridcache"], seed)
    sim = ReplaySimulation(config, seed, fanout, api, runner=Recorder)
    recorder = sim.ops
    assert isinstance(recorder, Recorder)
    recorder.sim = sim
    with quiet_logs():
        summary = sim.run()
    counters = {k: v for k, v in summary.as_dict().items() if k not in ("seconds", "ops")}
    return {
        "format": trace.FORMAT,
        "release": version,
        "seed": seed,
        "layout": format_mix(config.mix),
        "groups": [dataclasses.asdict(g) for g in config.groups],
        "num_blocks": config.num_blocks,
        "kwargs": config.manager_kwargs(),
        "summary": counters,
        "requests": [[s.req.request_id, s.req.num_prompt_tokens, list(s.req.all_token_ids), lora, salt, skip]
                     for s, lora, salt, skip in sim.created],
        "ops": recorder.ops,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", choices=releases.SUPPORTED_VLLM_VERSIONS, default=None)
    parser.add_argument("--check", action="store_true", help="compare with the shipped file instead of writing it")
    args = parser.parse_args(argv)
    version = args.release
    if version is None:
        from hybridcache.tools.oracle import load_vllm

        version = load_vllm(releases.RELEASES)[0] or releases.DEFAULT.version
    path = TRACES / trace.trace_name(version)
    recorded = record(version)
    if args.check:
        same = path.exists() and trace.loads(path.read_bytes()) == trace.loads(dumps(recorded))
        print(f"{path}: {'up to date' if same else 'DIFFERS from the recording (rerun without --check)'}")
        return 0 if same else 1
    data = dumps(recorded)
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    print(f"wrote {path} ({len(data):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
