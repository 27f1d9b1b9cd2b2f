"""Seeded scheduler-like traces replayed against KVCacheManager implementations.

A small, deterministic scheduler simulation (not vLLM's scheduler, but driving
the manager the way vLLM's ``Scheduler.schedule`` does, with the calls
spelled as the compared release's scheduler issues them (e.g. a 3-tuple
lookup, ``record_prefix_cache_stats``, ``has_scheduled_reqs`` and per-step
drains where the release has them: `tools.release_api`) issues every public call of vLLM's
v1 ``KVCacheManager`` API: prefix-cache lookups, chunked
prefill, speculative decoding with changing draft counts, EAGLE lookahead,
external (connector) tokens, delayed caching, preemption, aborts, evictions
and prefix-cache resets.

The model's KV-cache groups are described by a *mix* (``ReplayConfig.mix``):
full attention, sliding window, chunked local attention, Mamba (``none`` /
``all`` / ``align``, with speculative blocks) and cross attention, each with its
own block size and EAGLE flag. One simulation serves every mix; where vLLM's
scheduler treats hybrid models specially the simulation does too (Mamba
"align" block-aligned prefill chunks, ``new_step_starts`` every step, encoder
tokens for cross attention, no partial KV-load failures with several groups).

``replay`` applies each operation to several managers at once (same request
objects) and raises ``ReplayDivergence`` on the first differing output;
``run_single`` drives one manager and times it.

Nothing here imports torch or vLLM at module import time; the factories of
``release_factories`` import both when called, ``hybridcache_factory`` neither.

The pieces live in `hybridcache.tools` (groups and config builders,
`ReplayConfig`, the simulation, the comparisons); this module holds the entry
points and the manager factories of ``hybridcache replay``. The development
package's ``python -m hybridcache_dev.replay`` replays any mix and seed range.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import releases
from .tools.compare import Fanout, ReplayDivergence
from .tools.configs import format_mix, hybridcache_manager
from .tools.oracle import quiet_logs
from .tools.release_api import ReleaseApi, release
from .tools.replay_config import DEFAULT_CONFIG, ReplayConfig
from .tools.simulation import ReplaySimulation, ReplaySummary

ManagerFactory = Callable[[ReplayConfig], Any]


# --------------------------------------------------------------------------
# Entry points.
# --------------------------------------------------------------------------


def _run(
    config: ReplayConfig, seed: int, managers: Sequence[Any], names: Sequence[str], api: ReleaseApi | None = None
) -> ReplaySummary:
    fanout = Fanout(managers, names, seed, config.compare_pool_every_op)
    # vLLM warns on every refused prefix-cache reset, which the trace provokes.
    with quiet_logs():
        return ReplaySimulation(config, seed, fanout, api).run()


def replay(
    config: ReplayConfig,
    seed: int,
    factories: Sequence[ManagerFactory],
    names: Sequence[str] | None = None,
    release_name: str = releases.DEFAULT.version,
) -> ReplaySummary:
    """Replay one seeded trace against every manager, comparing all outputs.

    The first factory builds the reference manager. The calls are spelled as
    the scheduler of vLLM `release_name` issues them (`release_factories`
    gives that release's managers). Raises ReplayDivergence on the first
    operation whose normalized outputs differ.
    """
    if names is None:
        names = [f"manager{i}" for i in range(len(factories))]
    managers = [factory(config) for factory in factories]
    return _run(config, seed, managers, names, release(release_name))


def run_single(config: ReplayConfig, seed: int, factory: ManagerFactory) -> ReplaySummary:
    """Replay one seeded trace against a single manager (no comparison), timed."""
    return _run(config, seed, [factory(config)], ["manager"])


def hybridcache_factory(config: ReplayConfig) -> Any:
    """hybridcache's KVCacheManager for `config`, on its own config classes
    (so the CLI needs neither vLLM nor torch)."""
    return hybridcache_manager(config.hybridcache_kv_cache_config(), config.manager_kwargs())


def release_factories(release_name: str) -> tuple[ManagerFactory, ManagerFactory]:
    """(vLLM's manager, hybridcache's facade) for vLLM release `release_name`,
    both on vLLM's config classes, as that release's scheduler builds them."""
    api = release(release_name)
    return (lambda c: api.tool_vllm(c.vllm_kv_cache_config(), c.manager_kwargs()),
            lambda c: api.tool_facade(c.vllm_kv_cache_config(), c.manager_kwargs()))


__all__ = [
    "DEFAULT_CONFIG",
    "ReplayConfig",
    "ReplayDivergence",
    "ReplaySummary",
    "format_mix",
    "hybridcache_factory",
    "release_factories",
    "replay",
    "run_single",
]
