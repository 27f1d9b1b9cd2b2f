"""No import circles: the modules of a source tree, joined by what each one
names of the others, form a DAG.

For Rust (the binding crate, rust/python/src) a module's edges are the paths
it writes: `crate::a::b`, `super::x`, `self::x` and a bare `child::` of a
submodule it declares; `mod x;` declares a module and is not an edge. An
edge goes to the longest module path named. For Python (python/hybridcache
and the development package, dev/) an edge is a module-level `import` or
`from ... import` of a module of the tree (not those under `if
TYPE_CHECKING:`, nor imports inside functions, which run after every module
has loaded; a module's own parent packages load before it, not a circle).
A release's folder may import the shared modules and the table, never
another release's folder.
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


PACKAGES = (ROOT / "python" / "hybridcache", ROOT / "dev" / "hybridcache_dev")


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                out.append(node)

    visit(tree.body)
    return out


def python_graph(*packages: Path) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    """Each module of the packages at `packages` -> the modules of the tree it imports at module level."""
    files = {f: tuple(f.relative_to(package.parent).with_suffix("").parts)
             for package in packages for f in package.rglob("*.py")}
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
        for node in _module_level_imports(ast.parse(f.read_text())):
            targets: list[tuple[str, ...]] = []
            if isinstance(node, ast.Import):
                targets = [tuple(a.name.split(".")) for a in node.names]
            else:
                base = module if is_pkg else module[:-1]
                base = base[: len(base) - (node.level - 1)] if node.level else ()
                origin = base + (tuple(node.module.split(".")) if node.module else ())
                targets = [origin + (a.name,) for a in node.names] + [origin]
            for t in targets:
                r = resolve(t)
                if r is not None and r != module and module[:len(r)] != r:
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


def _dotted(graph: dict[tuple[str, ...], set[tuple[str, ...]]]) -> dict[str, set[str]]:
    return {".".join(m): {".".join(e) for e in edges} for m, edges in graph.items()}


def test_python_packages_have_no_import_circle() -> None:
    graph = python_graph(*PACKAGES)
    assert len(graph) > 40
    cycle = find_cycle(graph)
    assert cycle is None, f"import circle: {_show(cycle, '.')}"


def test_the_checker_finds_a_planted_circle() -> None:
    graph = python_graph(*PACKAGES)
    graph[("hybridcache", "facade")].add(("hybridcache", "releases", "v0_33", "manager"))
    assert find_cycle(graph) is not None


def test_a_release_folder_imports_no_other_release() -> None:
    graph = _dotted(python_graph(*PACKAGES))
    folders = {m.split(".")[2] for m in graph if m.startswith("hybridcache.releases.v")}
    assert folders >= {"v0_23", "v0_33", "v0_34"}
    for module, imported in graph.items():
        if module.startswith("hybridcache.releases.v"):
            own = module.split(".")[2]
            others = [m for m in imported if m.startswith("hybridcache.releases.v") and m.split(".")[2] != own]
            assert not others, f"{module} imports {others}"
    # The shared modules import no release folder at module level.
    for module, imported in graph.items():
        if not module.startswith(("hybridcache.releases", "hybridcache.tools", "hybridcache_dev")) \
                and module != "hybridcache":
            bad = [m for m in imported if m.startswith("hybridcache.releases.v")]
            assert not bad, f"{module} imports {bad}"


def _reaches(graph: dict[str, set[str]], start: str, target: str) -> bool:
    seen, stack = set(), [start]
    while stack:
        m = stack.pop()
        if m == target:
            return True
        if m not in seen:
            seen.add(m)
            stack.extend(graph.get(m, ()))
    return False


def test_the_facades_build_on_the_shared_base() -> None:
    graph = _dotted(python_graph(*PACKAGES))
    # The plain manager (the oldest release's API) and every later release's facade.
    managers = ["hybridcache.manager"] + [m for m in graph if m.startswith("hybridcache.releases.v")
                                          and m.endswith(".manager")]
    assert len(managers) >= 3
    for m in managers:
        assert _reaches(graph, m, "hybridcache.facade"), m
    assert not any(m.startswith("hybridcache.releases.v") for m in graph["hybridcache.facade"])
