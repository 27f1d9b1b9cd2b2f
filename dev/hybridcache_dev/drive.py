"""The fuzz's driver for each release (`hybridcache_dev.release_api`
describes the release; the driver issues its scheduler's calls): which
driver class, the reference manager it compares against (vLLM's, guarded
where the release's own manager would crash), and `drive`, random legal
operations on given setups (for tests that draw their own)."""

from __future__ import annotations

import importlib
import importlib.util
import random
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from hybridcache import releases
from hybridcache_dev.fuzz_setup import Figures, RngChooser, Setup
from hybridcache_dev.release_api import FuzzApi


def _has_package(folder: str) -> bool:
    """Whether the release in `folder` has its own driver package,
    `hybridcache_dev.<folder>` (exporting `Driver` and `guard_reference`):
    only a release whose scheduler issues its calls differently has one."""
    return importlib.util.find_spec(f"hybridcache_dev.{folder}") is not None


def _folder(api: FuzzApi) -> str:
    """The folder whose driver drives `api`'s release: its own, else that
    of the first release running the same core profile."""
    release = releases.find(api.name)
    if release is None:
        raise ValueError(f"no release {api.name!r} in hybridcache.releases")
    return release.folder if _has_package(release.folder) else releases.of_profile(release.profile).folder


def _package(api: FuzzApi) -> ModuleType | None:
    """The driver package of `api`'s release; None: the base driver
    (`fuzz_driver.Driver`, unguarded)."""
    folder = _folder(api)
    return importlib.import_module(f"hybridcache_dev.{folder}") if _has_package(folder) else None


def driver_class(api: FuzzApi) -> type:
    """The class that drives `api`'s release."""
    package = _package(api)
    if package is None:
        from hybridcache_dev.fuzz_driver import Driver

        return Driver
    cls: type = package.Driver
    return cls


def build_reference(api: FuzzApi, s: Setup) -> Any:
    """vLLM's manager for setup `s`, guarded (the driver package's
    `guard_reference`) where that release's own manager would crash on a
    legal call."""
    ref = api.build_reference(s)
    package = _package(api)
    return ref if package is None else package.guard_reference(ref, s)


def build_candidate(api: FuzzApi, s: Setup, candidate: str) -> Any:
    """The compared manager: hybridcache's facade, or (the harness
    self-check) vLLM's guarded reference again."""
    return build_reference(api, s) if candidate == "vllm" else api.build_candidate(s, candidate)


def drive(api: FuzzApi, setups: Sequence[Setup], ops: int) -> Figures:
    """Random legal operations on each setup (the i-th with seed i),
    vLLM's manager against hybridcache's facade: the figures, every finding
    in them."""
    f = Figures()
    for i, s in enumerate(setups):
        d = driver_class(api)(s, False, f)
        c = RngChooser(random.Random(i))
        for _ in range(ops):
            d.step_random(c)
        d.drain()
    return f
