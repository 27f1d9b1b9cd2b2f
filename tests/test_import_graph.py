"""The package's import graph has no circle: every module of
python/hybridcache (and of the development package, dev/) is read from the
source tree, and its module-level imports of the package's own modules
(not those under `if TYPE_CHECKING:`, nor imports inside functions, which
run after every module has loaded) must form a DAG. A release's folder may
import the shared modules and the table, never another release's folder."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"hybridcache": ROOT / "python" / "hybridcache", "hybridcache_dev": ROOT / "dev" / "hybridcache_dev"}


def _module_name(package: str, base: Path, path: Path) -> str:
    parts = [package, *path.relative_to(base).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(tree: ast.Module, name: str, is_package: bool) -> set[str]:
    """Absolute names of the modules imported at module level."""
    out: set[str] = set()
    own = name if is_package else name.rpartition(".")[0]

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = own.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                out.add(mod)
                out.update(f"{mod}.{a.name}" for a in node.names)

    visit(tree.body)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports at module level."""
    files = {}
    for package, base in PACKAGES.items():
        for path in sorted(base.rglob("*.py")):
            files[_module_name(package, base, path)] = path
    graph = {}
    for name, path in files.items():
        imported = _top_level_imports(ast.parse(path.read_text()), name, path.name == "__init__.py")
        # A module's own parent packages are loaded before it (not a circle).
        graph[name] = {m for m in imported if m in files and m != name and not name.startswith(m + ".")}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            # Importing a package runs its __init__ first: `a.b` depends on `a` too,
            # but a package's own submodules are not a circle with it.
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = dfs(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def test_no_import_circle() -> None:
    graph = import_graph()
    assert len(graph) > 40
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_checker_finds_a_planted_circle() -> None:
    graph = import_graph()
    graph["hybridcache.facade"] = graph["hybridcache.facade"] | {"hybridcache.releases.v0_33.manager"}
    assert _cycle(graph) is not None


def test_a_release_folder_imports_no_other_release() -> None:
    graph = import_graph()
    folders = {m.split(".")[2] for m in graph if m.startswith("hybridcache.releases.v")}
    assert folders >= {"v0_23", "v0_33", "v0_34"}
    for module, imported in graph.items():
        if module.startswith("hybridcache.releases.v"):
            own = module.split(".")[2]
            others = [m for m in imported if m.startswith("hybridcache.releases.v") and m.split(".")[2] != own]
            assert not others, f"{module} imports {others}"
    # The shared modules import no release folder at module level.
    for module, imported in graph.items():
        if not module.startswith(("hybridcache.releases", "hybridcache_dev")) and module != "hybridcache":
            bad = [m for m in imported if m.startswith("hybridcache.releases.v")]
            if module.startswith("hybridcache.tools"):
                continue
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
    graph = import_graph()
    # The plain manager (the oldest release's API) and every later release's facade.
    managers = ["hybridcache.manager"] + [m for m in graph if m.startswith("hybridcache.releases.v")
                                          and m.endswith(".manager")]
    assert len(managers) >= 3
    for m in managers:
        assert _reaches(graph, m, "hybridcache.facade"), m
    assert not any(m.startswith("hybridcache.releases.v") for m in graph["hybridcache.facade"])
