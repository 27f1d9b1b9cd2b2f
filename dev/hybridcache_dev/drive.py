"""The fuzz's driver for each release (`hybridcache_dev.release_api`
describes the release; the driver issues its scheduler's calls): which
driver class, the reference manager it compares against (vLLM's, guarded
where the release's own manager would crash), and `drive`, random legal
operations on given setups (for tests that draw their own)."""

from __future__ import annotations

import importlib
import random
from collections.abc import Sequence
from typing import Any

from hybridcache import releases
from hybridcache_dev.fuzz_setup import Figures, RngChooser, Setup
from hybridcache_dev.release_api import FuzzApi

# Each release's driver class ("module:Class"), by its folder in the table.
DRIVERS = {
    "v0_23": "hybridcache_dev.fuzz_driver:Driver",
    "v0_33": "hybridcache_dev.v0_33.fuzz_mamba_guard:Driver033Guarded",
}


def _folder(api: FuzzApi) -> str:
    """The folder whose driver drives `api`'s release: its own, else that
    of the first release running the same core profile."""
    release = releases.find(api.name)
    if release is None:
        raise ValueError(f"no release {api.name!r} in hybridcache.releases")
    return release.folder if release.folder in DRIVERS else releases.of_profile(release.profile).folder


def driver_class(api: FuzzApi) -> type:
    """The class that drives `api`'s release."""
    module, _, name = DRIVERS[_folder(api)].partition(":")
    cls: type = getattr(importlib.import_module(module), name)
    return cls


def build_reference(api: FuzzApi, s: Setup) -> Any:
    """vLLM's manager for setup `s`, guarded (`v0_33.fuzz_mamba_guard`)
    where that release's own manager would crash on a legal call."""
    ref = api.build_reference(s)
    if _folder(api) == "v0_33":
        from hybridcache_dev.v0_33.fuzz_mamba_guard import GuardedReference, guards

        return GuardedReference(ref) if guards(s) else ref
    return ref


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
