"""The release table (`hybridcache.releases`) and `install()`'s choice of a
facade by the installed vLLM's version, in every oracle venv (vLLM 0.23.0
and 0.33.0): a supported release binds its own facade class in vLLM's
scheduler module, any other version is refused with an error that lists the
supported releases, and the refusal leaves vLLM's scheduler untouched."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import pytest

pytestmark = pytest.mark.vllm("0.23.0", "0.33.0")

from hybridcache import releases  # noqa: E402
from hybridcache import vllm as hc_vllm  # noqa: E402
from hybridcache.__main__ import version_text  # noqa: E402
from hybridcache.releases.v0_23.scheduler import VllmKVCacheManager  # noqa: E402


def test_release_table_rows_are_unique_and_import() -> None:
    versions = [r.version for r in releases.RELEASES]
    assert versions and len(set(versions)) == len(versions)
    assert releases.SUPPORTED_VLLM_VERSIONS == tuple(versions)
    for r in releases.RELEASES:
        cls = r.facade_class()
        assert isinstance(cls, type) and cls.__name__ == r.facade and cls.__module__ == r.package + ".scheduler"
        assert releases.of_folder(r.folder) is r and releases.of_profile(r.profile).profile == r.profile
        assert r.oracle_venv == f".venv-vllm-{r.minor}" and r.install_hint == f"pip install vllm=={r.version}"
    assert releases.DEFAULT.facade_class() is VllmKVCacheManager


def test_versions_match_without_their_local_label() -> None:
    assert releases.release_version("0.33.0+cpu") == "0.33.0"
    assert releases.find("0.23.0+cu130") is releases.find("0.23.0") is not None
    assert releases.find("0.23.1") is None and releases.find("0.2") is None and releases.find(None) is None


def test_require_lists_the_supported_releases() -> None:
    with pytest.raises(RuntimeError) as e:
        releases.require("0.99.0")
    msg = str(e.value)
    assert "the installed vLLM is 0.99.0" in msg
    assert all(v in msg for v in releases.SUPPORTED_VLLM_VERSIONS)
    with pytest.raises(RuntimeError, match="vLLM is not installed"):
        releases.require(None)


@pytest.fixture
def scheduler_module() -> Any:
    module = importlib.import_module("vllm.v1.core.sched.scheduler")
    hc_vllm.uninstall()
    stock = module.KVCacheManager
    yield module
    hc_vllm.uninstall()
    assert module.KVCacheManager is stock


def test_install_binds_the_installed_releases_facade_or_refuses(scheduler_module: Any) -> None:
    import vllm

    stock = scheduler_module.KVCacheManager
    release = releases.find(vllm.__version__)
    if release is None:  # a vLLM before its row is added
        with pytest.raises(RuntimeError, match=rf"{releases.SUPPORTED_VLLM_VERSIONS[0]}.*{vllm.__version__}"):
            hc_vllm.install(native_hashing=False)
        assert scheduler_module.KVCacheManager is stock and not hc_vllm.is_installed()
        return
    hc_vllm.install(native_hashing=False)
    assert scheduler_module.KVCacheManager is release.facade_class() and hc_vllm.is_installed()
    hc_vllm.install(native_hashing=False)  # idempotent
    assert scheduler_module.KVCacheManager is release.facade_class()
    hc_vllm.uninstall()
    assert scheduler_module.KVCacheManager is stock and not hc_vllm.is_installed()


@pytest.mark.parametrize("version", ["0.99.0", "0.24.1+cpu", "0.33.1"])
def test_unsupported_version_is_refused_with_the_list(
    scheduler_module: Any, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    import vllm

    stock = scheduler_module.KVCacheManager
    monkeypatch.setattr(vllm, "__version__", version)
    for entry in (lambda: hc_vllm.install(native_hashing=False), hc_vllm.register):
        monkeypatch.setenv(hc_vllm.ENABLE_ENV, "1")
        with pytest.raises(RuntimeError) as e:
            entry()
        msg = str(e.value)
        assert f"the installed vLLM is {version}" in msg
        assert "supports these vLLM releases only: " + ", ".join(releases.SUPPORTED_VLLM_VERSIONS) in msg
        assert scheduler_module.KVCacheManager is stock and not hc_vllm.is_installed()
    monkeypatch.setenv(hc_vllm.ENABLE_ENV, "0")
    hc_vllm.register()  # the plugin does nothing unless enabled, whatever the version
    assert scheduler_module.KVCacheManager is stock


def test_version_text_names_the_supported_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    text = version_text()
    assert f"drop-in for the KVCacheManager of vLLM {releases.supported_text()}" in text
    monkeypatch.setattr(metadata, "version", lambda name: "0.99.0")
    assert "vLLM 0.99.0 installed, not supported" in version_text()


def test_tools_oracle_refuses_a_release_it_does_not_replicate(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm

    from hybridcache.tools import oracle
    from hybridcache_dev.oracle import ORACLE_RELEASES, vllm_missing

    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    version, note = oracle.load_vllm(ORACLE_RELEASES)
    assert version is None and "vLLM 0.99.0 is installed, not " in note
    line = vllm_missing("hybridcache replay")
    assert line is not None and all(f"pip install vllm=={r.version}" in line for r in ORACLE_RELEASES)


def test_native_hasher_is_installed_only_for_a_release_it_matches(
    scheduler_module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release row without `native_hasher` keeps vLLM's own request block
    hasher even when native hashing is asked for (hashing changed after
    0.23.0); the facade is bound all the same."""
    import vllm

    engine = importlib.import_module("vllm.v1.engine.core")
    stock_hasher = engine.get_request_block_hasher
    installed = releases.find(vllm.__version__)
    assert installed is not None
    row = dataclasses.replace(installed, folder=releases.DEFAULT.folder, facade=releases.DEFAULT.facade,
                              native_hasher=False)
    monkeypatch.setattr(releases, "RELEASES", (row,))
    hc_vllm.install(native_hashing=True)
    assert scheduler_module.KVCacheManager is VllmKVCacheManager
    assert not hc_vllm.native_hashing_installed() and engine.get_request_block_hasher is stock_hasher
    hc_vllm.uninstall()
    monkeypatch.setattr(releases, "RELEASES", (dataclasses.replace(row, native_hasher=True),))
    hc_vllm.install(native_hashing=True)
    assert hc_vllm.native_hashing_installed()
    hc_vllm.uninstall()
    assert engine.get_request_block_hasher is stock_hasher
