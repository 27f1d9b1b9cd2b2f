"""The recordings the wheel ships (python/hybridcache/traces/) are what the
development package records today, so they cannot rot. `hybridcache
replay`'s: the oldest release's (its requests are hybridcache's own, no vLLM
needed) everywhere, the installed release's where a supported vLLM is
installed; and the replay catches an answer the recording does not have.
`hybridcache bench`'s (recorded on hybridcache alone): the 64-request
workload of every layout and release here (the larger ones:
``python -m hybridcache_dev.bench_trace --check``)."""

from __future__ import annotations

import copy

import pytest

from hybridcache import releases
from hybridcache.tools import configs, trace
from hybridcache.tools.compare import ReplayDivergence
from hybridcache.tools.release_api import release
from hybridcache.tools.bench_trace import CONFIGS, load
from hybridcache_dev import bench_trace, replay_trace


def _check(version: str) -> None:
    shipped = trace.load(version)
    assert shipped == trace.loads(replay_trace.dumps(replay_trace.record(version))), (
        f"the shipped trace of vLLM {version} is stale: python -m hybridcache_dev.replay_trace --release {version}")


def test_oldest_release_trace_is_current() -> None:
    installed = releases.installed_vllm_version()
    if installed is not None and releases.find(installed) is not releases.DEFAULT:
        # Its events and stats would be the installed vLLM's classes.
        pytest.skip(f"vLLM {installed} is installed: the oldest release's trace is checked in its venv or without vLLM")
    _check(releases.DEFAULT.version)


@pytest.mark.vllm()
def test_installed_release_trace_is_current(vllm_available) -> None:
    from hybridcache.tools.oracle import tool_release

    row, note = tool_release("test")
    if row is None:
        pytest.skip(note)
    _check(row.version)


def test_every_release_ships_a_trace() -> None:
    for row in releases.RELEASES:
        assert trace.load(row.version)["release"] == row.version


def test_replay_catches_an_answer_unlike_the_recording() -> None:
    version = releases.DEFAULT.version
    recorded, api = copy.deepcopy(trace.load(version)), release(version)
    op = next(op for op in recorded["ops"] if op[0] == "allocate_slots")
    op[4] = "00000000"  # the digest of an answer no manager gives
    manager = api.tool_facade(configs.kv_cache_config(trace.groups(recorded), recorded["num_blocks"]),
                              recorded["kwargs"])
    with pytest.raises(ReplayDivergence, match="against the recording"):
        trace.replay(recorded, [manager], ["hybridcache"], api)


@pytest.mark.parametrize("version", releases.SUPPORTED_VLLM_VERSIONS)
@pytest.mark.parametrize("config", CONFIGS)
def test_bench_recording_is_current(version: str, config: str) -> None:
    row = releases.find(version)
    assert row is not None
    if not row.covers(config):
        pytest.skip(f"vLLM {version}'s facade does not cover {config}")
    w = bench_trace.Workload(config=config, running=64, release=version)
    assert bench_trace.is_current(w), "stale: python -m hybridcache_dev.bench_trace"


def test_a_shipped_bench_recording_reads_back() -> None:
    w = bench_trace.Workload(config="full", running=64, release=releases.DEFAULT.version)
    live, shipped = bench_trace.record(w), load("full", 64, w.steps, 0, w.release)
    assert shipped is not None
    def calls(rec: object) -> list[list[tuple[object, ...]]]:  # a recording leaves unused arguments None, a shipped one 0
        return [[(c, i, a or 0, b or 0, state) for c, i, a, b, state, _ in ops] for ops in rec.steps]  # type: ignore[attr-defined]

    assert calls(shipped) == calls(live)
    # A shipped request holds every token its stream drew (what it had may stop short of that).
    for drawn, had, drawn_hashes, hashes in zip(shipped.token_ids, live.token_ids, shipped.block_hashes,
                                                live.block_hashes):
        assert drawn[:len(had)] == had and drawn_hashes[:len(hashes)] == hashes
    assert shipped.free_after_step == live.free_after_step and shipped.counters == live.counters
