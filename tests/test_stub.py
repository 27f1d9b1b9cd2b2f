"""The typing stub `hybridcache/_native.pyi` matches the compiled module."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy.stubtest", reason="mypy is not installed")

ROOT = Path(__file__).resolve().parents[1]
STUB = ROOT / "python" / "hybridcache" / "_native.pyi"
ALLOWLIST = ROOT / "tests" / "stubtest_allowlist.txt"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=600, cwd=ROOT
    )


def test_stub_exists_next_to_native_module() -> None:
    import hybridcache._native as native

    assert STUB.is_file()
    # Type checkers find the stub only beside the module they import.
    assert (Path(native.__file__).resolve().parent / "_native.pyi").is_file()


def test_stubtest_passes() -> None:
    args = ["mypy.stubtest", "hybridcache._native"]
    if ALLOWLIST.is_file():
        args += ["--allowlist", str(ALLOWLIST)]
    r = _run(*args)
    assert r.returncode == 0, r.stdout + r.stderr


def test_stub_is_strictly_typed() -> None:
    # The stub alone: the facade modules mypy reaches through the package
    # are not what this test is about.
    r = _run("mypy", "--strict", "--no-incremental", "--follow-imports=silent", str(STUB))
    assert r.returncode == 0, r.stdout + r.stderr


def test_constructor_parameters_match() -> None:
    """stubtest cannot see the constructor's parameters (pyo3 exposes
    `__new__(*args, **kwargs)`), so compare the stub's `__new__` with the
    class's text signature."""
    from hybridcache._native import NativeManager

    runtime = list(inspect.signature(NativeManager).parameters)
    tree = ast.parse(STUB.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "NativeManager")
    new = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__new__")
    stub = [a.arg for a in new.args.args[1:]]
    assert stub == runtime
    assert not new.args.defaults and not new.args.kwonlyargs  # all required, as in lib.rs


def test_group_record_fields_match_the_facade() -> None:
    """The stub's `_GroupArg` protocol names exactly the fields of the record
    the facade sends per group (`NativeGroup`), and the core accepts it."""
    import dataclasses

    from hybridcache import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from hybridcache.config import NativeGroup, read_groups

    tree = ast.parse(STUB.read_text())
    proto = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_GroupArg")
    stub_fields = [f.name for f in proto.body if isinstance(f, ast.FunctionDef)]
    assert stub_fields == [f.name for f in dataclasses.fields(NativeGroup)]
    cfg = KVCacheConfig(4, [], [KVCacheGroupSpec(["l"], FullAttentionSpec(block_size=4))])
    (group,) = read_groups(cfg, 64, 64)
    assert isinstance(group.native, NativeGroup) and group.native.kind == "full_attention"
