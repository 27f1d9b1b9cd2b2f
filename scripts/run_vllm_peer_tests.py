#!/usr/bin/env python3
"""Runs vLLM's own tests (files of tests/v1/core and beyond, each release's
list in scripts/vllm_tests/vllm-VERSION.sha256) with every `KVCacheManager`
they construct being hybridcache's facade for that release
(the `facade` of its row in `hybridcache.releases`).

Fetch the tests first: `bash scripts/fetch_vllm_tests.sh VERSION` (into
.cache/vllm-tests/VERSION). The release is the installed vLLM's (or
--release); its files are listed in scripts/vllm_tests/vllm-VERSION.sha256
and its tables (below) are in scripts/vllm_tests/peer_MAJOR_MINOR_PATCH.py.

How the swap is done: a pytest plugin (this file) rebinds the name
`KVCacheManager` in each collected test module to a function that records the
construction and returns the release's facade, and binds
`vllm.v1.core.kv_cache_manager.KVCacheManager` (and, where the release's table
says SWAP_SCHEDULER, the scheduler module's name) to it. The test files
themselves run unmodified, from the cache folder, with the release's ENV
(its peer table's ENV, e.g. VLLM_TARGET_DEVICE=cpu) and HF_HUB_OFFLINE=1; the model configs the
tests name (HF_MODELS) are put into a local Hugging Face cache,
.cache/vllm-tests/hf-home, from the hand-written scripts/vllm_tests/hf/.
The pytest plugin tests/vllm_cpu_triton.py is loaded too: where vLLM's CPU
platform refuses to build a VllmConfig on x86 without triton-cpu, it
lets that one check pass; elsewhere it does nothing.

Many cases test vLLM internals rather than the manager's public API. Those
that only READ internals (`block_pool.get_cached_block`,
`len(block_pool.cached_block_hash_to_block)`, `block_pool.kv_event_queue`, the
free list's `fake_free_list_head/tail` links,
`coordinator.single_type_managers[g].req_to_blocks`) are served by hybridcache's
read-only compatibility views; they are listed in VIEWS and must pass. Cases
that construct vLLM's `BlockPool` / `BlockHashToBlockMap` / `KVCacheBlock`
directly, or MUTATE the manager's internals (pop/restore prefix-map entries,
`get_new_blocks` / `cache_full_blocks`, append to `kv_event_queue`) are listed
in INTERNALS with the reason and the attributes (from reading each test).
Such a case counts as expected when it fails with an AttributeError on one of
its listed attributes (or the NotImplementedError of a documented-unsupported
feature, NOT_IMPLEMENTED); failing any other way, e.g. an assertion on public
data before the internal access, counts as a divergence. Every other case uses
only the public manager API and must pass. Cases that hand the manager a state
only vLLM's internals make (BAD_INPUT, e.g. free blocks passed in as a cache
hit) count as expected when hybridcache refuses it with the listed
ValueError. Cases of features hybridcache
documents as not implemented (UNSUPPORTED) are reported but only counted with
--strict. Cases that cannot run on a CPU machine offline even under vLLM
itself (OFFLINE: a model config that is not in the local cache, a platform
limit) are reported, not counted.

Prints a table and writes it to .cache/vllm-peer-report-VERSION.txt. Exit code
0 iff there is no divergence, 1 otherwise, 2 if the suite could not run.
`--against-vllm` runs the same files against vLLM's own manager as a baseline
(per-file counts; every case not listed OFFLINE must pass).

Usage: python scripts/run_vllm_peer_tests.py [--release VERSION] [--tests-dir DIR]
       [--report FILE] [-k EXPR] [--file NAME] [--strict] [--against-vllm] [-v]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import re
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
# tests/vllm_cpu_triton.py, loaded with -p (its folder goes on sys.path).
TRITON_SHIM = "vllm_cpu_triton"
TESTS_ROOT = ROOT / ".cache" / "vllm-tests"
RELEASE_DIR = ROOT / "scripts" / "vllm_tests"


def release_tables(version: str) -> ModuleType:
    """scripts/vllm_tests/peer_MAJOR_MINOR_PATCH.py: the release's ENV,
    HF_MODELS, SWAP_SCHEDULER and case tables."""
    path = RELEASE_DIR / f"peer_{version.replace('.', '_')}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no peer-suite tables for vLLM {version} ({path})")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.OFFLINE = getattr(mod, "OFFLINE", {})
    return mod


def release_test_files(version: str) -> list[Path]:
    """The release's test files (relative paths), from its manifest."""
    manifest = RELEASE_DIR / f"vllm-{version}.sha256"
    paths = [line.split()[1] for line in manifest.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    return [Path(p) for p in paths if Path(p).name.startswith("test_")]


def install_hf_models(models: tuple[str, ...], home: Path) -> None:
    """A Hugging Face cache under `home` holding the hand-written config.json
    of each model (scripts/vllm_tests/hf/ORG/NAME/), as the hub lays it out,
    so that HF_HUB_OFFLINE=1 resolves the model names."""
    for model in models:
        src = RELEASE_DIR / "hf" / model / "config.json"
        data = src.read_bytes()
        revision = hashlib.sha1(data).hexdigest()  # any 40-hex name; the ref points at it
        repo = home / "hub" / ("models--" + model.replace("/", "--"))
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
        snapshot = repo / "snapshots" / revision
        snapshot.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, snapshot / "config.json")


def _lookup(table: dict, nodeid: str):
    """A table entry by `FILE_STEM::function` or by function name."""
    func = _func_name(nodeid)
    stem = Path(nodeid.split("::", 1)[0]).stem
    return table.get(f"{stem}::{func}", table.get(func))


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class _Recorder:
    """pytest plugin: swaps the manager class and records per-case outcomes."""

    def __init__(self, facade: type | None, swap_scheduler: bool) -> None:
        self.facade = facade  # None: run against vLLM's own manager
        self.swap = facade is not None
        self.swap_scheduler = swap_scheduler
        self.results: dict[str, dict] = {}
        self.built_hybrid: set[str] = set()
        self._current: str | None = None
        self.order: list[str] = []

    # -- the swap --------------------------------------------------------

    def _make_factory(self):
        """`KVCacheManager(...)` as the tests call it: the release's facade,
        recorded.

        A function rather than a subclass, so the objects the tests get are
        exactly the facade class (the test files only call the name; their
        annotations were evaluated at import)."""
        real = self.facade
        recorder = self

        def KVCacheManager(*args, **kwargs):  # noqa: N802 - vLLM's name
            if recorder._current is not None:
                recorder.built_hybrid.add(recorder._current)
            return real(*args, **kwargs)

        KVCacheManager.__doc__ = real.__doc__
        return real, KVCacheManager

    def pytest_configure(self, config) -> None:
        config.addinivalue_line("markers", "cpu_test: vLLM's CPU-only test mark")
        if not self.swap:
            return
        import vllm.v1.core.kv_cache_manager as vkm

        self.cls, self.factory = self._make_factory()
        vkm.KVCacheManager = self.cls
        # install()'s native append_output_token_ids (vLLM's hashers stay:
        # the tests build their own), under vLLM's request and scheduler tests.
        from hybridcache.vllm_tokens import install_token_append

        install_token_append()
        if self.swap_scheduler:
            import vllm.v1.core.sched.scheduler as sched

            sched.KVCacheManager = self.factory

    def pytest_collection_modifyitems(self, session, config, items) -> None:
        for item in items:
            mod = getattr(item, "module", None)
            if self.swap and mod is not None and hasattr(mod, "KVCacheManager") and \
                    mod.__name__ != "vllm.v1.core.sched.scheduler":
                mod.KVCacheManager = self.factory
            self.order.append(item.nodeid)

    # -- bookkeeping -----------------------------------------------------

    def pytest_runtest_setup(self, item) -> None:
        self._current = item.nodeid

    def pytest_runtest_logreport(self, report) -> None:
        r = self.results.setdefault(report.nodeid, {"outcome": "passed", "longrepr": None, "when": None})
        if report.failed or (report.skipped and r["outcome"] == "passed"):
            if r["outcome"] != "failed":
                r["outcome"] = "failed" if report.failed else "skipped"
                r["longrepr"] = report.longrepr
                r["when"] = report.when


def _func_name(nodeid: str) -> str:
    return nodeid.split("::")[-1].split("[")[0]


def _failure(longrepr, files: tuple[str, ...] = ()) -> tuple[str, str]:
    """(first line of the exception, `FILE line N` in a test file where it surfaced)."""
    if longrepr is None:
        return "", ""
    if isinstance(longrepr, tuple):  # a skip: (path, lineno, reason)
        return str(longrepr[2]), ""
    where = ""
    for entry in getattr(getattr(longrepr, "reprtraceback", None), "reprentries", []):
        loc = getattr(entry, "reprfileloc", None)
        if loc is not None and any(loc.path.endswith(f) for f in files):
            where = f"{Path(loc.path).name} line {loc.lineno}"
    crash = getattr(getattr(longrepr, "reprcrash", None), "message", None)
    if crash:
        return " ".join(crash.split()), where
    lines = [ln[1:].strip() for ln in str(longrepr).splitlines() if ln.startswith("E ")]
    return (" ".join(lines) if lines else str(longrepr).splitlines()[-1]), where


def _expected_failure(msg: str, attrs: tuple[str, ...], feature: str | None) -> str | None:
    """What a listed case's failure touched, when it is of the expected kind."""
    if msg.startswith("AttributeError"):
        for attr in attrs:
            if re.search(rf"\b{attr}\b", msg):
                return f"AttributeError: {attr}"
    if feature and msg.startswith("NotImplementedError") and feature in msg:
        return f"NotImplementedError: {feature}"
    return None


def _shorten(s: str, n: int = 160) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 3] + "..."


def _installed_release() -> str | None:
    try:
        return metadata.version("vllm").split("+", 1)[0]
    except metadata.PackageNotFoundError:
        return None


def _per_file(results: dict[str, dict], order: list[str]) -> list[str]:
    """One line per test file: passed / failed / skipped."""
    counts: dict[str, dict[str, int]] = {}
    for nodeid in order:
        r = results.get(nodeid)
        if r is not None:
            c = counts.setdefault(_file_of(nodeid), {"passed": 0, "failed": 0, "skipped": 0})
            c[r["outcome"]] += 1
    w = max((len(f) for f in counts), default=0)
    return [f"  {f:<{w}}  {sum(c.values()):4d} cases  {c['passed']:4d} passed  {c['failed']:4d} failed  "
            f"{c['skipped']:4d} skipped" for f, c in counts.items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--release", default=None, help="vLLM release whose tests run (default: the installed vLLM's)")
    ap.add_argument("--tests-dir", type=Path, default=None, help="fetched tests (default .cache/vllm-tests/RELEASE)")
    ap.add_argument("--report", type=Path, default=None, help="report file (default .cache/vllm-peer-report-RELEASE.txt)")
    ap.add_argument("-k", dest="keyword", default=None, help="pytest -k expression")
    ap.add_argument("--file", action="append", dest="files", default=None,
                    help="run only this test file of the release (its name, e.g. test_scheduler.py; repeatable)")
    ap.add_argument("--strict", action="store_true",
                    help="count documented-unsupported features as failures too")
    ap.add_argument("--against-vllm", action="store_true",
                    help="baseline: run the files against vLLM's own manager (no swap); all should pass")
    ap.add_argument("-v", "--verbose", action="store_true", help="show pytest's own output")
    args = ap.parse_args(argv)

    installed = _installed_release()
    release = args.release or installed
    if release is None:
        print("vLLM is not installed (and no --release given)", file=sys.stderr)
        return 2
    try:
        tables = release_tables(release)
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 2
    tests_dir = args.tests_dir or TESTS_ROOT / release
    report_path = args.report or ROOT / ".cache" / f"vllm-peer-report-{release}.txt"
    files = release_test_files(release)
    if args.files:
        unknown = sorted(set(args.files) - {f.name for f in files})
        if unknown:
            print(f"not a test file of vLLM {release}'s peer suite: {', '.join(unknown)}", file=sys.stderr)
            return 2
        files = [f for f in files if f.name in args.files]
    missing = [f for f in files if not (tests_dir / f).is_file()]
    if missing:
        print(f"{tests_dir / missing[0]} not found: run `bash scripts/fetch_vllm_tests.sh {release}` first",
              file=sys.stderr)
        return 2
    if installed != release:
        print(f"vLLM {release}'s tests need vLLM {release} installed, found {installed}", file=sys.stderr)
        return 2

    # Before vLLM is imported: it reads these at import.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for key, value in tables.ENV.items():
        os.environ.setdefault(key, value)
    if tables.HF_MODELS:
        hf_home = TESTS_ROOT / "hf-home"
        install_hf_models(tables.HF_MODELS, hf_home)
        os.environ["HF_HOME"] = str(hf_home)
    try:
        import pytest
    except ImportError:
        print("cannot import pytest: it is needed", file=sys.stderr)
        return 2
    facade = None
    if not args.against_vllm:  # the baseline needs no hybridcache
        try:
            from hybridcache import releases
        except ImportError as e:
            print(f"cannot import {e.name}: hybridcache is needed (or run --against-vllm)", file=sys.stderr)
            return 2
        entry = releases.find(release)
        if entry is None:
            print(f"vLLM {release} has no facade in hybridcache.releases yet (supported: "
                  f"{', '.join(releases.SUPPORTED_VLLM_VERSIONS)}): only --against-vllm runs", file=sys.stderr)
            return 2
        facade = entry.facade_class()

    # `tests.v1.core...` must resolve to the fetched copy.
    sys.path.insert(0, str(tests_dir))
    sys.path.append(str(ROOT / "tests"))  # after vLLM's: the triton shim only
    rec = _Recorder(facade, swap_scheduler=tables.SWAP_SCHEDULER)
    pytest_args = [
        *(str(tests_dir / f) for f in files),
        "-p", "no:cacheprovider",
        "-p", TRITON_SHIM,
        "--rootdir", str(tests_dir),
        "--confcutdir", str(tests_dir),
        "-c", os.devnull,  # no ini file: neither the project's nor vLLM's
        "-W", "ignore::DeprecationWarning",
    ]
    if importlib.util.find_spec("pytest_asyncio") is not None:
        pytest_args += ["-o", "asyncio_default_fixture_loop_scope=function"]
    if args.verbose:
        pytest_args += ["-q", "--tb=short"]
    else:
        pytest_args += ["-p", "no:terminal", "-p", "no:warnings"]
    if args.keyword:
        pytest_args += ["-k", args.keyword]
    t0 = time.monotonic()
    rc = pytest.main(pytest_args, plugins=[rec])
    elapsed = time.monotonic() - t0
    if rc not in (0, 1) or not rec.results:
        print(f"pytest did not run the tests (exit {rc})", file=sys.stderr)
        return 2
    names = tuple(f.name for f in files)

    if args.against_vllm:
        failed = [n for n, r in rec.results.items() if r["outcome"] != "passed"]
        offline = [n for n in failed if _lookup(tables.OFFLINE, n)]
        bad = [n for n in failed if n not in offline]
        print(f"vLLM {release}'s own tests against vLLM's own manager ({elapsed:.0f}s): "
              f"{len(rec.results) - len(failed)} passed, {len(offline)} cannot run offline on CPU (OFFLINE), "
              f"{len(bad)} not passed otherwise")
        print("\n".join(_per_file(rec.results, rec.order)))
        for n in offline:
            print(f"  offline: {n}: {_lookup(tables.OFFLINE, n)}")
        for n in bad:
            msg, where = _failure(rec.results[n]["longrepr"], names)
            print(f"  NOT PASSED: {n}{f' ({where})' if where else ''}: {_shorten(msg, 200)}")
        return 0 if not bad else 1

    rows = []
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    n_hybrid = n_public = n_public_passed = n_views = n_views_passed = n_offline = 0
    n_unsupported = n_internal = 0
    # Releases whose tables are not filled case by case classify failures by
    # what hybridcache raised: a documented NotImplementedError (a feature
    # or layout its facade for the release refuses) or the AttributeError of
    # one of its read-only views (a vLLM internal it does not provide).
    unsupported_features = getattr(tables, "UNSUPPORTED_FEATURES", ())
    internal_mark = getattr(tables, "INTERNAL_MARK", None)
    divergences = 0
    for nodeid in rec.order:
        r = rec.results.get(nodeid)
        if r is None:
            continue
        name = nodeid if len(files) > 1 else nodeid.split("::", 1)[-1]
        outcome = r["outcome"]
        counts[outcome] += 1
        hybrid = nodeid in rec.built_hybrid
        n_hybrid += hybrid
        listed, attrs = _lookup(tables.INTERNALS, nodeid) or (None, ())
        # Cases that hand the manager a state vLLM's internals allow but its
        # API does not (BAD_INPUT): expected when refused with that ValueError.
        bad_input = _lookup(getattr(tables, "BAD_INPUT", {}), nodeid)
        if bad_input:
            listed, attrs = bad_input[0], ()
        # Cases that compare block objects by identity (IDENTITY): hybridcache's
        # views are equal by block id, not one object per block.
        identity = _lookup(getattr(tables, "IDENTITY", {}), nodeid)
        # An entry may name the failure it expects: (reason, message regex).
        identity_failure = r"assert KVCacheBlock\(.*\) is KVCacheBlock\("
        if isinstance(identity, tuple):
            identity, identity_failure = identity
        if identity:
            listed, attrs = identity, ()
        unsupported = _lookup(tables.UNSUPPORTED, nodeid)
        view_reads = _lookup(tables.VIEWS, nodeid)
        offline = _lookup(tables.OFFLINE, nodeid)
        if view_reads:
            n_views += 1
            n_views_passed += outcome == "passed"
        elif not listed and not unsupported and not offline:
            n_public += 1
            n_public_passed += outcome == "passed"
        if outcome == "passed":
            if view_reads:
                rows.append((name, "passed", f"reads internals through hybridcache's views: {view_reads}"))
                continue
            if listed and not hybrid:
                rows.append((name, "passed", f"n/a: {listed}, no hybridcache manager built"))
            elif listed or unsupported or offline:
                rows.append((name, "passed", f"passed although listed: {listed or unsupported or offline}"))
            continue
        msg, where = _failure(r["longrepr"], names)
        at = f" ({where})" if where else ""
        if offline:
            n_offline += 1
            rows.append((name, outcome, f"n/a offline on CPU: {offline}{at}: {_shorten(msg, 100)}"))
            continue
        if not (listed or unsupported) and msg.startswith("NotImplementedError") and any(
            f in msg for f in unsupported_features
        ):
            n_unsupported += 1
            if args.strict:
                divergences += 1
            rows.append((name, outcome, ("STRICT: " if args.strict else "")
                         + f"unsupported by hybridcache (documented){at}: {_shorten(msg, 140)}"))
            continue
        if not (listed or unsupported) and internal_mark and msg.startswith("AttributeError") and internal_mark in msg:
            n_internal += 1
            rows.append((name, outcome, f"reaches a vLLM internal hybridcache does not provide{at}: {_shorten(msg, 140)}"))
            continue
        feature = next((f for f in tables.NOT_IMPLEMENTED if f in (listed or unsupported or "")), None)
        touched = _expected_failure(msg, attrs, feature)
        if bad_input and msg.startswith("ValueError") and bad_input[1] in msg:
            touched = f"ValueError: {bad_input[1]}"
        if identity and re.match(identity_failure, msg):
            touched = "identity (or liveness) of block objects"
        if listed and not hybrid:
            reason = f"n/a: {listed}, no hybridcache manager built; failed under vLLM itself? {_shorten(msg, 100)}"
        elif (listed or unsupported) and touched:
            reason = f"{listed or unsupported} [{touched}{at}]"
            if unsupported and args.strict:
                divergences += 1
                reason = "STRICT: " + reason
        else:
            divergences += 1
            reason = f"HYBRIDCACHE DIVERGENCE{at}: {_shorten(msg, 200)}"
            if listed or unsupported:
                reason += f" (case listed as: {listed or unsupported}, but failed another way)"
        rows.append((name, outcome, reason))

    total = sum(counts.values())
    shown = ", ".join(str(f) for f in files) if len(files) <= 2 else f"{len(files)} files of tests/v1/core"
    lines = [
        f"vLLM {release} {shown} against hybridcache's {facade.__module__}.{facade.__qualname__}",
        f"cases: {total}   passed: {counts['passed']}   failed: {counts['failed']}   "
        f"skipped: {counts['skipped']}   time: {elapsed:.1f}s",
        f"built a hybridcache manager: {n_hybrid}   public-API-only cases: {n_public} "
        f"(passed {n_public_passed})   internals read through views: {n_views} (passed {n_views_passed})   "
        + (f"offline n/a: {n_offline}   " if n_offline else "")
        + (f"unsupported (documented NotImplementedError): {n_unsupported}   " if n_unsupported else "")
        + (f"reach internals: {n_internal}   " if n_internal else "")
        + f"divergences: {divergences}",
    ]
    if len(files) > 1:
        lines += ["per file:", *_per_file(rec.results, rec.order)]
    lines.append("")
    if rows:
        w = max(len(n) for n, _, _ in rows)
        lines.append(f"{'case':<{w}}  {'outcome':<7}  reason")
        lines.append(f"{'-' * w}  -------  ------")
        lines += [f"{n:<{w}}  {o:<7}  {reason}" for n, o, reason in rows]
    else:
        lines.append("every case passed")
    # (No "N passed, N failed" line: CI log readers take such a line for a test
    # runner's verdict, and most of these failures are expected.)
    lines += ["", f"verdict: {'OK' if divergences == 0 else 'DIVERGENT'} ({divergences} divergences)"]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(text)
    return 0 if divergences == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
