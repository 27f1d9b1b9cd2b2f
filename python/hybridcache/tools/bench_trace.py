"""The bench's recorded serving hot path (the development package's
`hybridcache_dev.bench_trace` records it: a scheduler loop over hybridcache's
facade with shared prefixes, chunked prefill, decode with 0..16 draft tokens,
preemption and aborts, every manager call written down with the request's
state and the result) and the recordings of the default grid the wheel ships
(traces/bench-*.json.xz, read by `load`).

An op is (code, request index, a, b, state, expected); `state` is the
request's (tokens, computed tokens, preemptions) before the call. A shipped
recording keeps of the results what makes the trace legal: whether each
allocation got blocks (`BLOCKS` / `NO_BLOCKS`) and each lookup's hit length;
the timed replay compares every other result across the implementations.
A request's tokens are a shared prefix and then its own seeded stream
(`request_tokens`), so a recording ships without them.
"""

from __future__ import annotations

import json
import lzma
import random
from array import array
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from .. import releases
from ..request import Request
from . import configs
from .configs import GroupSpec
from .release_api import ReleaseApi, release

CONFIGS = ("full", "full+swa", "full+3xmamba-align")
CONFIG_TITLES = {
    "full": "full attention",
    "full+swa": "full attention + sliding window (128 tokens)",
    "full+3xmamba-align": "full attention + 3 x Mamba (mamba_cache_mode='align', 16 speculative blocks)",
}
# The shipped grid: these running counts, this many measured steps, seed 0.
RUNNING, STEPS = (64, 256, 1024), 300

NEW_STEP, GET_COMPUTED, ALLOC_NEW, ALLOC_RUN, GET_BLOCKS, FREE, COMMON_PREFIX, TAKE_NEW_IDS, STATS = range(9)
# Calls of later releases' schedulers: admission with its keywords
# (b = (hit, has_scheduled_reqs)), record_prefix_cache_stats, the per-step
# drains (`meta["drains"]`), cache_blocks after a sampled output.
ADMIT_KW, RECORD_STATS, DRAINS, CACHE_BLOCKS = range(9, 13)
OP_NAMES = ("new_step_starts", "get_computed_blocks", "allocate_slots (admission)", "allocate_slots (running)",
            "get_blocks", "free", "get_num_common_prefix_blocks", "take_new_block_ids", "stats/usage",
            "allocate_slots (admission)", "record_prefix_cache_stats", "per-step drains", "cache_blocks")
STATEFUL = frozenset((GET_COMPUTED, ALLOC_NEW, ALLOC_RUN, FREE, ADMIT_KW, CACHE_BLOCKS))
Op = tuple[int, int, Any, Any, Any, Any]
NO_BLOCKS = "no blocks"  # allocate_slots returned None
BLOCKS = "blocks"  # it returned blocks (a shipped recording keeps no ids)


@dataclass
class Recording:
    # The workload: config, running, steps, seed, release, block_size,
    # warmup_steps, num_blocks, groups, kwargs (the tools' constructor
    # keywords), drains (the manager's per-step drain calls, in order).
    meta: dict[str, Any]
    steps: list[list[Op]]
    free_after_step: list[int]
    running_after_step: list[int]
    # Per request: id, prompt length, full token list and full block hashes.
    request_ids: list[str]
    num_prompt_tokens: list[int]
    token_ids: list[list[int]]
    block_hashes: list[list[bytes]]
    counters: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def num_ops(self) -> int:
        return sum(len(s) for s in self.steps)

    @property
    def api(self) -> ReleaseApi:
        return release(self.meta["release"])

    def kv_cache_config(self, vllm: bool, num_blocks: int | None = None) -> Any:
        """The workload's KV-cache config, vLLM's classes or hybridcache's own."""
        groups = [GroupSpec(**g) for g in self.meta["groups"]]
        return configs.kv_cache_config(groups, num_blocks or self.meta["num_blocks"], vllm)


def make_hybridcache_manager(rec: Recording) -> Any:
    """hybridcache's facade for the recording's release, on its own config classes."""
    return rec.api.tool_facade(rec.kv_cache_config(False), rec.meta["kwargs"])


def make_vllm_manager(rec: Recording) -> Any:
    """vLLM's own manager of the recording's release (imports vLLM)."""
    return rec.api.tool_vllm(rec.kv_cache_config(True), rec.meta["kwargs"])


def request_tokens(seed: int, idx: int, prefix: list[int], n: int) -> list[int]:
    """Request `idx`'s `n` tokens: `prefix`, then 15-bit tokens of its own stream."""
    drawn = array("H", random.Random(f"{seed}/{idx}").randbytes(2 * (n - len(prefix))))
    return list(prefix) + [t & 0x7FFF for t in drawn]


def shipped_name(config: str, running: int, version: str) -> str:
    """The file of a workload's recording: one per core profile (the releases
    that run one profile make the same calls and get the same answers), named
    for the profile's first release."""
    profile = releases.of_profile(releases.require(version, "hybridcache bench").profile).version
    return f"bench-{profile}-{config}-{running}.json.xz"


def ships(running: int, steps: int, seed: int) -> bool:  # the grid of `RUNNING` and `STEPS`
    return seed == 0 and running in RUNNING and steps <= STEPS


def load(config: str, running: int, steps: int, seed: int, version: str) -> Recording | None:
    """The shipped recording of this workload's first `steps` measured steps, or None."""
    if not ships(running, steps, seed):
        return None
    path = resources.files("hybridcache") / "traces" / shipped_name(config, running, version)
    if not path.is_file():
        return None
    data = json.loads(lzma.decompress(path.read_bytes()))
    meta = data["meta"]
    meta.update(steps=steps, release=version)
    return decode(data, meta["warmup_steps"] + steps)


def decode(data: dict[str, Any], num_steps: int) -> Recording:
    """The first `num_steps` steps of a shipped recording (the development
    package's `encode` writes it)."""
    meta, cols = data["meta"], data["columns"]
    seed, bs = meta["seed"], meta["block_size"]
    rows = zip(cols["code"], cols["idx"], cols["a"], cols["b"], cols["tokens"], cols["computed"],
               cols["preempted"], cols["answer"])
    last: dict[int, tuple[int, int, int]] = {}
    steps: list[list[Op]] = []
    idx = -1
    for count in cols["ops_per_step"][:num_steps]:
        ops: list[Op] = []
        for code, d_idx, a, b, dt, dc, dp, answer in (next(rows) for _ in range(count)):
            idx += d_idx
            state: tuple[int, int, int] | None = None
            if code in STATEFUL:
                t, c, p = last.get(idx, (0, 0, 0))
                state = last[idx] = (t + dt, c + dt + dc, p + dp)
            expected: Any = None
            if code in (ALLOC_NEW, ALLOC_RUN, ADMIT_KW):
                expected = NO_BLOCKS if answer else BLOCKS
            elif code == GET_COMPUTED:
                expected = (BLOCKS, answer)
            if code == CACHE_BLOCKS and state is not None:
                a += state[1]
            elif code == ADMIT_KW:
                b = (b // 2, bool(b % 2))
            elif code == ALLOC_RUN:
                b = bool(b)
            ops.append((code, idx, a, b, state, expected))
        steps.append(ops)
    shapes = meta["shapes"]
    token_ids = [request_tokens(seed, i, meta["prefixes"][k][:used] if k >= 0 else [], drawn)
                 for i, (k, used, drawn, _) in enumerate(shapes)]
    requests = [Request(f"req-{i}", tokens, bs) for i, tokens in enumerate(token_ids)]
    return Recording(meta=meta, steps=steps, free_after_step=data["free_after_step"][:num_steps],
                     running_after_step=data["running_after_step"][:num_steps],
                     request_ids=[r.request_id for r in requests], num_prompt_tokens=[s[3] for s in shapes],
                     token_ids=token_ids, block_hashes=[r.block_hashes for r in requests],
                     counters={k: v[num_steps - 1] for k, v in meta["counters_after_step"].items()})
