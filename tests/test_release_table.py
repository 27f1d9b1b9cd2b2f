"""The table of releases without vLLM: read standalone (as .ci/run reads
it), the one place that compares versions, and a row without its own tool
API or fuzz driver borrowing those of the release whose core profile it
runs."""

from __future__ import annotations

import dataclasses
import re
import runpy
from pathlib import Path

import pytest

from hybridcache import releases
from hybridcache.tools import release_api

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "python" / "hybridcache" / "releases" / "table.py"


def test_the_table_reads_standalone_as_the_package_does() -> None:
    table = runpy.run_path(str(TABLE))
    assert table["VERSIONS"] == releases.SUPPORTED_VLLM_VERSIONS
    assert [r.folder for r in table["RELEASES"]] == [r.folder for r in releases.RELEASES]
    for r in releases.RELEASES:
        assert (ROOT / "python" / "hybridcache" / "releases" / r.folder / "scheduler.py").is_file()
        assert (ROOT / "scripts" / "oracle" / f"vllm-{r.version}.txt").is_file()


def test_no_version_is_compared_outside_the_table() -> None:
    compare = re.compile(r"""(==|!=)\s*["']\d+\.\d+|["']\d+\.\d+\.\d+["']\s*(==|!=)|in \(["']\d+\.\d+""")
    paths = [*(ROOT / "python").rglob("*.py"), *(ROOT / "dev").rglob("*.py"), *(ROOT / "scripts").rglob("*.py"),
             *(ROOT / "scripts").glob("*.sh"), ROOT / ".ci" / "run"]
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in paths if p != TABLE
             for i, line in enumerate(p.read_text().splitlines(), 1) if compare.search(line)]
    assert not found, "\n".join(found)


def test_an_unknown_version_is_refused_naming_both() -> None:
    with pytest.raises(RuntimeError) as e:
        releases.require("0.99.0+cpu")
    assert "0.99.0+cpu" in str(e.value) and all(v in str(e.value) for v in releases.SUPPORTED_VLLM_VERSIONS)


def test_a_row_without_its_own_tool_api_borrows_its_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    from hybridcache_dev import drive
    from hybridcache_dev import release_api as fuzz_api

    last = releases.RELEASES[-1]
    later = dataclasses.replace(last, version="0.99.0", folder="v0_99", facade="VllmKVCacheManager099")
    for module in (release_api, fuzz_api):
        with pytest.raises(ValueError, match="unsupported vLLM release '0.99.0'"):
            module.release("0.99.0")
    monkeypatch.setattr(releases, "RELEASES", releases.RELEASES + (later,))
    for module in (release_api, fuzz_api):
        monkeypatch.setattr(module, "RELEASES", dict(module.RELEASES))
        api = module.release("0.99.0")
        like = module.release(last.version)
        assert type(api) is type(like) and api is not like
        assert api.name == "0.99.0" and api.facade == ("hybridcache.releases.v0_99.scheduler", "VllmKVCacheManager099")
        assert like.name == last.version and module.release("0.99.0") is api
    assert drive._folder(api) == drive._folder(like) == releases.of_profile(last.profile).folder
