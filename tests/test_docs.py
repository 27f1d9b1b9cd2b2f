"""Every public class, function and method of the facade says what it does
(arguments, returns, errors where it has them), and so does every public
method of the native classes in the typing stub, which IDEs show."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "python" / "hybridcache"
# The command-line tools' modules are documented by their --help.
TOOLS = {"replay.py", "bench.py", "bench_report.py"}
# The package's modules and every release's folder (tools/ and kernels/ aside).
MODULES = sorted([p for p in PKG.glob("*.py") if p.name not in TOOLS] + list((PKG / "releases").rglob("*.py")))
MIN_LEN = 20


def _public_defs(tree: ast.Module):
    """(qualified name, node, docstring of the enclosing class) of public
    classes, functions and methods, private classes' members left out."""

    def walk(body, prefix, class_doc):
        for n in body:
            if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            special = n.name in ("__init__", "__new__", "__call__")
            if n.name.startswith("_") and not special:
                continue
            if any(isinstance(d, ast.Name) and d.id == "overload" for d in getattr(n, "decorator_list", [])):
                continue  # documented on the last overload / the implementation
            yield prefix + n.name, n, class_doc
            if isinstance(n, ast.ClassDef):
                yield from walk(n.body, prefix + n.name + ".", ast.get_docstring(n))

    yield from walk(tree.body, "", None)


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PKG)) for p in MODULES])
def test_facade_is_documented(path: Path) -> None:
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree), f"{path.name}: no module docstring"
    missing = []
    for name, node, class_doc in _public_defs(tree):
        doc = ast.get_docstring(node) or ""
        if node.name in ("__init__", "__new__") and class_doc and len(class_doc) >= 200:
            continue  # the arguments are in the class docstring
        if len(doc) < MIN_LEN:
            missing.append(f"{name} (line {node.lineno})")
    assert not missing, f"{path.name}: undocumented: {missing}"


def test_stub_native_methods_are_documented() -> None:
    tree = ast.parse((PKG / "_native.pyi").read_text())
    missing = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")):
        assert ast.get_docstring(cls), cls.name
        documented: dict[str, bool] = {}
        for f in cls.body:
            if isinstance(f, ast.FunctionDef) and not f.name.startswith("_"):
                documented[f.name] = documented.get(f.name, False) or len(ast.get_docstring(f) or "") >= MIN_LEN
        missing += [f"{cls.name}.{name}" for name, ok in documented.items() if not ok]
    assert not missing, f"_native.pyi: undocumented: {missing}"


def test_key_docs_state_the_contract() -> None:
    """The docstrings a newcomer reads first say what the issue asked them to."""
    import hybridcache

    assert "KVCacheBlocks | None" in (hybridcache.KVCacheManager.__doc__ or "")
    stub = (PKG / "_native.pyi").read_text()
    alloc = stub[stub.index("def allocate_slots(") : stub.index("def _raw_methods")]
    assert ") -> KVCacheBlocks | None:" in alloc
    for word in ("Args:", "Returns:", "Raises:", "allow_none=True", "preempt"):
        assert word in alloc, word
    for cls in (hybridcache.KVCacheConfig, hybridcache.KVCacheGroupSpec, hybridcache.SlidingWindowSpec,
                hybridcache.FullAttentionSpec, hybridcache.MambaSpec, hybridcache.Request):
        assert "Args:" in (cls.__doc__ or ""), cls.__name__
