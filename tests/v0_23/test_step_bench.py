"""`hybridcache bench --step`: the whole-scheduler-step bench runs, checks every
variant's schedule against stock's, and its floor manager really is a
recording (a wrong recording is caught). Timings are not asserted."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

# Compares against vLLM 0.23.0 (tests/conftest.py: left to that release's venv elsewhere).
pytestmark = pytest.mark.vllm("0.23.0")

from hybridcache_dev.oracle import module_needs_vllm  # noqa: E402

vllm = module_needs_vllm("0.23.0")

from hybridcache_dev import step_bench  # noqa: E402
from hybridcache_dev.step_floor import FloorManager, RecordingManager  # noqa: E402


def tiny(layout: str) -> step_bench.StepConfig:
    return step_bench.StepConfig(layout, running=8, steps=12, warmup=6, prompt_len=(20, 90), max_tokens=(4, 30))


@pytest.mark.parametrize("layout", step_bench.LAYOUTS)
def test_step_bench_row(layout: str) -> None:
    row = step_bench.run_config(tiny(layout))
    assert row["verified"] and row["steps"] == 12
    for v in step_bench.VARIANTS:
        assert 0 < row[v]["p50_us"] <= row[v]["p90_us"]
    for share in row["shares"].values():
        assert abs(share["manager"] + share["hashing"] + share["scheduler"] - 1) < 1e-9
        assert 0 < share["manager"] < 1 and 0 < share["hashing"] < 1
    # The in-situ accounts per manager method, the floor's beside them.
    calls = row["manager_calls"]
    assert set(calls) == {"stock", "hybridcache", "hc+native", "floor"}
    for v in calls:
        kinds = {k for k in calls[v] if k.startswith("allocate_slots (")}
        assert kinds and kinds <= {"allocate_slots (new blocks)", "allocate_slots (no new block)",
                                   "allocate_slots (None)"}
    # Every variant answered the same calls (the schedules were identical).
    assert {k: round(c["calls_per_step"], 6) for k, c in calls["hybridcache"].items()} == \
        {k: round(c["calls_per_step"], 6) for k, c in calls["floor"].items()}
    # The step's excess over the floor splits into inside and outside the calls.
    totals = row["manager_totals"]
    assert set(totals) == {"stock", "hybridcache", "hc+native", "floor"}
    for t in totals.values():
        assert 0 < t["manager_us"] < t["step_us"]
    text = step_bench.format_rows([row], "0.23.0")
    assert layout in text and "floor" in text and "allocate_slots (new blocks)" in text
    assert " inside " in text and " outside " in text


def test_excess_over_floor_ranks_methods_by_time_over_the_floor() -> None:
    from hybridcache_dev.step_profile import excess_over_floor

    calls = {
        "hybridcache": {"a": {"calls_per_step": 10.0, "ns_per_call": 500.0},
                        "b": {"calls_per_step": 100.0, "ns_per_call": 300.0},
                        "c": {"calls_per_step": 1.0, "ns_per_call": 50.0}},
        "floor": {"a": {"calls_per_step": 10.0, "ns_per_call": 100.0},
                  "b": {"calls_per_step": 100.0, "ns_per_call": 250.0},
                  "c": {"calls_per_step": 1.0, "ns_per_call": 80.0}},
    }
    rows = excess_over_floor(calls, top=3)
    assert [r[0] for r in rows] == ["b", "a", "c"]
    assert rows[0][4] == pytest.approx(5.0) and rows[1][4] == pytest.approx(4.0)
    assert rows[2][4] == pytest.approx(-0.03)


def test_excess_split_is_inside_plus_outside_the_manager_calls() -> None:
    from hybridcache_dev.step_profile import excess_split

    totals = {"hybridcache": {"step_us": 3000.0, "manager_us": 280.0},
              "floor": {"step_us": 2700.0, "manager_us": 150.0}}
    assert excess_split(totals) == pytest.approx((300.0, 130.0, 170.0))


def test_steps_run_with_the_gc_paused_and_collect_between_them() -> None:
    """The timed run and the profiled pass share one GC regime: no
    collection inside a step (it would be charged to one variant), one every
    16 steps between them, and the GC back on afterwards, early exit too."""
    import gc

    seen: list[tuple[str, int, bool]] = []

    class FakeRun:
        def step(self, i: int) -> dict[str, int]:
            seen.append(("step", i, gc.isenabled()))
            return {"x": i}

    collections = []
    real_collect = gc.collect

    def counting_collect(*args: Any) -> int:
        collections.append(len(seen))
        return real_collect(*args)

    gc.collect = counting_collect  # type: ignore[assignment]
    try:
        out = list(step_bench.gc_paused_steps(FakeRun(), 40,  # type: ignore[arg-type]
                                              before=lambda i: seen.append(("before", i, gc.isenabled()))))
    finally:
        gc.collect = real_collect
    assert out == [(i, {"x": i}) for i in range(40)]
    assert [e[:2] for e in seen] == [(k, i) for i in range(40) for k in ("before", "step")]
    assert not any(enabled for _, _, enabled in seen) and gc.isenabled()
    assert collections == [0, 32, 64]  # before the first step, after steps 15 and 31
    it = step_bench.gc_paused_steps(FakeRun(), 10)  # type: ignore[arg-type]
    next(it)
    assert not gc.isenabled()
    it.close()
    assert gc.isenabled()


def test_the_profiled_pass_steps_with_the_gc_paused(monkeypatch: Any) -> None:
    import gc

    from hybridcache_dev.step_profile import profile_step

    enabled = []
    step = step_bench.Lockstep.step

    def watched(self: Any, i: int, check: bool = True) -> dict[str, int]:
        enabled.append(gc.isenabled())
        return step(self, i, check)

    cfg = tiny("full")
    recording = step_bench.record_stock(cfg)
    monkeypatch.setattr(step_bench.Lockstep, "step", watched)
    profile_step(cfg, recording=recording)
    assert enabled and not any(enabled) and gc.isenabled()


def test_the_stub_model_folder_goes_with_the_process(tmp_path: Any) -> None:
    """Each bench run made a config-only model folder in the temp dir and
    left it there; it is removed when the process exits."""
    import subprocess
    import sys

    code = ("import sys; from hybridcache_dev.step_bench import stub_model_dir; "
            "d = stub_model_dir(sys.argv[1]); import os; assert os.path.isfile(os.path.join(d, 'config.json')); "
            "print(d)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    made = out.stdout.strip().splitlines()[-1]
    assert made.startswith(str(tmp_path)) and not (tmp_path / made).exists()
    assert list(tmp_path.iterdir()) == []


def test_hc_native_requests_alone_carry_the_native_append() -> None:
    """install()'s native append_output_token_ids, bound to each hc+native
    request (the in-process stand-in for the class attribute install() sets);
    vLLM's Request class and the other variants' requests keep vLLM's method."""
    from vllm.v1.request import Request

    from hybridcache import vllm_tokens

    vllms = Request.__dict__["append_output_token_ids"]
    run = step_bench.Lockstep(tiny("full"), step_bench.VARIANTS[:3])
    if run.token_append is None:
        pytest.skip("the binding is built without raw-ffi")
    for i in range(8):
        run.step(i)
    assert Request.__dict__["append_output_token_ids"] is vllms and not vllm_tokens.token_append_installed()
    for v, sched in run.scheds.items():
        request = next(iter(sched.requests.values()))
        bound = request.__dict__.get("append_output_token_ids")
        assert (bound is not None) == (v == "hc+native"), v
        if bound is not None:
            assert bound.__self__ is request and bound.__name__ == "append_output_token_ids"


def test_floor_answers_from_the_recording_only() -> None:
    cfg = tiny("full+3xmamba-align")
    recording = step_bench.record_stock(cfg)
    assert isinstance(recording, RecordingManager)
    assert len(recording.answers["allocate_slots"]) > cfg.running
    floor = FloorManager(recording)
    # O(1) answers: the floor holds no scheduler-visible allocator state.
    assert not hasattr(floor, "req_to_blocks") and not hasattr(floor, "_inner")


def test_a_wrong_recording_is_caught(monkeypatch: Any) -> None:
    cfg = tiny("full")
    real = step_bench.record_stock

    def off_by_one(c: step_bench.StepConfig) -> Any:
        rec = real(c)
        rec.answers["allocate_slots"].pop(cfg.running)  # every later answer shifts by one
        return rec

    monkeypatch.setattr(step_bench, "record_stock", off_by_one)
    with pytest.raises((step_bench.Diverged, StopIteration, AttributeError, TypeError)):
        step_bench.timed_run(cfg)


def test_cli_without_vllm_says_so_in_one_line(monkeypatch: Any, capsys: Any) -> None:
    def missing() -> str:
        raise step_bench.StepBenchUnavailable("hybridcache bench --step: needs vLLM 0.23.0 and torch (pip install ...)")

    monkeypatch.setattr(step_bench, "load_vllm", missing)
    assert step_bench.main(argparse.Namespace(quick=True)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs vLLM" in err[0]
