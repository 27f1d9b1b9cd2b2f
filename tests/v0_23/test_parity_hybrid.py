"""Differential replay of hybrid models: hybridcache.KVCacheManager against
vLLM 0.23.0's, over every KV-cache group mix vLLM 0.23.0 supports.

Each cell is a mix (full / sliding window / chunked local / Mamba none-all-align
/ cross attention groups, block sizes, EAGLE groups), replayed with EAGLE off
and on (where vLLM allows it) over several seeds. Every output of every call
is compared after every call (see hybridcache.replay and hybridcache_dev.replay); the coverage checks make
sure each cell really reached preemptions, failed allocations, prefix hits,
Mamba block-aligned chunking, drafts, connector tokens and events.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest

# Compares against vLLM 0.23.0 (tests/conftest.py: left to that release's venv elsewhere).
pytestmark = pytest.mark.vllm("0.23.0")

from liars import FakeBlocks, LiesOnce
from hybridcache.tools.compare import ReplayDivergence
from hybridcache_dev.replay import ReplayConfig, hybridcache_factory, replay, run_single
from hybridcache_dev.configs import GroupSpec, format_mix, parse_mix
from hybridcache_dev.replay import hybridcache_on_vllm_config_factory, main, vllm_factory

SEEDS = range(4)


@dataclasses.dataclass(frozen=True)
class Cell:
    name: str
    mix: str
    caching: bool = True
    # EAGLE variants replayed: off, on (all groups drop the EAGLE block unless
    # some group is flagged "+eagle" in the mix).
    eagle: tuple[bool, ...] = (False, True)
    # Draft-count ceilings, one per seed (0: no speculative decoding).
    drafts: tuple[int, ...] = (4, 8, 2, 0)
    extra: tuple[tuple[str, object], ...] = ()


CELLS = [
    Cell("full-sw", "full,sw:64"),
    Cell("full-mamba_all", "full,mamba:all"),
    Cell("full-mamba_align", "full,mamba:align"),
    # vLLM sizes num_speculative_blocks to the draft count; a larger draft
    # count (vLLM's own regression test for #39271) must work too.
    Cell("full-mamba_align_spec2", "full,mamba:align:2", drafts=(2, 5, 1, 2)),
    Cell("full-mamba_all_spec2", "full,mamba:all:2", drafts=(2, 1, 2, 0)),
    Cell("sw-mamba_align", "sw:64,mamba:align"),
    # Identical Mamba specs: one spec group of three KV-cache groups.
    Cell("full-mamba_align_x3", "full,mamba:align*3"),
    Cell("full-sw-mamba_align", "full,sw:64,mamba:align"),
    # A draft model: lookahead slots without EAGLE's hit pruning.
    Cell("draft_model-full-sw-mamba_align", "full,sw:64,mamba:align", eagle=(False,),
         extra=(("num_lookahead_tokens", 3),)),
    # A step budget below the window and off the block grid.
    Cell("small_budget-full-sw-mamba_align", "full,sw:100,mamba:align",
         extra=(("max_num_batched_tokens", 40),)),
    # Identical specs group together across the interleaving.
    Cell("interleaved", "full,sw:48,full,sw:48"),
    Cell("two_windows", "full,sw:32,sw:96"),
    # vLLM has no EAGLE drop for chunked local attention: only the full
    # attention group may be the EAGLE group.
    Cell("full-chunked", "full,chunked:64", eagle=(False,)),
    Cell("full_eagle-chunked", "full+eagle,chunked:64", eagle=(True,)),
    Cell("full_eagle-sw", "full+eagle,sw:64", eagle=(True,)),
    Cell("full_eagle-mamba_align", "full+eagle,mamba:align", eagle=(True,)),
    # Mixed block sizes: scheduler_block_size is the LCM, hash_block_size
    # the GCD (smaller than some groups' block size).
    Cell("mixed-full16-sw32", "full@16,sw:64@32"),
    Cell("mixed-full16-sw32-sw64", "full@16,sw:48@32,sw:100@64"),
    Cell("mixed-full16-chunked32", "full@16,chunked:64@32", eagle=(False,)),
    Cell("mixed-full32-sw32-hash16", "full@32,sw:64@32", extra=(("hash_block_size", 16),)),
    # Mamba must have the smallest block size (vLLM's cache_config.block_size)
    # or vLLM backs hash_block_size off to the LCM, which its coordinator
    # rejects; the Mamba "align" chunks follow the smallest block size.
    Cell("mixed-full64-mamba_all32", "full@64,mamba:all@32"),
    Cell("mixed-full64-mamba_align32", "full@64,mamba:align@32"),
    # Reachable through the manager's constructor (not vLLM's engine).
    Cell("mixed-full32-mamba_align64-hash32", "full@32,mamba:align@64",
         extra=(("hash_block_size", 32),)),
    # Prefix caching off: vLLM forces Mamba "none" with block_size =
    # max_model_len (scheduler_block_size becomes the LCM with it).
    Cell("nocache-full-mamba", "full,mamba", caching=False),
    Cell("nocache-full-mamba_spec2", "full,mamba:none:2", caching=False, drafts=(2, 1, 2, 2)),
    Cell("nocache-full-sw", "full,sw:64", caching=False),
    Cell("nocache-full-chunked", "full,chunked:64", caching=False),
    Cell("nocache-full-sw-mamba", "full,sw:64,mamba", caching=False),
    # Encoder-decoder: cross attention (prefix caching is always off).
    Cell("nocache-full-cross", "full,cross", caching=False),
]


def _config(cell: Cell, eagle: bool, seed: int) -> ReplayConfig:
    """Small pools (a third above one max-length request, so allocation
    failures and preemptions are frequent) and chunked prefill."""
    kwargs = dict(
        mix=cell.mix,
        num_blocks=1 << 20,
        enable_caching=cell.caching,
        enable_kv_cache_events=True,
        use_eagle=eagle,
        log_stats=seed != 1,
        max_drafts=cell.drafts[seed % len(cell.drafts)],
        num_requests=60,
        max_model_len=384,
        max_prompt_len=300,
        max_shared_prefix_len=256,
        max_num_batched_tokens=128,
    )
    kwargs.update(cell.extra)
    probe = ReplayConfig(**kwargs)
    need = probe.min_num_blocks()
    return probe.with_changes(num_blocks=need + 1 + need // 3)


def _cell(name: str) -> Cell:
    return next(c for c in CELLS if c.name == name)


def _params():
    for cell in CELLS:
        for eagle in cell.eagle:
            yield pytest.param(cell, eagle, id=f"{cell.name}-{'eagle' if eagle else 'noeagle'}")


def _total(summaries, name: str) -> int:
    return sum(getattr(s, name) for s in summaries)


def _check_coverage(summaries, cfg: ReplayConfig) -> None:
    """The traces must actually reach the interesting paths."""
    total = lambda name: _total(summaries, name)  # noqa: E731
    assert total("ops") >= 3000
    assert total("finished") > 0
    assert total("failed_allocations") > 0  # allocate_slots returned None
    assert total("preemptions") > 0
    assert total("evict_calls") > 0
    assert total("successful_resets") >= len(summaries)
    assert total("draft_tokens") > 0
    if cfg.has_cross_attention:
        assert total("external_tokens") == 0
    else:
        assert total("external_tokens") > 0 and total("async_loads") > 0
    if cfg.enable_caching:
        assert total("hit_requests") > 0 and total("cache_hit_tokens") > 0
        assert total("events") > 0
    else:
        assert total("cache_hit_tokens") == 0
    if cfg.mamba_align:
        assert total("split_trims") > 0 and total("split_blocked") > 0
    else:
        assert total("split_trims") == 0


@pytest.fixture(scope="module", autouse=True)
def _quiet_vllm():
    """vLLM logs every failed prefix-cache reset; keep the output readable."""
    logger = logging.getLogger("vllm")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.mark.parametrize("cell,eagle", list(_params()))
def test_hybrid_parity_with_vllm(cell: Cell, eagle: bool, vllm_available):
    summaries = []
    for seed in SEEDS:
        cfg = _config(cell, eagle, seed)
        summaries.append(
            replay(cfg, seed, [vllm_factory, hybridcache_factory], ["vllm", "hybridcache"])
        )
    _check_coverage(summaries, cfg)


@pytest.mark.parametrize("name", ["full-sw-mamba_align", "mixed-full16-sw32", "nocache-full-cross"])
def test_hybridcache_on_vllm_config_classes(name: str, vllm_available):
    """hybridcache built on vLLM's own spec classes (duck typing) and on its
    own classes answer exactly as vLLM does."""
    cfg = _config(_cell(name), eagle=True, seed=0)
    summary = replay(
        cfg,
        7,
        [vllm_factory, hybridcache_on_vllm_config_factory, hybridcache_factory],
        ["vllm", "hybridcache(vllm config)", "hybridcache"],
    )
    assert summary.ops >= 1000 and summary.preemptions > 0


def test_driver_agrees_with_itself_on_hybrid(vllm_available):
    """Two vLLM managers never diverge on a hybrid trace, and a seed always
    gives the same trace (the generator needs no torch: hybridcache alone)."""
    cfg = _config(_cell("full-sw-mamba_align"), eagle=True, seed=0)
    first = replay(cfg, 0, [vllm_factory, vllm_factory])
    again = run_single(cfg, 0, hybridcache_factory)
    assert _without_time(first) == _without_time(again)
    assert _without_time(first) != _without_time(run_single(cfg, 1, hybridcache_factory))


def _without_time(summary):
    return dataclasses.replace(summary, seconds=0.0)


# --------------------------------------------------------------------------
# The detector on hybrid outputs: a manager that lies in a non-first group.
# --------------------------------------------------------------------------


def _drop_last_group_block(ids):
    if not ids[-1]:
        return None
    return (*ids[:-1], list(ids[-1])[:-1])


def _shift_last_group(blocks):
    if blocks is None or not blocks.get_block_ids()[-1]:
        return None
    ids = blocks.get_block_ids()
    return FakeBlocks((*ids[:-1], [b + 1 for b in ids[-1]]))


HYBRID_LIES = {
    "get_block_ids": _drop_last_group_block,
    "allocate_slots": _shift_last_group,
    "get_computed_blocks": lambda r: (_shift_last_group(r[0]), r[1]) if _shift_last_group(r[0]) else None,
}


@pytest.mark.parametrize("method", sorted(HYBRID_LIES))
def test_hybrid_divergence_is_detected(method: str, vllm_available):
    cfg = _config(_cell("full-sw-mamba_align"), eagle=False, seed=0)
    corrupt = HYBRID_LIES[method]
    liar = lambda c: LiesOnce(vllm_factory(c), method, corrupt)  # noqa: E731
    with pytest.raises(ReplayDivergence) as info:
        replay(cfg, 0, [vllm_factory, liar], ["vllm", "liar"])
    assert info.value.op.startswith(method)


# --------------------------------------------------------------------------
# Mixes, configs and the CLI.
# --------------------------------------------------------------------------


def test_parse_mix_round_trips():
    text = "full,sw:128@32,chunked:64,mamba:align:2,mamba:all@32,mamba,cross,full+eagle"
    groups = parse_mix(text)
    assert [g.kind for g in groups] == [
        "full", "sliding_window", "chunked_local", "mamba", "mamba", "mamba",
        "cross_attention", "full",
    ]
    assert groups[1] == GroupSpec("sliding_window", 32, sliding_window=128)
    assert groups[3].num_speculative_blocks == 2 and groups[7].is_eagle_group
    assert parse_mix(format_mix(groups)) == groups
    assert parse_mix("full,mamba*3") == (GroupSpec(),) + (GroupSpec("mamba"),) * 3
    for bad in ("", "full,", "sw", "mamba:sometimes", "banana", "cross+eagle", "full@x"):
        with pytest.raises(ValueError):
            parse_mix(bad)


def test_config_resolves_block_sizes_as_vllm():
    cfg = ReplayConfig(mix="full@16,sw:64@32,sw:100@64", num_blocks=1000)
    assert (cfg.scheduler_block_size, cfg.hash_block_size, cfg.split_block_size) == (64, 16, 16)
    off = cfg.with_changes(enable_caching=False)
    assert (off.scheduler_block_size, off.hash_block_size) == (64, 64)
    nocache = ReplayConfig(mix="full,mamba", enable_caching=False, max_model_len=400, num_blocks=1000)
    assert nocache.groups[1].block_size == 400 and nocache.groups[1].mamba_cache_mode == "none"
    assert nocache.scheduler_block_size == 400
    cached = nocache.with_changes(enable_caching=True)
    assert cached.groups[1].mamba_cache_mode == "align" and cached.scheduler_block_size == 16
    eagle = cached.with_changes(use_eagle=True)
    assert eagle.num_lookahead_tokens == eagle.max_drafts and eagle.mamba_align


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(mix="full@32,mamba:all@64"),  # vLLM backs hash off to 64: coordinator assert
        dict(mix="full,cross"),  # cross attention needs prefix caching off
        dict(mix="full,chunked:64", use_eagle=True),  # no EAGLE drop for chunked local
        dict(mix="full@32,chunked:64@16"),  # chunked local needs the scheduler block size
        dict(mix="mamba:align*2"),  # one spec group: not hybrid
        dict(mix="full,mamba:align", enable_caching=False),  # vLLM forces "none"
        dict(mix="full,mamba:none"),  # and "none" only without caching
        dict(mix="full,mamba:all,mamba:align"),  # one mamba_cache_mode per model
        dict(mix="full", hash_block_size=8),  # one group: hash == block size
        # vLLM 0.23.0 truncates only the first full spec group's hit: a second
        # full block size corrupts its pool's free count.
        dict(mix="full@16,sw:64@16,full@32"),
        dict(mix="full,sw:64", num_blocks=20),  # a max-length request must fit
    ],
)
def test_config_rejects_what_vllm_rejects(kwargs):
    kwargs.setdefault("num_blocks", 1000)
    with pytest.raises(ValueError):
        ReplayConfig(**kwargs)


def test_cli_replays_a_mix(capsys, vllm_available):
    argv = ["--mix", "full,sw:64,mamba:align:2", "--eagle", "--max-drafts", "2",
            "--seeds", "2", "--requests", "25", "--compare", "vllm"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("mix=full@16,sw:64@16,mamba:align:2@16 ")
    assert len(lines) == 3 and all("'ops'" in line for line in lines[1:])
    assert main(["--mix", "full-mamba", "--no-caching", "--requests", "10"]) == 0
    assert "mix=full@16,mamba:none@512" in capsys.readouterr().out


def test_cli_help_and_bad_mix(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0 and "--mix" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["--mix", "full,cross"])  # caching on: rejected with a message
    assert info.value.code == 2 and "cross attention" in capsys.readouterr().err


def test_cli_runs_without_vllm_or_torch():
    """The generator and hybridcache's own config classes need neither."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['vllm'] = None\n"
        "from hybridcache_dev.replay import main\n"
        "raise SystemExit(main(['--mix', 'full,sw:64,mamba:align:2', '--eagle', '--requests', '15']))\n"
    )
    env = dict(os.environ)
    import hybridcache

    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(hybridcache.__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "'split_trims'" in out.stdout
