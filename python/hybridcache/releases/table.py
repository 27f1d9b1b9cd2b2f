"""The table of the vLLM releases hybridcache supports: one row per release,
every release-dependent choice a named flag on its row. Nothing outside
this file compares version strings; everything that lists releases reads
`RELEASES` (through `hybridcache.releases`).

This module imports nothing but the standard library, so a script can read
the table without the native module built:
`python -c "import runpy; print(*runpy.run_path('python/hybridcache/releases/table.py')['VERSIONS'])"`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    """One supported vLLM release.

    Args:
        version: vLLM's version, e.g. "0.23.0".
        folder: the release's package under `hybridcache.releases` (its
            facade class, views, layout checks and scheduler binding) and its
            tests' folder under tests/; e.g. "v0_23".
        facade: the class name, in `<folder>.scheduler`, vLLM's scheduler
            builds after `install()` (argument names, tuple arities and the
            attributes that release's scheduler reads).
        profile: the core's behaviour profile the release's managers and
            hasher run, a name in `BehaviourProfile::NAMED`
            (rust/core/src/profile.rs), which the native manager and
            `BlockHasher` are given: a release that behaves as an earlier one
            names that one's profile.
        tools_oracle: whether `hybridcache replay` / `bench` compare
            hybridcache's facade for this release against this release's
            manager when it is the installed vLLM.
        native_hasher: whether `install()` may rebind the engine's request
            block hasher to hybridcache's native one, i.e. whether that
            hasher is bit-identical to this release's hashing.
        native_token_append: whether, with native hashing, the engine's
            native hasher may put hybridcache's native
            `append_output_token_ids` on vLLM's `Request`
            (`hybridcache.vllm_tokens`).
        hash_lookahead: whether the release's `get_request_block_hasher`
            takes `num_hash_lookahead_tokens` (and its block hashes may cover
            lookahead tokens).
        event_extras: whether the release's KV events carry `locality` and
            `ownership` (and `BlockStored` the request's `session_id` and
            `lookahead_token_ids`), and report the pool's medium.
        per_request_decode: whether the release's scheduler allocates a
            decode one request at a time as hybridcache's batched decode API
            replaces (`hybridcache bench` times that API against it).
        read_gate: the request attribute a lookup reads to decide whether
            to read the prefix cache and how far a hit may reach:
            "skip_reading_prefix_cache" (a bool; until 0.33.0) or
            "prefix_cache_hit_limit" (0: no lookup, N: a hit reaches at most
            `min(num_tokens - 1, N, the caller's bound)`, None: unbounded).
            The facade passes it to the native lookup at construction.
        zeroing_from_config: whether the facade takes the zeroing decision
            (new block ids recorded for the worker) from the config's
            `needs_kv_cache_zeroing` field, which the engine ORs over every
            worker, rather than from the layout (Mamba or mixed precision).
        evict_first: whether the pool view's `free_blocks` takes
            `evict_first` (cached blocks to the front of the free queue).
        cached_tokens_probe: whether the manager has `get_num_cached_tokens`
            (the side-effect-free prefix-cache probe).
        common_prefix_blocks: whether the manager has
            `get_num_common_prefix_blocks`.
        layouts: the benchmark layouts (`hybridcache bench`'s configs, `bench
            --step`'s layouts, `replay`'s default trace: "full") this
            release's facade covers; None: every layout.
    """

    version: str
    folder: str
    facade: str
    profile: str
    tools_oracle: bool = False
    native_hasher: bool = False
    native_token_append: bool = False
    hash_lookahead: bool = False
    event_extras: bool = False
    per_request_decode: bool = False
    read_gate: str = "skip_reading_prefix_cache"
    zeroing_from_config: bool = False
    evict_first: bool = False
    cached_tokens_probe: bool = False
    common_prefix_blocks: bool = False
    layouts: tuple[str, ...] | None = None

    @property
    def minor(self) -> str:
        """The release's MAJOR.MINOR, e.g. "0.23"."""
        return ".".join(self.version.split(".")[:2])

    @property
    def package(self) -> str:
        """The release's package, e.g. "hybridcache.releases.v0_23"."""
        return f"hybridcache.releases.{self.folder}"

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
        """The facade class (imports the release's scheduler binding, not vLLM)."""
        cls: type = getattr(importlib.import_module(self.package + ".scheduler"), self.facade)
        return cls


def release_version(version: str) -> str:
    """vLLM's `__version__` without a local label: "0.33.0+cpu" -> "0.33.0"."""
    return version.split("+", 1)[0].strip()


def oracle_venv_of(version: str) -> str:
    """The test-only venv CI makes for vLLM `version` (supported or not yet),
    relative to the repository root: .venv-vllm-MAJOR.MINOR."""
    return ".venv-vllm-" + ".".join(release_version(version).split(".")[:2])


RELEASES: tuple[Release, ...] = (
    Release("0.23.0", "v0_23", "VllmKVCacheManager", profile="whole-block-hits", tools_oracle=True, native_hasher=True,
            native_token_append=True, per_request_decode=True, common_prefix_blocks=True),
    Release("0.33.0", "v0_33", "VllmKVCacheManager033", profile="partial-block-hits", tools_oracle=True, native_hasher=True,
            native_token_append=True, hash_lookahead=True, event_extras=True, common_prefix_blocks=True),
    Release("0.34.0", "v0_34", "VllmKVCacheManager034", profile="partial-block-hits", tools_oracle=True, native_hasher=True,
            native_token_append=True, hash_lookahead=True, event_extras=True, read_gate="prefix_cache_hit_limit",
            zeroing_from_config=True, evict_first=True, cached_tokens_probe=True),
)

# The releases' versions, oldest first (.ci/run makes one oracle venv each).
VERSIONS: tuple[str, ...] = tuple(r.version for r in RELEASES)
