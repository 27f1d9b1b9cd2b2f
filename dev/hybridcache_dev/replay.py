"""The replay's live simulation (`simulation.ReplaySimulation`) against
several managers, every output compared: `replay` and `run_single` (the
parity tests), and ``python -m hybridcache_dev.replay`` on any mix of KV-cache
groups, block sizes, seed range and options, against vLLM's manager or
hybridcache's. The wheel's ``hybridcache replay`` applies a recording of the
default configuration instead (`replay_trace`)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from hybridcache import releases
from hybridcache.tools.compare import Fanout, ReplayDivergence, pool_state, same
from hybridcache.tools.oracle import quiet_logs
from hybridcache.tools.release_api import ReleaseApi, release

from .configs import format_mix, hybridcache_manager, vllm_manager
from .replay_config import DEFAULT_CONFIG, ReplayConfig
from .simulation import ReplaySimulation, ReplaySummary

ManagerFactory = Callable[[ReplayConfig], Any]


class PoolCheckedFanout(Fanout):
    """A `Fanout` that also compares the pools after every operation (slow;
    pins a divergence that no return value shows to the call that caused it)."""

    def call(self, op: str, fn: Callable[[Any, int], Any], norm: Callable[[Any], Any] = same) -> list[Any]:
        results = super().call(op, fn, norm)
        pools = [pool_state(m) for m in self.managers]
        if any(p != pools[0] for p in pools[1:]):
            raise ReplayDivergence(self.seed, self.step, f"block_pool state after {op}", list(zip(self.names, pools)))
        return results


def _run(config: ReplayConfig, seed: int, managers: Sequence[Any], names: Sequence[str],
         api: ReleaseApi | None = None) -> ReplaySummary:
    checked = config.compare_pool_every_op and len(managers) > 1
    fanout = (PoolCheckedFanout if checked else Fanout)(managers, names, seed)
    # vLLM warns on every refused prefix-cache reset, which the trace provokes.
    with quiet_logs():
        return ReplaySimulation(config, seed, fanout, api).run()


def replay(config: ReplayConfig, seed: int, factories: Sequence[ManagerFactory], names: Sequence[str] | None = None,
           release_name: str = releases.DEFAULT.version) -> ReplaySummary:
    """Simulates one seeded trace against every manager, comparing all outputs.

    The first factory builds the reference manager. The calls are spelled as
    the scheduler of vLLM `release_name` issues them (`release_factories`
    gives that release's managers). Raises ReplayDivergence on the first
    operation whose normalized outputs differ.
    """
    if names is None:
        names = [f"manager{i}" for i in range(len(factories))]
    return _run(config, seed, [factory(config) for factory in factories], names, release(release_name))


def run_single(config: ReplayConfig, seed: int, factory: ManagerFactory) -> ReplaySummary:
    """Simulates one seeded trace against a single manager (no comparison), timed."""
    return _run(config, seed, [factory(config)], ["manager"])


def hybridcache_factory(config: ReplayConfig) -> Any:
    """hybridcache's KVCacheManager for `config`, on its own config classes
    (neither vLLM nor torch needed)."""
    return hybridcache_manager(config.hybridcache_kv_cache_config(), config.manager_kwargs())


def release_factories(release_name: str) -> tuple[ManagerFactory, ManagerFactory]:
    """(vLLM's manager, hybridcache's facade) for vLLM release `release_name`,
    both on vLLM's config classes, as that release's scheduler builds them."""
    api = release(release_name)
    return (lambda c: api.tool_vllm(c.vllm_kv_cache_config(), c.manager_kwargs()),
            lambda c: api.tool_facade(c.vllm_kv_cache_config(), c.manager_kwargs()))


def live(seed: int, requests: int | None, row: releases.Release | None) -> tuple[dict[str, Any], str]:
    """``hybridcache replay --seed / --requests``: the default configuration
    simulated live (against vLLM release `row`'s manager, or hybridcache
    alone); (summary, "N requests")."""
    config = DEFAULT_CONFIG if requests is None else dataclasses.replace(DEFAULT_CONFIG, num_requests=requests)
    if row is None:
        summary = run_single(config, seed, hybridcache_factory)
    else:
        summary = replay(config, seed, list(release_factories(row.version)), ["vllm", "hybridcache"], row.version)
    return summary.as_dict(), f"{config.num_requests} requests"


# Mixes of the CLI's --mix presets (also usable as --mix NAME).
MIX_PRESETS: dict[str, str] = {
    "full": "full",
    "full-sw": "full,sw:64",
    "full-mamba": "full,mamba",
    "full-mamba-spec": "full,mamba:align:2",
    "sw-mamba": "sw:64,mamba",
    "full-sw-mamba": "full,sw:64,mamba",
    "full-mamba3": "full,mamba*3",
    "interleaved": "full,sw:48,full,sw:48",
    "two-windows": "full,sw:32,sw:96",
    "chunked": "full,chunked:64",
    "mixed-sizes": "full@16,sw:64@32",
}


def vllm_factory(config: ReplayConfig) -> Any:
    """vLLM's own KVCacheManager for `config`, with the oldest release's arguments."""
    return vllm_manager(config.vllm_kv_cache_config(), config.manager_kwargs())


def hybridcache_on_vllm_config_factory(config: ReplayConfig) -> Any:
    """hybridcache's KVCacheManager on vLLM's config classes (duck typing)."""
    return hybridcache_manager(config.vllm_kv_cache_config(), config.manager_kwargs())


_FACTORIES: dict[str, ManagerFactory] = {"hybridcache": hybridcache_factory, "vllm": vllm_factory}


def _cli_config(args: argparse.Namespace) -> ReplayConfig:
    mix = MIX_PRESETS.get(args.mix, args.mix)
    changes: dict[str, Any] = dict(
        mix=mix,
        num_requests=args.requests,
        enable_caching=not args.no_caching,
        use_eagle=args.eagle,
        hash_block_size=args.hash_block_size,
    )
    if args.block_size is not None:
        changes["block_size"] = args.block_size
    if args.max_drafts is not None:
        changes["max_drafts"] = args.max_drafts
    if args.num_blocks is not None:
        return DEFAULT_CONFIG.with_changes(num_blocks=args.num_blocks, **changes)
    # Size the pool from the mix: room for a few max-length requests.
    probe = DEFAULT_CONFIG.with_changes(num_blocks=1 << 30, **changes)
    need = probe.min_num_blocks() + 1
    num_blocks = DEFAULT_CONFIG.num_blocks if need <= DEFAULT_CONFIG.num_blocks else need * 3 // 2
    return probe.with_changes(num_blocks=num_blocks)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Replay seeded KV-cache manager traces.")
    parser.add_argument("--impl", choices=sorted(_FACTORIES), default="hybridcache")
    parser.add_argument("--compare", choices=sorted(_FACTORIES), default=None,
                        help="also replay against this manager and compare every output")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--requests", type=int, default=DEFAULT_CONFIG.num_requests)
    parser.add_argument(
        "--mix", default="full",
        help="the model's KV-cache groups: a preset (" + ", ".join(sorted(MIX_PRESETS))
        + ") or groups such as 'full,sw:128@32,mamba:align:2,chunked:64,cross,full+eagle' "
        "(KIND[:ARGS][@BLOCK_SIZE][+eagle][*COUNT]; mamba:MODE:NUM_SPECULATIVE_BLOCKS)",
    )
    parser.add_argument("--block-size", type=int, default=None,
                        help="block size of groups without @SIZE (default %(default)s: 16)")
    parser.add_argument("--hash-block-size", type=int, default=None,
                        help="default: as vLLM resolves it (GCD of group block sizes)")
    parser.add_argument("--num-blocks", type=int, default=None,
                        help="default: sized from the mix")
    parser.add_argument("--max-drafts", type=int, default=None)
    parser.add_argument("--no-caching", action="store_true", help="disable prefix caching")
    parser.add_argument("--eagle", action="store_true", help="EAGLE: lookahead slots, hit pruning")
    args = parser.parse_args(argv)
    try:
        config = _cli_config(args)
    except ValueError as e:
        parser.error(str(e))
    factories, release_name = dict(_FACTORIES), releases.DEFAULT.version
    if "vllm" in (args.impl, args.compare):
        # vLLM's manager is the installed release's; hybridcache's is its facade for that release.
        from hybridcache.tools.oracle import tool_release

        found, note = tool_release("python -m hybridcache_dev.replay")
        if found is None:
            parser.error(note)
        release_name = found.version
        factories["vllm"], factories["hybridcache"] = release_factories(release_name)
        try:
            # The facade's own layout check says what it covers.
            factories["hybridcache"](config)
        except NotImplementedError as e:
            parser.error(f"vLLM {found.version}: hybridcache's facade does not cover the mix "
                         f"{format_mix(config.mix)!r} yet: {e}")
    print(config.describe())
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        if args.compare:
            pair = [factories[args.compare], factories[args.impl]]
            summary = replay(config, seed, pair, [args.compare, args.impl], release_name)
        else:
            summary = run_single(config, seed, factories[args.impl])
        print(summary.as_dict())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
