"""Where vLLM's scheduler code stays unspecialized under hybridcache but not
under another manager: CPython's adaptive interpreter (3.11+) specializes
each attribute lookup and call site for the types it meets, and a manager
whose objects defeat that (a method shadowed by an instance attribute, an
instance dict past CPython's 30 shared keys, a dict slot left empty) makes
the scheduler run the generic lookup at every call, a cold instance-dict
probe or two each time. Nothing in the manager's own profile shows it.

    python benchmarks/step_specialization.py                 # hybridcache against the floor
    python benchmarks/step_specialization.py --against stock --running 256

Each variant runs the step bench's workload alone in a fresh interpreter
(specialization state is per process, and the variants share vLLM's code
objects), then every function of `vllm.v1.*` is disassembled with its
specialized instructions, after each of the last few steps. Listed: the
instructions the reference variant kept specialized and hybridcache kept
adaptive (it tried and failed) in every snapshot, with the source line.
`CALL` itself is left out: 3.11 specializes it for Python callees only, so
a call into a C method is adaptive whatever the manager does; the
`LOAD_METHOD` and `PRECALL` before it are listed.
"""

from __future__ import annotations

import argparse
import dis
import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

Spec = dict[str, tuple[str, str, int]]

# Snapshots taken, after each of the last steps (see `steady`).
SNAPSHOTS = 6


def snapshot(prefixes: tuple[str, ...] = ("vllm.v1",)) -> Spec:
    """Every instruction of the loaded modules' functions under `prefixes`,
    as `qualified name:offset -> (opname, argument, line)`."""
    out: Spec = {}

    def visit(name: str, f: Any) -> None:
        f = getattr(f, "fget", f)  # a property's getter
        f = getattr(f, "__func__", f)  # a classmethod's or staticmethod's function
        if not hasattr(f, "__code__"):
            return
        for ins in dis.get_instructions(f, adaptive=True):
            line = ins.positions.lineno if ins.positions and ins.positions.lineno else 0
            out[f"{name}:{ins.offset}"] = (ins.opname, str(ins.argval), line)

    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith(prefixes):
            continue
        for name, obj in list(vars(mod).items()):
            if inspect.isclass(obj) and obj.__module__ == mod_name:
                for attr, fn in vars(obj).items():
                    visit(f"{mod_name}.{name}.{attr}", fn)
            elif inspect.isfunction(obj) and obj.__module__ == mod_name:
                visit(f"{mod_name}.{name}", obj)
    return out


def steady(snapshots: list[Spec]) -> Spec:
    """The instructions whose state is the same in every snapshot. Some of
    vLLM's own lookups flap under any manager: 3.11 respecializes a lookup
    on an instance dict past 30 names every 53 misses (the `Scheduler`'s
    and `Request`'s own). Those run per request flip within a step and are
    dropped here; those run once a step flip every 53 steps, so a few may
    still be listed (`self.<method>` lookups in `schedule()`), and cost one
    generic lookup a step."""
    first, *rest = snapshots
    return {k: v for k, v in first.items() if all(r.get(k) == v for r in rest)}


def unspecialized(reference: Spec, variant: Spec) -> list[tuple[str, str, str, str, int]]:
    """Instructions `reference` specialized and `variant` left adaptive:
    (name:offset, reference's opname, variant's, argument, line)."""
    rows = []
    for key, (op, arg, line) in sorted(reference.items()):
        if op.startswith("CALL"):
            continue  # 3.11 specializes CALL for Python callees only: a C method's is adaptive anyway
        theirs = variant.get(key)
        if theirs is None or not theirs[0].endswith("_ADAPTIVE"):
            continue
        if op.endswith("_ADAPTIVE") or op == theirs[0].removesuffix("_ADAPTIVE"):
            continue  # not specialized there either (or never quickened)
        rows.append((key, op, theirs[0], arg, line))
    return rows


def _child(variant: str, running: int, steps: int, layout: str, out: str) -> None:
    from hybridcache_dev import step_bench

    cfg = step_bench.StepConfig(layout=layout, running=running, steps=steps, warmup=5)
    recording = step_bench.record_stock(cfg) if variant == "floor" else None
    run = step_bench.Lockstep(cfg, [variant], recording)
    snapshots = []
    for i in range(cfg.warmup + cfg.steps):
        run.step(i, check=False)
        if i >= cfg.warmup + cfg.steps - SNAPSHOTS:
            snapshots.append(snapshot())
    Path(out).write_text(json.dumps(snapshots))


def measure(variant: str, running: int, steps: int, layout: str) -> Spec:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "spec.json")
        env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", PYTHONHASHSEED="0")
        cmd = [sys.executable, __file__, "--child", variant, "--running", str(running), "--steps", str(steps),
               "--layout", layout, "--out", out]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        raw = json.loads(Path(out).read_text())
    return steady([{k: (v[0], v[1], v[2]) for k, v in spec.items()} for spec in raw])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", default="hybridcache", choices=("hybridcache", "hc+native"))
    p.add_argument("--against", default="floor", choices=("floor", "stock"))
    p.add_argument("--running", type=int, default=64)
    p.add_argument("--steps", type=int, default=60, help="steps run (snapshots after the last few)")
    p.add_argument("--layout", default="full+3xmamba-align")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args.child, args.running, args.steps, args.layout, args.out)
        return 0
    ref = measure(args.against, args.running, args.steps, args.layout)
    mine = measure(args.variant, args.running, args.steps, args.layout)
    rows = unspecialized(ref, mine)
    print(f"{len(rows)} instructions of vLLM's code specialized under {args.against}, adaptive under "
          f"{args.variant} ({args.layout}, {args.running} running, {args.steps} steps):")
    for key, op, theirs, arg, line in rows:
        print(f"  {key:<70} line {line:<5} {arg:<28} {op} -> {theirs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
