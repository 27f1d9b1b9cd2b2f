"""No import circles: the modules of a source tree, joined by what each one
names of the others, form a DAG.

For Rust (the binding crate, rust/python/src) a module's edges are the paths
it writes: `crate::a::b`, `super::x`, `self::x` and a bare `child::` of a
submodule it declares; `mod x;` declares a module and is not an edge. An
edge goes to the longest module path named. For Python packages an edge is an
`import` or `from ... import` of a module in the same tree.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_RUST_PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
_RUST_MOD = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", re.M)
_RUST_COMMENT = re.compile(r"//[^\n]*")


def rust_module_name(src: Path, file: Path) -> tuple[str, ...]:
    """`lib.rs` -> (); `a.rs` and `a/mod.rs` -> ("a",); `a/b.rs` -> ("a", "b")."""
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts.pop()
    return tuple(parts)


def rust_graph(src: Path) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    """Each module of the crate rooted at `src` -> the modules its code names."""
    texts = {rust_module_name(src, f): _RUST_COMMENT.sub("", f.read_text()) for f in src.rglob("*.rs")}
    modules = set(texts)

    def resolve(path: tuple[str, ...]) -> tuple[str, ...]:
        while path and path not in modules:
            path = path[:-1]
        return path

    graph: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for module, text in texts.items():
        edges: set[tuple[str, ...]] = set()
        for base, rest in _RUST_PATH.findall(text):
            names = tuple(rest.split("::")[1:])
            start = {"crate": (), "super": module[:-1], "self": module}[base]
            while names and names[0] == "super":
                start, names = start[:-1], names[1:]
            edges.add(resolve(start + names))
        for child in _RUST_MOD.findall(text):
            if re.search(rf"(?<![:\w]){child}::", text):
                edges.add(module + (child,))
        edges.discard(module)
        graph[module] = edges
    return graph


def python_graph(package: Path) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    """Each module of the package at `package` -> the package's modules it imports."""
    top = package.parent
    files = {f: tuple(f.relative_to(top).with_suffix("").parts) for f in package.rglob("*.py")}
    names = {(n[:-1] if n[-1] == "__init__" else n) for n in files.values()}

    def resolve(path: tuple[str, ...]) -> tuple[str, ...] | None:
        while path and path not in names:
            path = path[:-1]
        return path or None

    graph: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for f, name in files.items():
        is_pkg = name[-1] == "__init__"
        module = name[:-1] if is_pkg else name
        edges: set[tuple[str, ...]] = set()
        for node in ast.walk(ast.parse(f.read_text())):
            targets: list[tuple[str, ...]] = []
            if isinstance(node, ast.Import):
                targets = [tuple(a.name.split(".")) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = module if is_pkg else module[:-1]
                if node.level:
                    base = base[: len(base) - (node.level - 1)]
                else:
                    base = ()
                origin = base + tuple((node.module or "").split(".") if node.module else ())
                targets = [origin + (a.name,) for a in node.names] + [origin]
            for t in targets:
                r = resolve(t)
                if r is not None and r != module:
                    edges.add(r)
        graph[module] = edges
    return graph


def find_cycle(graph: dict[tuple[str, ...], set[tuple[str, ...]]]) -> list[tuple[str, ...]] | None:
    """A cycle of `graph` as its modules in order, or None."""
    state: dict[tuple[str, ...], int] = {}
    stack: list[tuple[str, ...]] = []

    def visit(node: tuple[str, ...]) -> list[tuple[str, ...]] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _show(cycle: list[tuple[str, ...]], sep: str) -> str:
    return " -> ".join(sep.join(m) or "<root>" for m in cycle)


def test_the_finder_sees_a_cycle() -> None:
    assert find_cycle({("a",): {("b",)}, ("b",): {("c",)}, ("c",): {("a",)}}) == [("a",), ("b",), ("c",), ("a",)]
    assert find_cycle({("a",): {("b",)}, ("b",): set(), ("c",): {("a",), ("b",)}}) is None


def test_rust_paths_make_edges(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "ffi").mkdir(parents=True)
    (src / "lib.rs").write_text("mod a;\nmod ffi;\n// crate::b is a comment\nfn init() { ffi::register(); }\n")
    (src / "a.rs").write_text("use crate::ffi::calls::{x, y};\n")
    (src / "ffi" / "mod.rs").write_text("pub(crate) mod calls;\npub fn register() { calls::install(); }\n")
    (src / "ffi" / "calls.rs").write_text("use super::super::a::thing;\n")
    graph = rust_graph(src)
    assert graph[()] == {("ffi",)}
    assert graph[("a",)] == {("ffi", "calls")}
    assert graph[("ffi",)] == {("ffi", "calls")}
    assert graph[("ffi", "calls")] == {("a",)}
    assert set(find_cycle(graph) or ()) == {("a",), ("ffi", "calls")}


def test_binding_has_no_import_circle() -> None:
    graph = rust_graph(ROOT / "rust" / "python" / "src")
    assert len(graph) > 10
    cycle = find_cycle(graph)
    assert cycle is None, f"import circle in the binding: {_show(cycle, '::')}"


def test_python_imports_make_edges(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("import os\nfrom pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from ..a import f\n")
    graph = python_graph(pkg)
    assert graph[("pkg",)] == {("pkg", "a")}
    assert graph[("pkg", "a")] == {("pkg", "sub"), ("pkg", "sub", "b")}
    assert graph[("pkg", "sub", "b")] == {("pkg", "a")}
    assert find_cycle(graph) == [("pkg", "a"), ("pkg", "sub", "b"), ("pkg", "a")]
