"""The callgrind reader of benchmarks/step_callgrind.py, on a small dump in
callgrind's compressed format (names given once as `(id) name`, then as
`(id)`; positions absolute, relative or `*`; a call's inclusive cost on the
line after `calls=`)."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("step_callgrind", ROOT / "benchmarks/step_callgrind.py")
step_callgrind = importlib.util.module_from_spec(spec)
sys.modules["step_callgrind"] = step_callgrind  # dataclasses look their module up there
spec.loader.exec_module(step_callgrind)

HEADER = """# callgrind format
version: 1
positions: instr line
events: Ir Dr Dw I1mr D1mr
"""

DUMP = HEADER + """
ob=(1) /usr/lib/libpython3.11.so
fl=(1) ceval.c
fn=(1) _PyEval_EvalFrameDefault
0x1000 5 50 0 0 9
+4 * 1

ob=(2) /site/hybridcache/_native.abi3.so
fl=(2) allocate_call.rs
fn=(2) allocate_slots_fast
0x2000 10 3 1 0 1 0
+8 12 2 0 0 0 1
cob=(1)
cfi=(1)
cfn=(3) PyObject_GetAttr
calls=2 0x3000 0
* * 40 9 0 2
cob=(2)
cfn=(4) general
calls=1 0x4000 0
+2 13 100 20 5 7
-6 * 1
fn=(4)
0x4000 7 60 5 0 3
fn=(2)
0x2010 1 2
"""


def test_self_costs_count_only_the_object_and_skip_call_lines(tmp_path):
    path = tmp_path / "callgrind.out.1"
    path.write_text(DUMP)
    prof = step_callgrind.parse(path)
    # allocate_slots_fast's own lines: 3 + 2 + 1 + 2 instructions; the
    # inclusive lines after `calls=` (40, 100) are its callees'.
    assert prof.ir["allocate_slots_fast"] == 8
    assert prof.i1_misses["allocate_slots_fast"] == 1
    assert (prof.ir["general"], prof.i1_misses["general"]) == (60, 3)
    # Code of other objects is left out of the functions, counted in the totals.
    assert "_PyEval_EvalFrameDefault" not in prof.ir
    assert (prof.total_ir, prof.total_i1) == (51 + 68, 9 + 4)
    # Call edges: inclusive cost and count, whichever object the callee is in.
    edge = ("allocate_slots_fast", "PyObject_GetAttr")
    assert (prof.edge_ir[edge], prof.edge_i1[edge], prof.edge_calls[edge]) == (40, 2, 2)
    edge = ("allocate_slots_fast", "general")
    assert (prof.edge_ir[edge], prof.edge_i1[edge], prof.edge_calls[edge]) == (100, 7, 1)


def test_report_is_per_step(tmp_path):
    path = tmp_path / "callgrind.out.1"
    path.write_text(DUMP)
    text = step_callgrind.report(step_callgrind.parse(path), steps=2, callers="allocate_slots_fast")
    assert "whole process, per step: 59 instructions, 6 L1 instruction-cache misses" in text
    assert "_native.abi3.so, per step: 34 instructions, 2 L1 instruction-cache misses" in text
    assert "calls made by allocate_slots_fast (self 4):" in text
    assert "       50       3 x    0.5  general" in text
    assert "       20       1 x    1.0  PyObject_GetAttr" in text


BASE = HEADER + """
ob=(1) /usr/lib/libpython3.11.so
fl=(1) ceval.c
fn=(1) _PyEval_EvalFrameDefault
0x1000 5 30 0 0 4
"""


def test_compare_counts_every_object_against_the_base(tmp_path):
    """--against: the whole process and each object's functions, per step,
    against another run's dump (the interpreter's own misses included)."""
    run, base = tmp_path / "run.out.1", tmp_path / "base.out.1"
    run.write_text(DUMP)
    base.write_text(BASE)
    prof = step_callgrind.parse(run)
    assert prof.any_ir[("libpython3.11.so", "_PyEval_EvalFrameDefault")] == 51
    assert prof.any_i1[("_native.abi3.so", "general")] == 3
    text = step_callgrind.compare(prof, 1, step_callgrind.parse(base), 1)
    assert "against 30 and 4: +89 instructions, +9 misses" in text
    # The interpreter missed 9 lines here against 4 in the base.
    assert "       +5        +21  libpython3.11.so: _PyEval_EvalFrameDefault" in text
    assert "       +3        +60  _native.abi3.so: general" in text
    lines = text.splitlines()
    objects = lines[lines.index(next(x for x in lines if x.endswith("  object"))) + 1:][:2]
    # Most instructions in both runs first.
    assert objects[0].split() == ["51", "9", "30", "4", "libpython3.11.so"]
    assert objects[1].split() == ["68", "4", "0", "0", "_native.abi3.so"]


LL_HEADER = """# callgrind format
version: 1
positions: instr line
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
"""

LL_RUN = LL_HEADER + """
ob=(1) /usr/lib/libpython3.11.so
fl=(1) ceval.c
fn=(1) _PyEval_EvalFrameDefault
0x1000 5 50 10 2 6 4 3 1 3 2
ob=(2) /site/hybridcache/_native.abi3.so
fl=(2) allocate_call.rs
fn=(2) general
0x2000 10 30 4 1 5 5 2 0 4 1
"""

LL_BASE = LL_HEADER + """
ob=(1) /usr/lib/libpython3.11.so
fl=(1) ceval.c
fn=(1) _PyEval_EvalFrameDefault
0x1000 5 40 8 1 4 3 1 0 1 0
"""


def test_compare_adds_data_and_last_level_misses_where_simulated(tmp_path):
    """--l2 runs: L1 data misses per object, and the last level's (code and
    data) per object and per function, against the base."""
    run, base = tmp_path / "run.out.1", tmp_path / "base.out.1"
    run.write_text(LL_RUN)
    base.write_text(LL_BASE)
    prof = step_callgrind.parse(run)
    assert prof.obj_events["_native.abi3.so"]["DLmr"] == 4
    assert prof.any_ll[("libpython3.11.so", "_PyEval_EvalFrameDefault")] == 1 + 3 + 2
    text = step_callgrind.compare(prof, 1, step_callgrind.parse(base), 1)
    lines = text.splitlines()
    at = lines.index(next(x for x in lines if x.startswith("data misses per step")))
    # L1 data (D1mr + D1mw), base's, last level (ILmr + DLmr + DLmw), base's.
    assert lines[at + 2].split() == ["7", "4", "6", "1", "libpython3.11.so"]
    assert lines[at + 3].split() == ["7", "0", "5", "0", "_native.abi3.so"]
    assert "       +5  libpython3.11.so: _PyEval_EvalFrameDefault" in text
    assert "       +5  _native.abi3.so: general" in text
    # Dumps without data misses (the I1-only HEADER above) add nothing.
    plain = tmp_path / "plain.out.1"
    plain.write_text(BASE)
    assert "data misses" not in step_callgrind.compare(step_callgrind.parse(plain), 1,
                                                       step_callgrind.parse(plain), 1)
