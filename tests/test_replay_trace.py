"""The recorded traces `hybridcache replay` ships (python/hybridcache/traces/)
are what the development package's simulation records today, so they cannot
rot: the oldest release's (its requests are hybridcache's own, no vLLM
needed) everywhere, the installed release's where a supported vLLM is
installed. And the replay catches an answer the recording does not have."""

from __future__ import annotations

import copy

import pytest

from hybridcache import releases
from hybridcache.tools import configs, trace
from hybridcache.tools.compare import ReplayDivergence
from hybridcache.tools.release_api import release
from hybridcache_dev import replay_trace


def _check(version: str) -> None:
    shipped = trace.load(version)
    assert shipped == trace.loads(trace.dumps(replay_trace.record(version))), (
        f"the shipped trace of vLLM {version} is stale: python -m hybridcache_dev.replay_trace --release {version}")


def test_oldest_release_trace_is_current() -> None:
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
    manager = api.tool_facade(configs.hybridcache_kv_cache_config(trace.groups(recorded), recorded["num_blocks"]),
                              recorded["kwargs"])
    with pytest.raises(ReplayDivergence, match="against the recording"):
        trace.replay(recorded, [manager], ["hybridcache"], api)
