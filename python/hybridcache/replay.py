"""`hybridcache replay`: the recorded default serving trace of the installed
vLLM release (`tools.trace`: prefix-cache hits, chunked prefill,
speculative decoding with changing draft counts, external tokens, async
loads, preemption, aborts, evictions, resets, KV events) applied to
hybridcache's facade for that release and to the release's own manager, same
request objects, every answer compared across the two and with the
recording. Without vLLM (or with --no-vllm) the oldest release's trace runs
on hybridcache alone, checked against the recording.

The trace is the development package's simulation (`hybridcache_dev`) of the
default configuration, seed 0; another --seed or --requests simulates a new
trace live, with that package (``pip install -e dev`` in the repository).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
import time
from typing import Any

from . import releases
from .tools import configs, trace
from .tools.compare import ReplayDivergence
from .tools.oracle import quiet_logs, tool_release
from .tools.release_api import release as release_api


def _recorded(row: releases.Release | None) -> tuple[dict[str, Any], str]:
    """The shipped trace applied: to `row`'s manager and hybridcache's facade
    for it, or, without `row`, to the facade alone: the installed vLLM's
    release's, else the oldest release's (whose requests need no vLLM)."""
    installed = releases.installed_vllm_version()
    version = (row or releases.find(installed) or releases.DEFAULT).version
    recorded, api = trace.load(version), release_api(version)
    groups, kwargs = trace.groups(recorded), recorded["kwargs"]
    if row is None:
        managers = [api.tool_facade(configs.kv_cache_config(groups, recorded["num_blocks"]), kwargs)]
        names = ["hybridcache"]
    else:
        vllm_config = configs.kv_cache_config(groups, recorded["num_blocks"], vllm=True)
        managers = [api.tool_vllm(vllm_config, kwargs), api.tool_facade(vllm_config, kwargs)]
        names = ["vllm", "hybridcache"]
    # Under a vLLM release hybridcache does not support, events and stats are
    # that vLLM's classes, unlike the recording's.
    foreign = installed is not None and releases.find(installed) is None
    counts = trace.replay(recorded, managers, names, api, unchecked=trace.OBSERVED if foreign else ())
    return {**recorded["summary"], **counts}, f"{len(recorded['requests'])} requests"


def main(args: argparse.Namespace) -> int:
    from . import __version__

    if args.requests is not None and args.requests <= 0:
        print("hybridcache replay: --requests must be positive", file=sys.stderr)
        return 2
    live = args.seed != 0 or args.requests is not None
    if live and importlib.util.find_spec("hybridcache_dev") is None:
        print("hybridcache replay: --seed and --requests simulate a new trace with hybridcache's development "
              "package (pip install -e dev, from the repository)", file=sys.stderr)
        return 2
    row, note = tool_release("hybridcache replay", not args.no_vllm)
    layout = trace.load(row.version)["layout"] if row is not None else ""
    if row is not None and not row.covers(layout):
        note = (f"vLLM {row.version}: hybridcache's facade does not cover the default trace's layout "
                f"({layout}) yet, so it is not compared")
        print(f"hybridcache replay: {note}", file=sys.stderr)
        row = None
    start = time.perf_counter()
    try:
        # vLLM logs (prefix-cache resets) go to stderr, not into the summary.
        with contextlib.redirect_stdout(sys.stderr), quiet_logs():
            if live:
                from hybridcache_dev.replay import live as simulate

                s, size = simulate(args.seed, args.requests, row)
            else:
                s, size = _recorded(row)
    except ReplayDivergence as e:
        against = f"vLLM {row.version}" if row is not None else "the recording"
        print(f"hybridcache replay: DIVERGED from {against}: {e}", file=sys.stderr)
        return 1
    mode = f"hybridcache {__version__}" + (f" and vLLM {row.version}" if row else "")
    print(f"replayed the default trace (seed {args.seed}, {size}) on {mode}\n"
          f"  {s.get('ops', 0):,} ops, {s.get('steps', 0):,} steps, {s.get('preemptions', 0):,} preemptions, "
          f"{s.get('cache_hit_tokens', 0):,} prefix-cache hit tokens, {s.get('events', 0):,} KV events, "
          f"{time.perf_counter() - start:.2f} s")
    print(f"verified identical to vLLM {row.version}" if row else f"{note}: ran hybridcache only")
    return 0
