"""One side of `hybridcache verify`: runs a workload through vLLM's
`LLM.generate` in this process and writes the generated token ids, vLLM's
counters and the timings to a JSON file.

  python -m hybridcache.verify_run SPEC.json

SPEC (written by `hybridcache.verify`): {"side": "stock" | "hybridcache",
"model", "engine_args", "waves": [[[prompt, max_tokens], ...], ...], "result"}.
The parent sets the environment: VLLM_ENABLE_V1_MULTIPROCESSING (the engine
core in this process or its own), HYBRIDCACHE_ENABLE (the plugin route) and
HYBRIDCACHE_VERIFY_DIR, a folder where every engine process started from this
module records itself.

vLLM starts its engine core and workers with the `spawn` method, which imports
this module again in each of them (as `__mp_main__`): the module-level code
below then runs there too, before the engine is built. It imports the
modules named in $HYBRIDCACHE_VERIFY_PRELOAD (comma-separated: a site's
patches) wraps vLLM's `Scheduler` to time `schedule` and `update_from_output` and
to record which KV-cache manager class it built, and counts hybridcache's
install line.
"""

from __future__ import annotations

import importlib
import json
import logging
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

DIR_ENV = "HYBRIDCACHE_VERIFY_DIR"
PRELOAD_ENV = "HYBRIDCACHE_VERIFY_PRELOAD"
PROGRESS = "hybridcache-verify-progress "  # prefix of the progress lines on stderr

_record: dict[str, Any] = {"pid": os.getpid(), "process": multiprocessing.current_process().name,
                           "manager": None, "steps": 0, "scheduler_ns": 0, "install_lines": 0}
_last_flush = [0.0]


def _flush(force: bool = False) -> None:
    folder = os.environ.get(DIR_ENV)
    now = time.monotonic()
    if not folder or (not force and now - _last_flush[0] < 0.25):
        return
    _last_flush[0] = now
    path = Path(folder) / f"process-{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(_record))
    tmp.replace(path)


def _wrap_scheduler() -> None:
    """Times vLLM's scheduler steps and records its manager class (in the
    process that builds the scheduler: the engine core)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    if getattr(Scheduler, "_hybridcache_verify", False):
        return
    init, schedule, update, shutdown = (Scheduler.__init__, Scheduler.schedule,
                                        Scheduler.update_from_output, Scheduler.shutdown)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        cls = type(self.kv_cache_manager)
        _record["manager"] = f"{cls.__module__}.{cls.__qualname__}"
        _flush(force=True)

    def timed(method: Any, count: bool) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter_ns()
            try:
                return method(self, *args, **kwargs)
            finally:
                _record["scheduler_ns"] += time.perf_counter_ns() - t
                _record["steps"] += count
                _flush()
        return call

    def _shutdown(self: Any) -> None:
        _flush(force=True)
        shutdown(self)

    Scheduler.__init__ = __init__
    Scheduler.schedule = timed(schedule, True)
    Scheduler.update_from_output = timed(update, False)
    Scheduler.shutdown = _shutdown
    Scheduler._hybridcache_verify = True


class _InstallLines(logging.Filter):
    """Counts hybridcache's install line in this process (a filter on its
    logger: vLLM's logging set-up drops the handlers of loggers under
    "vllm", not their filters)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("hybridcache is on:"):
            _record["install_lines"] += 1
            _flush(force=True)
        return True


def _prepare_process() -> None:
    logging.getLogger("vllm.hybridcache").addFilter(_InstallLines())
    for name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
        importlib.import_module(name.strip())
    _wrap_scheduler()
    _flush(force=True)


def progress(**fields: Any) -> None:
    """One progress line on stderr, for the parent's display."""
    print(PROGRESS + json.dumps(fields), file=sys.stderr, flush=True)


def _counters(metrics: list[Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """vLLM's counters (summed over label sets) and its time-to-first-token
    histogram's sum and count."""
    counters: dict[str, Any] = {}
    ttft = {"sum": 0.0, "count": 0.0}
    for m in metrics:
        name = m.name.removeprefix("vllm:")
        if name == "time_to_first_token_seconds":
            ttft["sum"] += m.sum
            ttft["count"] += m.count
        elif hasattr(m, "values"):  # Vector: accepted tokens per draft position
            prev = counters.get(name, [])
            counters[name] = [a + b for a, b in zip(prev, m.values)] + list(m.values[len(prev):]) \
                if len(m.values) >= len(prev) else prev
        elif type(m).__name__ == "Counter":
            counters[name] = counters.get(name, 0) + m.value
    return counters, ttft


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs the spec's waves and returns the result (see the module doc)."""
    from vllm import LLM, SamplingParams

    if spec["side"] == "hybridcache" and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0" \
            and os.environ.get("HYBRIDCACHE_ENABLE") != "1":
        from hybridcache.vllm import install

        install()
    progress(side=spec["side"], phase="engine")
    t0 = time.perf_counter()
    args = {"seed": 0, **spec["engine_args"], "disable_log_stats": False}
    llm = LLM(model=spec["model"], **args)
    start_s = time.perf_counter() - t0
    tokens: list[list[int]] = []
    generate_s = 0.0
    waves = spec["waves"]
    done, total = 0, sum(len(w) for w in waves)
    for i, wave in enumerate(waves):
        params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=n) for _, n in wave]
        t = time.perf_counter()
        outputs = llm.generate([p for p, _ in wave], params, use_tqdm=False)
        generate_s += time.perf_counter() - t
        tokens += [list(o.outputs[0].token_ids) for o in outputs]
        done += len(wave)
        progress(side=spec["side"], phase="wave", wave=i + 1, waves=len(waves), done=done, total=total)
    counters, ttft = _counters(llm.get_metrics())
    engine: Any = getattr(llm.llm_engine, "engine_core", None)
    if engine is not None and hasattr(engine, "shutdown"):
        engine.shutdown()
    _flush(force=True)
    processes = []
    folder = os.environ.get(DIR_ENV)
    if folder:
        processes = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("process-*.json"))]
    return {"side": spec["side"], "tokens": tokens, "counters": counters,
            "timings": {"engine_start_s": start_s, "generate_s": generate_s,
                        "output_tokens": sum(map(len, tokens)), "ttft_sum_s": ttft["sum"],
                        "ttft_count": ttft["count"]},
            "processes": processes}


if os.environ.get(DIR_ENV):  # every process of the run, the spawned ones included
    _prepare_process()

if __name__ == "__main__":
    _spec = json.loads(Path(sys.argv[1]).read_text())
    _result = run(_spec)
    Path(_spec["result"]).write_text(json.dumps(_result))
    progress(side=_spec["side"], phase="done")
