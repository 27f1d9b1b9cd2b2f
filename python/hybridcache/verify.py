"""`hybridcache verify`: the user's model under the installed vLLM, run twice
through `LLM.generate` (stock vLLM, then with hybridcache's manager), each in
its own process; the generated tokens and vLLM's counters are compared, and
the timings are set side by side.

Exit status: 0 identical, 1 a divergence (the first differing request and
token are named), 2 bad arguments or a run that failed. Nothing here imports
vLLM or torch; the runs do (`hybridcache.verify_run`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .verify_run import DIR_ENV, PRELOAD_ENV, PROGRESS
from .verify_workload import Request, builtin, from_file

SIDES = ("stock", "hybridcache")
# vLLM's counters compared between the sides (those a run reports).
COUNTERS = ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "prompt_tokens",
            "prompt_tokens_cached", "generation_tokens", "spec_decode_num_drafts",
            "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
            "spec_decode_num_accepted_tokens_per_pos")


class RunFailed(RuntimeError):
    """A side's process failed; the message ends with its log's last lines."""


@dataclass
class Side:
    """One side's result (`verify_run`'s JSON) and its process log."""

    name: str
    result: dict[str, Any]
    log: str


def parse_engine_args(pairs: list[str], as_json: str | None) -> dict[str, Any]:
    """`--engine-args JSON` then each `--engine-arg key=value` (the value read
    as JSON when it parses, else as a string)."""
    args: dict[str, Any] = json.loads(as_json) if as_json else {}
    if not isinstance(args, dict):
        raise ValueError("--engine-args must be a JSON object")
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--engine-arg takes key=value, got {pair!r}")
        try:
            args[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            args[key.replace("-", "_")] = value
    return args


def run_side(side: str, model: str, engine_args: dict[str, Any], waves: list[list[Request]], workdir: Path,
             multiprocess: bool = False, preload: str = "", env: dict[str, str] | None = None,
             timeout: float | None = None, on_progress: Any = None) -> Side:
    """Runs one side in its own process and returns its result. `multiprocess`:
    the engine core in its own process, hybridcache through the plugin
    (HYBRIDCACHE_ENABLE=1); else in the run's process, through `install()`."""
    folder = workdir / side
    (folder / "processes").mkdir(parents=True, exist_ok=True)
    result_path = folder / "result.json"
    spec: dict[str, Any] = {"side": side, "model": model, "engine_args": engine_args, "result": str(result_path),
            "waves": [[[r.prompt, r.max_tokens] for r in wave] for wave in waves]}
    (folder / "spec.json").write_text(json.dumps(spec))
    child_env = {**os.environ, **(env or {}), DIR_ENV: str(folder / "processes"), PRELOAD_ENV: preload,
                 "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocess else "0",
                 "HYBRIDCACHE_ENABLE": "1" if side == "hybridcache" and multiprocess else "0",
                 "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), "PYTHONUNBUFFERED": "1"}
    log_path = folder / "log.txt"
    lines: list[str] = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "hybridcache.verify_run", str(folder / "spec.json")],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env,
                                cwd=str(folder))
        assert proc.stdout is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        for line in proc.stdout:
            log.write(line)
            log.flush()
            lines.append(line)
            if line.startswith(PROGRESS) and on_progress is not None:
                on_progress(json.loads(line[len(PROGRESS):]))
            if deadline is not None and time.monotonic() > deadline:
                proc.kill()
                break
        code = proc.wait()
    text = "".join(lines)
    if code != 0 or not result_path.exists():
        tail = "".join(lines[-25:])
        raise RunFailed(f"the {side} run failed (exit {code}); its log: {log_path}\n{tail}")
    return Side(side, json.loads(result_path.read_text()), text)


def first_divergence(stock: Side, ours: Side) -> str | None:
    """The first differing request and token index, a differing counter, or None."""
    a, b = stock.result["tokens"], ours.result["tokens"]
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            j = next((k for k, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            got = lambda t: t[j] if j < len(t) else "end"  # noqa: E731
            return f"request {i}, token {j}: stock {got(x)}, hybridcache {got(y)}"
    if len(a) != len(b):
        return f"request count: stock {len(a)}, hybridcache {len(b)}"
    for name in COUNTERS:
        x, y = stock.result["counters"].get(name), ours.result["counters"].get(name)
        if x != y:
            return f"vLLM counter {name}: stock {x}, hybridcache {y}"
    return None


def _figures(side: Side) -> dict[str, str]:
    t = side.result["timings"]
    records = [p for p in side.result["processes"] if p.get("manager")]
    steps = sum(p["steps"] for p in records)
    sched_ns = sum(p["scheduler_ns"] for p in records)
    c = side.result["counters"]
    out = {
        "manager": ", ".join(sorted({p["manager"].rsplit(".", 1)[-1] + f" ({p['process']})" for p in records})) or "?",
        "engine start (s)": f"{t['engine_start_s']:.1f}",
        "generate wall time (s)": f"{t['generate_s']:.2f}",
        "output tokens/s": f"{t['output_tokens'] / t['generate_s']:.1f}" if t["generate_s"] else "-",
        "time to first token, mean (ms)": f"{1e3 * t['ttft_sum_s'] / t['ttft_count']:.1f}" if t["ttft_count"] else "-",
        "scheduler steps": f"{steps:,}",
        "scheduler time per step (us)": f"{sched_ns / steps / 1e3:.1f}" if steps else "-",
    }
    for name in COUNTERS:
        if name in c:
            out[name.replace("_", " ")] = str(c[name])
    return out


def report(stock: Side, ours: Side) -> str:
    """The side-by-side table."""
    a, b = _figures(stock), _figures(ours)
    width = max(map(len, a)) + 2
    rows = [f"{'':{width}}{'stock':>34}  {'hybridcache':>34}"]
    rows += [f"{k:{width}}{a[k]:>34}  {b.get(k, '-'):>34}" for k in a]
    return "\n".join(rows)


class _Progress:
    def __init__(self, stream: Any) -> None:
        self.stream, self.tty = stream, stream.isatty()

    def __call__(self, p: dict[str, Any]) -> None:
        if p["phase"] == "engine":
            text = f"[{p['side']}] starting the engine"
        elif p["phase"] == "wave":
            text = f"[{p['side']}] wave {p['wave']}/{p['waves']}, {p['done']}/{p['total']} requests done"
        else:
            text = f"[{p['side']}] done"
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if p["phase"] == "done" else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `hybridcache verify` arguments."""
    p.add_argument("model", help="the model (a local folder or a hub name vLLM can load)")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="an engine argument of vLLM's LLM(...) (repeatable; VALUE read as JSON if it parses), "
                        "e.g. --engine-arg speculative_config='{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'")
    p.add_argument("--engine-args", default=None, metavar="JSON", help="engine arguments as one JSON object")
    p.add_argument("--prompts", type=Path, default=None,
                   help="a prompts file (one prompt a line, a blank line between waves) instead of the built-in workload")
    p.add_argument("--requests", type=int, default=24, help="built-in workload: about this many requests (default 24)")
    p.add_argument("--max-tokens", type=int, default=24, help="tokens generated per request (default 24)")
    p.add_argument("--num-blocks", type=int, default=None,
                   help="a small KV-cache pool of this many blocks (num_gpu_blocks_override), to preempt and evict")
    p.add_argument("--multiprocess", action="store_true",
                   help="the engine core in its own process, hybridcache enabled by HYBRIDCACHE_ENABLE=1")
    p.add_argument("--preload", default="", metavar="MODULES",
                   help="comma-separated modules imported in every engine process of both runs (a site's patches)")
    p.add_argument("--workdir", type=Path, default=None, help="keep the runs' specs, logs and results here")
    p.add_argument("--timeout", type=float, default=None, help="seconds each run may take")


def main(args: argparse.Namespace) -> int:
    """Runs `hybridcache verify`; returns its exit status."""
    try:
        engine_args = parse_engine_args(args.engine_arg, args.engine_args)
        waves = from_file(args.prompts, args.max_tokens) if args.prompts else builtin(args.requests, args.max_tokens)
    except (ValueError, OSError) as e:
        print(f"hybridcache verify: {e}", file=sys.stderr)
        return 2
    if args.num_blocks is not None:
        engine_args["num_gpu_blocks_override"] = args.num_blocks
    engine_args.setdefault("enable_prefix_caching", True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hybridcache-verify-"))
    n = sum(len(w) for w in waves)
    print(f"hybridcache verify: {args.model}, {len(waves)} waves, {n} requests, engine arguments "
          f"{json.dumps(engine_args)}; logs in {workdir}")
    show = _Progress(sys.stderr)
    sides = []
    try:
        for side in SIDES:
            sides.append(run_side(side, args.model, engine_args, waves, workdir, args.multiprocess,
                                  args.preload, timeout=args.timeout, on_progress=show))
    except RunFailed as e:
        print(f"hybridcache verify: {e}", file=sys.stderr)
        return 2
    stock, ours = sides
    print(report(stock, ours))
    divergence = first_divergence(stock, ours)
    tokens = sum(map(len, stock.result["tokens"]))
    if divergence:
        print(f"DIVERGED: {divergence}")
        return 1
    print(f"identical: {n} requests, {tokens:,} generated tokens, vLLM's counters")
    return 0
