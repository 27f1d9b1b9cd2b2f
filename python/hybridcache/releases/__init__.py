"""The vLLM releases hybridcache supports: the table (`table.RELEASES`, one
row of named flags per release) and the questions asked of it, read by
`hybridcache.vllm.install()` (which facade class vLLM's scheduler builds),
hashing, KV events, the tools, `hybridcache --version`, the test suite's
per-release selection (tests/conftest.py), the PGO training and CI.

Each release's own code is a package here (`v0_MINOR`, e.g. `v0_99` for
a vLLM 0.99.0), named by the row's `folder`; what releases share lives once in
`hybridcache.facade` and the modules it composes.

A release is matched on vLLM's `__version__` without its local label
("0.99.0+cpu" is 0.99.0); a version not in the table is refused by
`require`, the one place that does. Nothing here imports vLLM or torch; the
facade class is imported only when asked for.
"""

from __future__ import annotations

from hybridcache.releases.table import RELEASES, VERSIONS, Release, oracle_venv_of, release_version

SUPPORTED_VLLM_VERSIONS: tuple[str, ...] = VERSIONS

# The release `hybridcache.KVCacheManager` follows, and the default of the
# functions that take a release (hashing, events): the oldest row.
DEFAULT: Release = RELEASES[0]


def find(version: str | None) -> Release | None:
    """The supported release `version` is (local label ignored), else None."""
    if version is None:
        return None
    wanted = release_version(version)
    return next((r for r in RELEASES if r.version == wanted), None)


def of_profile(profile: str) -> Release:
    """The first release whose row names core profile `profile` (ValueError
    for a profile no release runs)."""
    found = next((r for r in RELEASES if r.profile == profile), None)
    if found is None:
        raise ValueError(f"no supported vLLM release runs profile {profile!r} "
                         f"(profiles: {', '.join(sorted({r.profile for r in RELEASES}))})")
    return found


def profile_of(profile_or_version: str) -> str:
    """The core profile name for a supported release's version, or the
    argument as it is (a profile name; the native side refuses an unknown
    one, naming its profiles)."""
    release = find(profile_or_version)
    return release.profile if release is not None else profile_or_version


def of_folder(folder: str) -> Release:
    """The release whose package (and tests' folder) is `folder`, e.g. "v0_99"."""
    return next(r for r in RELEASES if r.folder == folder)


def supported_text() -> str:
    """The supported releases in words: "0.98.0", or "0.98.0 and 0.99.0"."""
    v = SUPPORTED_VLLM_VERSIONS
    return v[0] if len(v) == 1 else ", ".join(v[:-1]) + " and " + v[-1]


def installed_vllm_version() -> str | None:
    """The installed vLLM's version from its metadata (vLLM is not
    imported), or None without vLLM."""
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


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


__all__ = ["DEFAULT", "RELEASES", "SUPPORTED_VLLM_VERSIONS", "Release", "find", "of_folder", "of_profile",
           "oracle_venv_of", "profile_of", "release_version", "require", "supported_text"]
