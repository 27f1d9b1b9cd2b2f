"""`hybridcache replay` and `hybridcache bench` on vLLM 0.33.0: each compares
hybridcache's 0.33.0 facade with vLLM 0.33.0's own manager, call by call,
with the calls spelled as 0.33.0's scheduler issues them; a lie is caught;
layouts the facade does not cover are skipped with a reason; an unsupported
vLLM gets the message listing the supported releases."""

from __future__ import annotations

import dataclasses
import json

import pytest
from liars import FakeBlocks, LiesOnce

from hybridcache import bench
from hybridcache.__main__ import main
from hybridcache.tools.compare import ReplayDivergence
from hybridcache_dev.replay import DEFAULT_CONFIG, release_factories, replay
from hybridcache.tools import bench_trace
from hybridcache_dev.bench_trace import Workload, record

pytestmark = pytest.mark.vllm("0.33.0")


def test_replay_verifies_against_vllm_033(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--requests", "80"]) == 0
    out = capsys.readouterr().out
    assert "and vLLM 0.33.0" in out and "verified identical to vLLM 0.33.0" in out
    assert "ran hybridcache only" not in out


@pytest.mark.parametrize("mix,eagle", [("full-sw", ["--eagle"]), ("full-sw", []), ("full,chunked:32", [])])
def test_replay_cli_hybrid_attention_against_vllm_033(mix: str, eagle: list[str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from hybridcache_dev.replay import main as replay_main

    # A divergence raises; the printed summaries show the traces ran.
    assert replay_main(["--compare", "vllm", "--mix", mix, "--requests", "60", *eagle]) == 0
    out = capsys.readouterr().out
    assert "'seed': 0" in out and "'ops':" in out


def test_replay_builds_the_033_managers() -> None:
    vllm_factory, hc_factory = release_factories("0.33.0")
    assert type(vllm_factory(DEFAULT_CONFIG)).__module__ == "vllm.v1.core.kv_cache_manager"
    assert type(hc_factory(DEFAULT_CONFIG)).__name__ == "VllmKVCacheManager033"  # the class the scheduler builds


def _one_more_block(blocks):
    if blocks is None or not any(blocks.get_block_ids()):
        return None
    return FakeBlocks(tuple([*g, 999_999] for g in blocks.get_block_ids()))


def test_replay_catches_a_lie_033() -> None:
    vllm_factory, hc_factory = release_factories("0.33.0")
    liar = lambda c: LiesOnce(vllm_factory(c), "allocate_slots", _one_more_block)  # noqa: E731
    config = dataclasses.replace(DEFAULT_CONFIG, num_requests=40)
    with pytest.raises(ReplayDivergence, match="allocate_slots"):
        replay(config, 0, [hc_factory, liar], ["hybridcache", "liar"], "0.33.0")


def test_bench_quick_against_vllm_033(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", "--json", "--no-progress", "--running", "64", "--steps", "10",
                 "--scale-blocks", "1000", "--batched"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["vllm"] == "0.33.0"
    # Every layout, Mamba align with prefix caching too (the drains checked
    # each step include the new block ids recorded for zeroing).
    assert [r["config"] for r in report["results"]] == ["full", "full+swa", "full+3xmamba-align"]
    for r in report["results"]:
        assert r["compared"] == ["hybridcache", "vllm"]
        assert r["verified"] is True, r.get("divergence")
        assert r["impls"]["vllm"]["step"]["count"] == 10 and r["speedup"]["step_p50"] > 0
    assert report["skipped"] == []
    assert report["batched"] is None and "not run on vLLM 0.33.0" in report["batched_note"]
    assert report["scale"]["vllm"]["free_blocks"] == 1000 - 1


def test_bench_records_033_scheduler_calls_and_catches_a_wrong_table() -> None:
    rec = record(Workload(config="full", running=8, steps=5, release="0.33.0"))
    codes = {op[0] for ops in rec.steps for op in ops}
    assert {bench_trace.ADMIT_KW, bench_trace.RECORD_STATS, bench_trace.DRAINS, bench_trace.CACHE_BLOCKS} <= codes
    # 0.33.0's scheduler no longer asks for common-prefix blocks.
    assert not codes & {bench_trace.ALLOC_NEW, bench_trace.COMMON_PREFIX}
    impls = bench.replay_timed(rec, [("hybridcache", bench_trace.make_hybridcache_manager),
                                     ("vllm", bench_trace.make_vllm_manager)])
    assert type(impls[0].manager).__name__ == "VllmKVCacheManager033"  # the class the scheduler builds
    assert type(impls[1].manager).__module__ == "vllm.v1.core.kv_cache_manager"
    step, i = next(
        (s, i) for s, ops in enumerate(rec.steps) for i, op in enumerate(ops)
        if op[0] == bench_trace.ADMIT_KW and isinstance(op[5], tuple) and any(op[5])
    )
    code, idx, a, b, state, expected = rec.steps[step][i]
    rec.steps[step][i] = (code, idx, a, b, state, tuple([*g, 999_999] for g in expected))
    with pytest.raises(bench.BenchDivergence, match=f"vllm differs from the recording at step {step}"):
        bench.replay_timed(rec, [("vllm", bench_trace.make_vllm_manager)])


def test_bench_skips_a_layout_the_facade_does_not_cover(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from hybridcache import releases

    # A release row that covers full attention only (as 0.33.0's did before
    # its facade ran Mamba prefix caching).
    rows = tuple(dataclasses.replace(r, layouts=("full",)) if r.version == "0.33.0" else r for r in releases.RELEASES)
    monkeypatch.setattr(releases, "RELEASES", rows)
    assert main(["bench", "--no-progress", "--config", "full+3xmamba-align", "--running", "8", "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "full+3xmamba-align skipped on vLLM 0.33.0" in err and "nothing to run" in err


def test_unsupported_vllm_lists_the_supported_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    release, note = bench.tool_release("hybridcache bench")
    assert release is None
    assert "supports these vLLM releases only: 0.23.0, 0.33.0" in note and "0.99.0" in note


def test_unsupported_vllm_replays_hybridcache_alone_and_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    assert main(["replay", "--requests", "40"]) == 0
    out = capsys.readouterr().out
    assert "the installed vLLM is 0.99.0: ran hybridcache only" in out and "verified identical" not in out


def test_replay_cli_refuses_a_mix_the_033_facade_does_not_cover(capsys: pytest.CaptureFixture[str]) -> None:
    from hybridcache_dev.replay import main as replay_main

    with pytest.raises(SystemExit) as e:
        replay_main(["--compare", "vllm", "--mix", "full@16,cross@16,mamba:none@16", "--no-caching",
                     "--requests", "10"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "does not cover the mix 'full@16,cross@16,mamba:none@16'" in err and "beside cross_attention" in err


def test_replay_covers_a_wide_mamba_block_beside_a_block_granular_window(capsys: pytest.CaptureFixture[str]) -> None:
    # Refused until 0.33.0's rule there (partial hash hits off, Mamba states
    # still keyed inside blocks) was proven; now replayed against vLLM.
    from hybridcache_dev.replay import main as replay_main

    # A divergence from vLLM's outputs raises; every output is compared.
    assert replay_main(["--compare", "vllm", "--mix", "full@16,sw:64@32,mamba:align@64", "--hash-block-size", "16",
                        "--requests", "40", "--seeds", "2"]) == 0
    assert capsys.readouterr().out.count("'finished'") == 2
