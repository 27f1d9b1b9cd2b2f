"""How `hybridcache replay` and `hybridcache bench` drive one vLLM release:
its managers (vLLM's own and hybridcache's facade for it), its requests, its
lookup, and how its events and stats are read. One class per core profile
(`hybridcache.releases`): the whole-block-hits API (2-tuple lookup) and the
partial-block-hits API (vLLM's own requests, the 3-tuple lookup with the
shared-prefix boundary, events and stats in full).

`release(name)` gives the release's `ReleaseApi`. The development package
extends these classes with the fuzz's setups (`hybridcache_dev.release_api`)
and spells the scheduler's other calls (`hybridcache_dev.scheduler`).
Nothing here imports vLLM or torch at import time.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Sequence
from typing import Any

from hybridcache import releases

from .compare import norm_event, norm_stats


class ReleaseApi:
    """The whole-block-hits API. The tools describe managers with its
    constructor keywords; a later API's `tool_kwargs` gives its own form."""

    name = ""
    profile = "whole-block-hits"
    # Where hybridcache's facade for the release lives, and its class.
    facade: tuple[str, str] = ("", "")

    norm_event, norm_stats = staticmethod(norm_event), staticmethod(norm_stats)

    def tool_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The tools' constructor keywords in this API's form."""
        return dict(kwargs)

    def tool_vllm(self, kv_cache_config: Any, kwargs: dict[str, Any]) -> Any:
        """vLLM's own manager of this release (imports vLLM)."""
        from vllm.v1.core.kv_cache_manager import KVCacheManager

        return KVCacheManager(kv_cache_config, **self.tool_kwargs(kwargs))

    def tool_facade(self, kv_cache_config: Any, kwargs: dict[str, Any]) -> Any:
        """hybridcache's facade for this release (its own or vLLM's config classes)."""
        module, cls = self.facade
        return getattr(importlib.import_module(module), cls)(kv_cache_config, **self.tool_kwargs(kwargs))

    def tool_request(self, request_id: str, tokens: Sequence[int], hash_block_size: int, max_model_len: int,
                     lora_id: int | None = None, cache_salt: str | None = None,
                     skip_reading_prefix_cache: bool = False) -> Any:
        """A request as this release's engine makes it (hashed by its rules):
        hybridcache's own `Request` here (no vLLM needed)."""
        from ..request import LoRARequest, Request

        lora = None if lora_id is None else LoRARequest(f"lora{lora_id}", lora_id)
        return Request(request_id, list(tokens), hash_block_size, lora_request=lora, cache_salt=cache_salt,
                       skip_reading_prefix_cache=skip_reading_prefix_cache)

    def lookup(self, m: Any, request: Any) -> tuple[Any, int]:
        """The scheduler's local prefix-cache lookup: (blocks, hit tokens)."""
        blocks, hit = m.get_computed_blocks(request)
        return blocks, hit


class BoundaryLookupApi(ReleaseApi):
    """The partial-block-hits API: the constructor keywords of its scheduler
    (max_in_flight_tokens, num_hash_lookahead_tokens, num_prefill_lookahead,
    watermark, ...), vLLM's own `Request` with its block hasher, the 3-tuple
    lookup, events compared field by field and as msgpack bytes, stats with
    `hits_by_source`."""

    profile = "partial-block-hits"

    def tool_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        kw = dict(kwargs)
        # The scheduler passes max_concurrent_batches x max_num_batched_tokens.
        kw["max_in_flight_tokens"] = kw.pop("max_num_batched_tokens", None)
        defaults = dict(num_hash_lookahead_tokens=0, num_prefill_lookahead=0, dcp_world_size=1, pcp_world_size=1,
                        metrics_collector=None, watermark=0.0, enable_mamba_shared_prefix_checkpoint=False)
        return {**defaults, **kw}

    def hash_fn(self) -> Any:
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import init_none_hash

        # Every time: whatever else in the process set vLLM's global
        # NONE_HASH since (a scheduler's config, another hash function), the
        # requests are hashed as the recordings were ("vllm-none-hash").
        init_none_hash(sha256)
        return sha256

    def tool_request(self, request_id: str, tokens: Sequence[int], hash_block_size: int | None, max_model_len: int,
                     lora_id: int | None = None, cache_salt: str | None = None,
                     skip_reading_prefix_cache: bool = False, *, hash_lookahead: int = 0,
                     session_id: str | None = None) -> Any:
        """vLLM's own `Request` (one LoRA adapter for any `lora_id`), hashed by
        its request block hasher (none when `hash_block_size` is None: prefix
        caching off)."""
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import SamplingParams
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher
        from vllm.v1.request import Request

        hasher = None if hash_block_size is None else get_request_block_hasher(
            hash_block_size, self.hash_fn(), hash_lookahead)
        r = Request(request_id, list(tokens), SamplingParams(max_tokens=max_model_len), None,
                    lora_request=None if lora_id is None else LoRARequest("lora-a", 1, "/adapters/a"),
                    cache_salt=cache_salt, block_hasher=hasher, session_id=session_id)
        row = releases.find(self.name)
        if row is None or row.read_gate == "skip_reading_prefix_cache":
            r.skip_reading_prefix_cache = skip_reading_prefix_cache
        else:
            # The hit-limit gate: 0 skips; else a tenth of the requests bound
            # their hits (drawn from the request, so both sides of a
            # comparison get the same bound).
            draw = random.Random(f"{request_id}/{len(tokens)}")
            r.prefix_cache_hit_limit = (0 if skip_reading_prefix_cache else
                                        draw.randint(0, len(tokens)) if draw.random() < 0.1 else None)
        return r

    def lookup(self, m: Any, request: Any) -> tuple[Any, int]:
        blocks, hit, boundary = m.get_computed_blocks(request)
        if hasattr(request, "shared_prefix_boundary"):
            request.shared_prefix_boundary = boundary  # as the scheduler stores it
        return blocks, hit


    def norm_event(self, event: Any) -> Any:
        """Every field and the wire bytes (map-encoded)."""
        import msgspec

        return norm_event(event), msgspec.msgpack.encode(event)

    def norm_stats(self, stats: Any) -> Any:
        base = norm_stats(stats)
        if base is None:
            return None
        by_source = getattr(stats, "hits_by_source", None)
        by_source = None if by_source is None else tuple(sorted((str(k), v) for k, v in by_source.items()))
        return base + (("hits_by_source", by_source),)


def registry_lookup(registry: dict[str, Any], name: str, make: Callable[[releases.Release], Any]) -> Any:
    """`registry[name]`, else `make(row)` for the table's row `name` (the
    API of the row's core profile), given the row's version and the facade
    its scheduler builds after `install()`. ValueError for a release the
    table does not have."""
    api = registry.get(name)
    if api is None:
        row = releases.find(name)
        if row is None:
            raise ValueError(f"unsupported vLLM release {name!r}; choose from "
                             f"{', '.join(r.version for r in releases.RELEASES)}")
        api = registry[name] = make(row)
        api.name, api.facade = row.version, (row.package + ".scheduler", row.facade)
    return api


# One spelling per core profile.
SPELLINGS: dict[str, type[ReleaseApi]] = {c.profile: c for c in (ReleaseApi, BoundaryLookupApi)}
RELEASES: dict[str, ReleaseApi] = {}


def release(name: str) -> ReleaseApi:
    """The `ReleaseApi` of vLLM release `name` (a row of the table)."""
    return registry_lookup(RELEASES, name, lambda row: SPELLINGS[row.profile]())
