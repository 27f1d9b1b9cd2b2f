"""The vLLM releases hybridcache supports: one table, read by
`hybridcache.vllm.install()` (which facade class vLLM's scheduler builds), the
differential tools' oracle check (`hybridcache.testing.oracle`),
`hybridcache --version`, the test suite's per-release markers
(tests/conftest.py) and the peer-suite runner.

A release is matched on vLLM's `__version__` without its local label
("0.33.0+cpu" is 0.33.0). Nothing here imports vLLM or torch; the facade class
is imported only when asked for.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    """One supported vLLM release.

    Args:
        version: vLLM's version, e.g. "0.23.0".
        facade: "module:Class" of the KVCacheManager subclass vLLM's scheduler
            builds after `install()` (argument names, tuple arities and the
            attributes that release's scheduler reads).
        tools_oracle: whether `hybridcache replay` / `bench` compare
            hybridcache's facade for this release against this release's
            manager when it is the installed vLLM.
        native_hasher: whether `install()` may rebind the engine's request
            block hasher to hybridcache's native one, i.e. whether that
            hasher is bit-identical to this release's hashing (NONE_HASH and
            extra keys changed after 0.23.0).
        native_token_append: whether, with native hashing, the engine's
            native hasher may put hybridcache's native
            `append_output_token_ids` on vLLM's `Request`
            (`hybridcache.vllm_tokens`), i.e. whether that
            release's `append_output_token_ids` and `update_block_hashes`
            have the bodies it follows.
        profile: the core's behaviour profile this release follows (a name
            in `BehaviourProfile::NAMED`, rust/core/src/profile.rs), which
            the native manager and hasher are given.
        layouts: the benchmark layouts (`hybridcache bench`'s configs, `bench
            --step`'s layouts, `replay`'s default trace: "full") this
            release's facade covers; None: every layout. The tools skip the
            others with a note.
    """

    version: str
    facade: str
    profile: str
    tools_oracle: bool = False
    native_hasher: bool = False
    native_token_append: bool = False
    layouts: tuple[str, ...] | None = None

    @property
    def minor(self) -> str:
        """The release's MAJOR.MINOR, e.g. "0.23"."""
        return ".".join(self.version.split(".")[:2])

    @property
    def oracle_venv(self) -> str:
        """The test-only venv CI makes for this release, relative to the repository root."""
        return oracle_venv_of(self.version)

    @property
    def install_hint(self) -> str:
        """How a user installs this release (in the repository, CI's test
        venv comes from `bash scripts/install_oracle.sh VERSION`)."""
        return f"pip install vllm=={self.version}"

    def covers(self, layout: str) -> bool:
        """Whether this release's facade covers the tools' layout `layout`."""
        return self.layouts is None or layout in self.layouts

    def facade_class(self) -> type:
        """The facade class (imports its module, not vLLM)."""
        module, _, name = self.facade.partition(":")
        cls: type = getattr(importlib.import_module(module), name)
        return cls


RELEASES: tuple[Release, ...] = (
    Release("0.23.0", "hybridcache.vllm:VllmKVCacheManager", "whole-block-hits", tools_oracle=True, native_hasher=True,
            native_token_append=True),
    # 0.33.0: every benchmark layout (Mamba align with prefix caching where
    # its block is one hash block, as the benchmarks' is).
    Release("0.33.0", "hybridcache.vllm033:VllmKVCacheManager033", "partial-block-hits", tools_oracle=True, native_hasher=True,
            native_token_append=True, layouts=None),
)
SUPPORTED_VLLM_VERSIONS: tuple[str, ...] = tuple(r.version for r in RELEASES)


def oracle_venv_of(version: str) -> str:
    """The test-only venv CI makes for vLLM `version` (supported or not yet),
    relative to the repository root: .venv-vllm-MAJOR.MINOR."""
    return ".venv-vllm-" + ".".join(release_version(version).split(".")[:2])


def release_version(version: str) -> str:
    """vLLM's `__version__` without a local label: "0.33.0+cpu" -> "0.33.0"."""
    return version.split("+", 1)[0].strip()


def find(version: str | None) -> Release | None:
    """The supported release `version` is (local label ignored), else None."""
    if version is None:
        return None
    wanted = release_version(version)
    return next((r for r in RELEASES if r.version == wanted), None)


def profile_of(version: str) -> str:
    """The behaviour profile the native side is given for vLLM `version`;
    a string that is no supported release is passed on as it is (a profile
    name, or a version the native side refuses, naming its profiles)."""
    release = find(version)
    return release.profile if release is not None else version


def supported_text() -> str:
    """The supported releases in words: "0.23.0", or "0.23.0 and 0.33.0"."""
    v = SUPPORTED_VLLM_VERSIONS
    return v[0] if len(v) == 1 else ", ".join(v[:-1]) + " and " + v[-1]


def require(version: str | None, what: str = "hybridcache.vllm.install()") -> Release:
    """The supported release `version` is; raises RuntimeError naming the
    installed version (or its absence) and every supported release."""
    release = find(version)
    if release is not None:
        return release
    supported = ", ".join(SUPPORTED_VLLM_VERSIONS)
    if version is None:
        raise RuntimeError(f"{what} needs vLLM (supported releases: {supported}), but vLLM is not installed")
    raise RuntimeError(
        f"{what}: hybridcache supports these vLLM releases only: {supported} (it replaces their "
        f"KVCacheManager); the installed vLLM is {version}"
    )
