"""benchmarks/step_specialization.py: its snapshot sees CPython's specialized
instructions, and its diff lists what one variant left adaptive."""

import importlib.util
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("step_specialization", ROOT / "benchmarks/step_specialization.py")
step_specialization = importlib.util.module_from_spec(spec)
spec.loader.exec_module(step_specialization)

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="specialization is CPython 3.11's")

SOURCE = '''
class Shadowed:
    def __init__(self):
        self.method = len  # an instance attribute in the method's place

    def method(self, x):
        return x


class Plain:
    def method(self, x):
        return x


def call(obj, x):
    return obj.method(x)
'''


def _module(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    exec(compile(SOURCE, f"<{name}>", "exec"), mod.__dict__)
    for cls in (mod.Shadowed, mod.Plain):
        cls.__module__ = name
    mod.call.__module__ = name
    return mod


def test_a_method_shadowed_by_an_instance_attribute_is_listed() -> None:
    plain, shadowed = _module("specmod_plain"), _module("specmod_shadowed")
    try:
        for _ in range(300):
            plain.call(plain.Plain(), [1])
            shadowed.call(shadowed.Shadowed(), [1])
        ref = step_specialization.snapshot(("specmod_plain",))
        mine = step_specialization.snapshot(("specmod_shadowed",))
        # The same code under both names: compare by function and offset.
        mine = {k.replace("specmod_shadowed", "specmod_plain"): v for k, v in mine.items()}
        rows = step_specialization.unspecialized(ref, mine)
        assert [(key.split(":")[0], arg) for key, _, _, arg, _ in rows] == [("specmod_plain.call", "method")]
        (_, ours, theirs, _, line), = rows
        assert "METHOD" in ours and theirs.endswith("_ADAPTIVE") and line == 16
    finally:
        del sys.modules["specmod_plain"], sys.modules["specmod_shadowed"]


def test_instructions_neither_specialized_are_not_listed() -> None:
    ref = {"f:0": ("LOAD_ATTR_ADAPTIVE", "x", 1), "f:2": ("LOAD_ATTR", "y", 1), "f:4": ("LOAD_ATTR_SLOT", "z", 2)}
    mine = {"f:0": ("LOAD_ATTR_ADAPTIVE", "x", 1), "f:2": ("LOAD_ATTR_ADAPTIVE", "y", 1),
            "f:4": ("LOAD_ATTR_ADAPTIVE", "z", 2)}
    assert step_specialization.unspecialized(ref, mine) == [("f:4", "LOAD_ATTR_SLOT", "LOAD_ATTR_ADAPTIVE", "z", 2)]


def test_only_instructions_steady_over_the_snapshots_count() -> None:
    a = {"f:0": ("LOAD_METHOD_WITH_DICT", "m", 3), "f:2": ("LOAD_ATTR_SLOT", "x", 4)}
    b = {"f:0": ("LOAD_METHOD_ADAPTIVE", "m", 3), "f:2": ("LOAD_ATTR_SLOT", "x", 4)}
    assert step_specialization.steady([a, b, a]) == {"f:2": ("LOAD_ATTR_SLOT", "x", 4)}
    assert step_specialization.steady([a]) == a
