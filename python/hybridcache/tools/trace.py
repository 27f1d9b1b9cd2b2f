"""The recorded serving trace of `hybridcache replay`: its file, its
operations and how one is applied to managers.

A trace is the development package's simulation over hybridcache's facade
for one vLLM release, written down call by call (``python -m
hybridcache_dev.replay_trace``): LZMA-compressed JSON of a header (release,
groups, pool size, constructor keywords, the run's counters), the requests
(id, prompt length, every token it held, LoRA id, cache salt, read gate) and
the operations ``[name, request index, args, state updates, answer digest]``
(the updates set the live requests to what the scheduler had made of them).

`Runner` applies one named operation to every manager of a `Fanout` (the
simulation calls it too); `replay` applies a whole trace, checking each
answer against the other managers' and the recording's digest, so answers
that would make the trace illegal stop it as a divergence.
"""

from __future__ import annotations

import hashlib
import json
import lzma
from collections.abc import Callable, Collection, Sequence
from importlib import resources
from typing import Any

from .compare import (Fanout, ReplayDivergence, freeze, norm_allocated, norm_computed, norm_drained, norm_usage,
                      pool_state, same)
from .configs import GroupSpec

FORMAT = 1
DRAINS = ("take_boundary_state_offloads", "take_kv_cache_block_copies", "take_new_block_ids")
# What a manager reports in classes of the installed vLLM where there is one.
OBSERVED = ("take_events", "make_prefix_cache_stats")
_NORMS: dict[str, Callable[[Any], Any]] = {
    "get_computed_blocks": norm_computed, "allocate_slots": norm_allocated, "get_block_ids": freeze,
    "get_num_common_prefix_blocks": tuple, "usage": norm_usage, **{d: norm_drained for d in DRAINS}}


def trace_name(release: str) -> str:
    return f"replay-{release}.json.xz"


def load(release: str) -> dict[str, Any]:
    """The shipped default trace of vLLM release `release` (FileNotFoundError if none)."""
    return loads((resources.files("hybridcache") / "traces" / trace_name(release)).read_bytes())


def loads(data: bytes) -> dict[str, Any]:
    trace: dict[str, Any] = json.loads(lzma.decompress(data))
    if trace.get("format") != FORMAT:
        raise ValueError(f"trace format {trace.get('format')!r}, this hybridcache reads {FORMAT}")
    return trace


def _plain(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return repr(value)


def digest(value: Any) -> str:
    """A short digest of a normalized answer (tuples and lists alike)."""
    text = json.dumps(value, default=_plain, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def groups(trace: dict[str, Any]) -> tuple[GroupSpec, ...]:
    return tuple(GroupSpec(**g) for g in trace["groups"])


class Runner:
    """Applies named operations to every manager of `fanout`, spelled as
    vLLM release `api`'s scheduler issues them (`release_api`)."""

    def __init__(self, fanout: Fanout, api: Any):
        self.fan, self.api = fanout, api
        self.computed: list[Any] = [None] * len(fanout.managers)  # each manager's last lookup
        self.norms = dict(_NORMS, take_events=lambda evs: tuple(api.norm_event(e) for e in evs),
                          make_prefix_cache_stats=api.norm_stats)

    def _call(self, m: Any, i: int, name: str, req: Any, rid: str, args: Sequence[Any]) -> Any:
        if name == "get_computed_blocks":
            found = self.api.lookup(m, req)
            self.computed[i] = found[0]
            return found
        if name == "allocate_slots":
            n, kw, source = args
            blocks = {"lookup": self.computed[i], "empty": m.empty_kv_cache_blocks}.get(source)
            return m.allocate_slots(req, n, new_computed_blocks=blocks, **kw)
        if name in ("free", "cache_blocks", "record_prefix_cache_stats"):
            return getattr(m, name)(req, *args)
        if name in ("remove_skipped_blocks", "get_block_ids", "get_num_common_prefix_blocks"):
            return getattr(m, name)(rid, *args)
        if name == "evict_blocks":
            return m.evict_blocks(set(args[0]))
        if name == "get_num_free_blocks":
            return m.block_pool.get_num_free_blocks()
        if name == "usage":
            return m.usage
        if name == "pool_state":
            return pool_state(m)
        return getattr(m, name)()  # new_step_starts, reset_prefix_cache, take_events, stats, drains

    def call(self, name: str, req: Any = None, *args: Any) -> list[Any]:
        """`name` on every manager (compared); the managers' raw answers."""
        rid = getattr(req, "request_id", "")
        text = f"{name}({', '.join([rid] * bool(rid) + [repr(a) for a in args])})"
        return self.fan.call(text, lambda m, i: self._call(m, i, name, req, rid, args),
                             self.norms.get(name, same))

    def answer(self, name: str, results: list[Any]) -> Any:
        """The normalized answer of the first manager."""
        return self.norms.get(name, same)(results[0])


class Requests:
    """The trace's requests as `api`'s scheduler makes them, built on first
    use and kept in the recorded state."""

    def __init__(self, trace: dict[str, Any], api: Any):
        self.rows, self.api = trace["requests"], api
        self.live: dict[int, Any] = {}
        self.hash_block_size = trace["kwargs"]["hash_block_size"]
        self.max_model_len = trace["kwargs"]["max_model_len"]

    def update(self, idx: int, num_tokens: int, num_computed: int, num_preemptions: int) -> Any:
        req = self.live.get(idx)
        rid, prompt_len, tokens, lora_id, salt, skip = self.rows[idx]
        if req is None:
            req = self.live[idx] = self.api.tool_request(rid, tokens[:prompt_len], self.hash_block_size,
                                                         self.max_model_len, lora_id, salt, skip)
        if req.num_tokens < num_tokens:
            req.append_output_token_ids(tokens[req.num_tokens:num_tokens])
        req.num_computed_tokens, req.num_preemptions = num_computed, num_preemptions
        return req


def replay(trace: dict[str, Any], managers: Sequence[Any], names: Sequence[str], api: Any,
           unchecked: Collection[str] = ()) -> dict[str, int]:
    """Applies `trace` to `managers` (same request objects), comparing every
    answer across them and, but for the operations `unchecked`, with the
    recording; raises ReplayDivergence. Returns the counts of ops, steps and
    KV events."""
    fan = Fanout(managers, names, trace["seed"])
    fan.step = -1  # the first step's new_step_starts makes it step 0
    runner, requests = Runner(fan, api), Requests(trace, api)
    events = 0
    for name, idx, args, updates, expected in trace["ops"]:
        for update in updates:
            requests.update(*update)
        if name == "new_step_starts":
            fan.step += 1
        results = runner.call(name, requests.live.get(idx), *args)
        got = runner.answer(name, results)
        if name not in unchecked and digest(got) != expected:
            raise ReplayDivergence(trace["seed"], fan.step, f"{name} (against the recording, digest {expected})",
                                   [(n, runner.norms.get(name, same)(r)) for n, r in zip(names, results)])
        if name == "take_events":
            events += len(got)
    return {"ops": fan.ops, "steps": fan.step + 1, "events": events}
