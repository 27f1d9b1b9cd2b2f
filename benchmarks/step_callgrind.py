"""Where hybridcache's own code spends the scheduler step, in instructions and
simulated instruction-cache misses, measured in situ under callgrind.

    python benchmarks/step_callgrind.py --running 256 --layout full+3xmamba-align
    python benchmarks/step_callgrind.py --report callgrind.out.1   # an earlier dump
    python benchmarks/step_callgrind.py --variant floor --out floor.out
    python benchmarks/step_callgrind.py --against floor.out.1      # where the step exceeds the floor's
    python benchmarks/step_callgrind.py --l2 1024 ...              # the L2 as the simulated last level

The step bench's hybridcache scheduler (`hybridcache_dev.step_bench.Lockstep`)
runs under `valgrind --tool=callgrind --cache-sim=yes`, with instrumentation
off while vLLM imports and the workload warms up. It is then switched on
(`callgrind_control -i on`), a few steps run to fill the simulated caches,
the counters are zeroed, the measured steps run, and the counters are dumped.

Under the Python scheduler, between two calls into the extension, the
interpreter evicts its code from the 32 KiB L1 instruction cache; a call then
misses on about every line of code it runs. Those misses, not the
instruction count, set most of a call's cost in situ. A wall-clock
bench cannot separate the two, and this machine's guest has no PMU; the
simulation can, and it is deterministic for a given binary.

The report lists, per function of `_native.abi3.so` (inlined code counted
in the function it was inlined into), instructions and L1 instruction
misses per step; `--callers NAME` adds the inclusive costs of the calls
made by functions matching NAME. `--against DUMP` compares the whole
process with another run's dump (the floor's, say), per object and per
function of every object: the interpreter's code that the extension's code
evicts shows up there, as misses the extension's own functions do not
count. Per object the counts are exact. Per function they are for the
functions entered after instrumentation was switched on: the interpreter
loop already running then (in 3.11 every Python frame of the step runs in
it) is named by callgrind as it guessed at that moment, which differs
between runs (`_PyEval_EvalFrameDefault` in one, `PyObject_Vectorcall` in
another). Needs valgrind (Linux).

`--l2 1024` makes the simulated last level this machine's 1 MiB L2 instead of
the host's L3 (valgrind's default, large enough that almost nothing misses
it); `--against` then adds data misses per object and last-level misses per
function. Under a Python scheduler those matter as much as the instruction
misses: what misses L2 comes from L3 or memory, at tens of ns a line.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

OBJECT = "_native.abi3.so"


@dataclass
class Profile:
    """Self costs by function and inclusive costs by call edge, for the
    functions of one object file."""

    ir: collections.Counter[str] = field(default_factory=collections.Counter)
    i1_misses: collections.Counter[str] = field(default_factory=collections.Counter)
    edge_ir: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    edge_i1: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    edge_calls: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    # Self costs of every object (the interpreter, libc, ...): the whole step,
    # and by (object file name, function).
    total_ir: int = 0
    total_i1: int = 0
    any_ir: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    any_i1: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    # Every event's self cost per object, and last-level misses (ILmr + DLmr
    # + DLmw, where the dump has them) by (object, function).
    obj_events: dict[str, collections.Counter[str]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter))
    any_ll: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)


# Misses of the simulated last level, code and data (with `--l2`, the
# machine's L2: what missed there came from L3 or memory).
_LAST_LEVEL = ("ILmr", "DLmr", "DLmw")

_NAMED = re.compile(r"(\w+)=\((\d+)\)(?: (.*))?")


def _position(token: str, previous: int) -> int:
    """A callgrind position: absolute (hex or decimal), relative, or `*`."""
    if token.startswith("0x"):
        return int(token, 16)
    if token[0] in "+-":
        step = int(token[1:], 16) if token[1:3] == "0x" else int(token[1:])
        return previous + step if token[0] == "+" else previous - step
    if token == "*":
        return previous
    return int(token)


def parse(path: str | Path, obj: str = OBJECT) -> Profile:
    """A callgrind dump (`positions: instr line`, events starting `Ir`, with
    `I1mr` among them) read into a `Profile` of the functions of `obj`.
    Names compressed as `(id)` are resolved whichever line first named them."""
    prof = Profile()
    names: dict[str, dict[str, str]] = collections.defaultdict(dict)
    fn: str | None = None
    callee: str | None = None
    in_obj = False
    current = "?"
    pending_call = False
    columns: dict[str, int] = {}
    positions = 1
    instr = 0
    with open(path) as f:
        for line in f:
            if not line.strip() or line[0] == "#":
                continue
            if line[0].isalpha():
                if line.startswith("events:"):
                    events = line.split(":", 1)[1].split()
                    columns = {e: i for i, e in enumerate(events)}
                    continue
                if line.startswith("positions:"):
                    positions = len(line.split(":", 1)[1].split())
                    continue
                m = _NAMED.match(line.strip())
                if m is None:
                    if line.startswith("calls="):
                        pending_call = True
                        count = int(line.split("=", 1)[1].split()[0])
                        if in_obj and fn is not None and callee is not None:
                            prof.edge_calls[(fn, callee)] += count
                    continue
                key, ident, name = m.groups()
                table = {"ob": "ob", "cob": "ob", "fn": "fn", "cfn": "fn"}.get(key)
                if table is None:
                    continue
                if name is not None:
                    names[table][ident] = name
                resolved = names[table].get(ident, "?")
                if key == "ob":
                    in_obj = resolved.endswith(obj)
                    current = resolved.rsplit("/", 1)[-1]
                elif key == "fn":
                    fn = resolved
                elif key == "cfn":
                    callee = resolved
                continue
            tokens = line.split()
            instr = _position(tokens[0], instr)
            costs = tokens[positions:]
            ir = int(costs[columns["Ir"]]) if len(costs) > columns["Ir"] else 0
            i1_col = columns.get("I1mr")
            i1 = int(costs[i1_col]) if i1_col is not None and len(costs) > i1_col else 0
            if pending_call:
                # The line after `calls=` holds the call's inclusive cost.
                pending_call = False
                if in_obj and fn is not None and callee is not None:
                    prof.edge_ir[(fn, callee)] += ir
                    prof.edge_i1[(fn, callee)] += i1
                continue
            prof.total_ir += ir
            prof.total_i1 += i1
            prof.any_ir[(current, fn or "?")] += ir
            prof.any_i1[(current, fn or "?")] += i1
            per_object = prof.obj_events[current]
            ll = 0
            for event, col in columns.items():
                if col < len(costs):
                    v = int(costs[col])
                    per_object[event] += v
                    if event in _LAST_LEVEL:
                        ll += v
            prof.any_ll[(current, fn or "?")] += ll
            if in_obj and fn is not None:
                prof.ir[fn] += ir
                prof.i1_misses[fn] += i1
    return prof


def _short(name: str, width: int = 100) -> str:
    return name.replace("hybridcache_core::", "")[:width]


def report(prof: Profile, steps: int, top: int = 30, callers: str | None = None) -> str:
    """Per step: the totals, then the `top` functions by instructions and by
    instruction-cache misses; with `callers`, the calls those functions make."""
    out = [
        f"whole process, per step: {prof.total_ir // steps} instructions, "
        f"{prof.total_i1 // steps} L1 instruction-cache misses",
        f"{OBJECT}, per step: {sum(prof.ir.values()) // steps} instructions, "
        f"{sum(prof.i1_misses.values()) // steps} L1 instruction-cache misses (simulated, 32 KiB)",
        "",
        f"{'instr':>9} {'I1 miss':>8}  function (self, inlined code included)",
    ]
    for name, ir in prof.ir.most_common(top):
        out.append(f"{ir // steps:9d} {prof.i1_misses[name] // steps:8d}  {_short(name)}")
    out += ["", f"{'I1 miss':>8} {'instr':>9}  function, by misses"]
    for name, miss in prof.i1_misses.most_common(top):
        out.append(f"{miss // steps:8d} {prof.ir[name] // steps:9d}  {_short(name)}")
    if callers:
        out.append("")
        for caller in sorted({c for c, _ in prof.edge_ir if callers in c}):
            out.append(f"calls made by {_short(caller)} (self {prof.ir[caller] // steps}):")
            edges = [(e, n) for e, n in prof.edge_ir.items() if e[0] == caller]
            for (c, callee), ir in sorted(edges, key=lambda x: -x[1]):
                calls = prof.edge_calls[(c, callee)] / steps
                out.append(
                    f"  {ir // steps:9d} {prof.edge_i1[(c, callee)] // steps:7d} "
                    f"x{calls:7.1f}  {_short(callee, 90)}"
                )
    return "\n".join(out)


def compare(prof: Profile, steps: int, base: Profile, base_steps: int, top: int = 30) -> str:
    """Per step, this run against `base` (another variant's dump): the
    whole process, each object, and the `top` functions of any object by
    the difference in instruction-cache misses, then in instructions."""
    out = [
        f"whole process, per step: {prof.total_ir // steps} instructions, {prof.total_i1 // steps} "
        f"L1 instruction-cache misses; against {base.total_ir // base_steps} and {base.total_i1 // base_steps}: "
        f"{prof.total_ir // steps - base.total_ir // base_steps:+d} instructions, "
        f"{prof.total_i1 // steps - base.total_i1 // base_steps:+d} misses",
        "",
        f"{'instr':>11} {'I1 miss':>9} {'base instr':>11} {'base miss':>9}  object",
    ]
    # Per step, by (object, function): instructions, misses, base's instructions, base's misses.
    costs: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0] * 4)
    for column, (counter, n) in enumerate(((prof.any_ir, steps), (prof.any_i1, steps),
                                           (base.any_ir, base_steps), (base.any_i1, base_steps))):
        for key, v in counter.items():
            costs[key][column] += v / n
    objects: dict[str, list[float]] = collections.defaultdict(lambda: [0.0] * 4)
    for (o, _), c in costs.items():
        objects[o] = [a + b for a, b in zip(objects[o], c)]
    for o, (ir, i1, bir, bi1) in sorted(objects.items(), key=lambda x: -(x[1][0] + x[1][2])):
        if ir + bir >= 1:
            out.append(f"{ir:11.0f} {i1:9.0f} {bir:11.0f} {bi1:9.0f}  {o}")
    diff = {k: (c[1] - c[3], c[0] - c[2]) for k, c in costs.items()}
    out += ["", "(the interpreter loop running when instrumentation started is named as callgrind "
                "guessed then, differently between runs: compare it by object)"]
    for title, index in (("by the difference in misses", 0), ("by the difference in instructions", 1)):
        out += ["", f"{'miss +/-':>9} {'instr +/-':>10}  object: function, {title}"]
        for (o, f), (dm, di) in sorted(diff.items(), key=lambda x: -x[1][index])[:top]:
            out.append(f"{dm:+9.0f} {di:+10.0f}  {o}: {_short(f, 80)}")
    return "\n".join(out + _compare_data(prof, steps, base, base_steps, top))


def _compare_data(prof: Profile, steps: int, base: Profile, base_steps: int, top: int) -> list[str]:
    """Data misses per object and last-level misses per function against
    `base`, per step, when both dumps simulated them."""
    def has(p: Profile, event: str) -> bool:
        return any(event in c for c in p.obj_events.values())

    if not (has(prof, "D1mr") and has(base, "D1mr")):
        return []
    ll = has(prof, "DLmr") and has(base, "DLmr")
    out = ["", "data misses per step (L1: D1mr + D1mw; last level: ILmr + DLmr + DLmw), against the base",
           f"{'L1 data':>9} {'base':>9} {'last lvl':>9} {'base':>9}  object"]
    rows = []
    for o in set(prof.obj_events) | set(base.obj_events):
        a, b = prof.obj_events.get(o, collections.Counter()), base.obj_events.get(o, collections.Counter())
        d1 = ((a["D1mr"] + a["D1mw"]) / steps, (b["D1mr"] + b["D1mw"]) / base_steps)
        last = (sum(a[e] for e in _LAST_LEVEL) / steps, sum(b[e] for e in _LAST_LEVEL) / base_steps)
        rows.append((o, d1, last))
    for o, d1, last in sorted(rows, key=lambda r: -(r[1][0] + r[1][1])):
        if d1[0] + d1[1] >= 1:
            out.append(f"{d1[0]:9.0f} {d1[1]:9.0f} {last[0]:9.0f} {last[1]:9.0f}  {o}")
    if ll:
        keys = set(prof.any_ll) | set(base.any_ll)
        diff = {k: prof.any_ll[k] / steps - base.any_ll[k] / base_steps for k in keys}
        out += ["", f"{'last +/-':>9}  object: function, by the difference in last-level misses"]
        for (o, f), d in sorted(diff.items(), key=lambda x: -x[1])[:top]:
            out.append(f"{d:+9.0f}  {o}: {_short(f, 80)}")
    return out


def _child(args: argparse.Namespace) -> None:
    """Runs under callgrind: warm up uninstrumented, then step on the
    parent's signals (files in `args.sync`)."""
    import gc

    from hybridcache_dev.step_bench import Lockstep, configs, record_stock

    sync = Path(args.sync)
    (cfg,) = configs(True, [args.running], [args.layout], args.warm + args.steps)
    run = Lockstep(cfg, [args.variant], record_stock(cfg) if args.variant == "floor" else None)
    # hc+native: install()'s native append_output_token_ids as install()
    # puts it, on vLLM's Request class (one variant a process), not bound
    # per request as the in-process bench does; or none at all.
    run.token_append = None
    if args.variant == "hc+native" and not args.no_token_append:
        from hybridcache.vllm_tokens import install_token_append

        install_token_append()
    for i in range(cfg.warmup):
        run.step(i)
    gc.collect()
    gc.disable()

    def handshake(mine: str, theirs: str) -> None:
        (sync / mine).write_text(str(os.getpid()))
        while not (sync / theirs).exists():
            time.sleep(0.1)

    handshake("ready", "instrumented")
    for i in range(cfg.warmup, cfg.warmup + args.warm):
        run.step(i)
    handshake("warm", "zeroed")
    for i in range(cfg.warmup + args.warm, cfg.warmup + args.warm + args.steps):
        run.step(i)
    handshake("done", "dumped")


def _measure(args: argparse.Namespace) -> Path:
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            sys.exit(f"step_callgrind: {tool} not found (install valgrind)")
    sync = Path(tempfile.mkdtemp(prefix="step-callgrind-"))
    out = Path(args.out or sync / "callgrind.out")
    # By default valgrind takes the last level from the host's L3; `--l2`
    # makes it the L2 instead, so misses there (served by L3 or memory,
    # tens of ns each) show up.
    last_level = [f"--LL={args.l2 * 1024},16,64"] if args.l2 else []
    cmd = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", "--cache-sim=yes", *last_level,
        f"--callgrind-out-file={out}", sys.executable, __file__, "--child",
        "--sync", str(sync), "--running", str(args.running), "--layout", args.layout,
        "--steps", str(args.steps), "--warm", str(args.warm), "--variant", args.variant,
    ] + (["--no-token-append"] if args.no_token_append else [])
    # A fixed hash seed: str hashes (dict probes, set orders) otherwise
    # change every run, and with them tens of thousands of the
    # interpreter's instructions a step.
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", PYTHONHASHSEED="0")
    log = open(sync / "child.log", "w")
    child = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait_for(name: str) -> None:
        while not (sync / name).exists():
            if child.poll() is not None:
                sys.exit(f"step_callgrind: the run ended early, see {sync / 'child.log'}")
            time.sleep(0.2)

    def control(*flags: str) -> None:
        pid = (sync / "ready").read_text()
        subprocess.run(["callgrind_control", *flags, pid], check=True, capture_output=True)

    wait_for("ready")
    control("-i", "on")
    (sync / "instrumented").touch()
    wait_for("warm")
    control("-z")
    (sync / "zeroed").touch()
    wait_for("done")
    control("-d")
    time.sleep(1)
    (sync / "dumped").touch()
    child.wait()
    dumps = sorted(out.parent.glob(out.name + ".*"))
    if not dumps:
        sys.exit(f"step_callgrind: no dump written, see {sync / 'child.log'}")
    return dumps[0]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--running", type=int, default=256)
    p.add_argument("--layout", default="full+3xmamba-align")
    p.add_argument("--steps", type=int, default=10, help="measured steps")
    p.add_argument("--warm", type=int, default=4, help="instrumented steps before the counters are zeroed")
    p.add_argument("--out", help="callgrind output file (default: a temporary folder)")
    p.add_argument("--report", help="report on this dump instead of measuring")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--callers", help="also list the calls made by functions whose name contains this")
    p.add_argument("--against", help="compare the whole process with this dump (another variant's)")
    p.add_argument("--against-steps", type=int, help="measured steps of the --against dump (default: --steps)")
    p.add_argument("--variant", default="hybridcache", choices=("hybridcache", "hc+native", "floor", "stock"),
                   help="the step bench's scheduler to run (hc+native: with install()'s native token append)")
    p.add_argument("--l2", type=int, metavar="KIB",
                   help="simulate a last level of KIB KiB, 16-way (this machine's L2 is 1024), not the host's L3")
    p.add_argument("--no-token-append", action="store_true",
                   help="hc+native: vLLM's own Request.append_output_token_ids")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sync", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return _child(args)
    dump = Path(args.report) if args.report else _measure(args)
    print(f"{dump}: {args.steps} steps, {args.layout}, {args.running} running, {args.variant}"
          + (" without the native token append" if args.no_token_append else ""))
    prof = parse(dump)
    if args.against:
        print(compare(prof, args.steps, parse(args.against), args.against_steps or args.steps, args.top))
    else:
        print(report(prof, args.steps, args.top, args.callers))


if __name__ == "__main__":
    main()
