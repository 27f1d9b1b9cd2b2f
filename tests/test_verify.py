"""`hybridcache verify`'s own logic, without an engine: its arguments, its
workloads and how it names a divergence (the engine runs are in tests/e2e)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridcache.__main__ import build_parser
from hybridcache.verify import Side, first_divergence, parse_engine_args, report
from hybridcache.verify_workload import WORDS, builtin, from_file


def _side(name: str, tokens: list[list[int]], **counters: object) -> Side:
    result = {"tokens": tokens, "counters": {"prefix_cache_hits": 4, **counters},
              "timings": {"engine_start_s": 1.0, "generate_s": 2.0, "output_tokens": sum(map(len, tokens)),
                          "ttft_sum_s": 0.5, "ttft_count": 2},
              "processes": [{"pid": 1, "process": "MainProcess", "manager": "m.KVCacheManager", "steps": 10,
                             "scheduler_ns": 50_000, "install_lines": 0}]}
    return Side(name, result, "")


def test_engine_args_json_then_pairs() -> None:
    args = parse_engine_args(["block-size=16", "speculative_config={\"method\": \"ngram\"}", "dtype=float32"],
                             '{"enforce_eager": true, "block_size": 32}')
    assert args == {"enforce_eager": True, "block_size": 16, "speculative_config": {"method": "ngram"},
                    "dtype": "float32"}
    with pytest.raises(ValueError):
        parse_engine_args(["no-equals"], None)
    with pytest.raises(ValueError):
        parse_engine_args([], "[1, 2]")


def test_first_divergence_names_the_request_and_the_token() -> None:
    stock = _side("stock", [[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    assert first_divergence(stock, _side("hybridcache", [[1, 2, 3], [4, 5, 6], [7, 8, 9]])) is None
    assert first_divergence(stock, _side("hybridcache", [[1, 2, 3], [4, 0, 6], [7, 8, 0]])) == \
        "request 1, token 1: stock 5, hybridcache 0"
    assert first_divergence(stock, _side("hybridcache", [[1, 2, 3], [4, 5], [7, 8, 9]])) == \
        "request 1, token 2: stock 6, hybridcache end"
    assert first_divergence(stock, _side("hybridcache", [[1, 2, 3], [4, 5, 6], [7, 8, 9]], prefix_cache_hits=3)) \
        == "vLLM counter prefix_cache_hits: stock 4, hybridcache 3"


def test_report_sets_the_sides_side_by_side() -> None:
    text = report(_side("stock", [[1, 2]]), _side("hybridcache", [[1, 2]]))
    assert text.splitlines()[0].split() == ["stock", "hybridcache"]
    assert "scheduler time per step (us)" in text and "5.0" in text
    assert "time to first token, mean (ms)" in text and "250.0" in text


def test_builtin_workload_shares_prefixes_and_repeats_phrases() -> None:
    waves = builtin(requests=12, max_tokens=8)
    assert len(waves) == 3 and sum(map(len, waves)) >= 10
    first, second = waves[0][0].prompt.split(), waves[1][0].prompt.split()
    assert first[:40] == second[:40]  # a shared prefix across calls: prefix-cache hits
    assert max(r.max_tokens for r in waves[2]) == 16  # the long last wave
    assert all(w in WORDS for wave in waves for r in wave for w in r.prompt.split())
    assert builtin(12, 8) == waves  # the same every time


def test_prompts_file_waves(tmp_path: Path) -> None:
    path = tmp_path / "prompts.txt"
    path.write_text("a b c\nd e\n\n\nf g\n")
    waves = from_file(path, 5)
    assert [[r.prompt for r in w] for w in waves] == [["a b c", "d e"], ["f g"]]
    path.write_text("\n\n")
    with pytest.raises(ValueError):
        from_file(path, 5)


def test_the_command_parses_and_a_bad_argument_exits_2(tmp_path: Path) -> None:
    args = build_parser().parse_args(["verify", "m", "--engine-arg", "a=1", "--num-blocks", "24"])
    assert args.command == "verify" and args.engine_arg == ["a=1"] and args.num_blocks == 24
    bad = build_parser().parse_args(["verify", "m", "--engine-arg", "oops", "--workdir", str(tmp_path)])
    assert bad.func(bad) == 2
