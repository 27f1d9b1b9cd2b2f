"""Native request block hashing, bit-identical to the hashing of every
release in `hybridcache.releases` whose row says `native_hasher`.

vLLM hashes every full block of a request in Python
(``vllm.v1.core.kv_cache_utils.get_request_block_hasher``). The
:class:`~hybridcache._native.BlockHasher` made here computes the same bytes in
Rust for all four ``prefix_caching_hash_algo`` values: ``sha256_cbor``,
``xxhash_cbor`` (CBOR, the well-defined encodings) and ``sha256``, ``xxhash``
(pickle protocol 5). It is a drop-in for the hasher vLLM builds::

    # get_request_block_hasher(block_size, get_hash_fn_by_name(name))
    hasher = make_request_block_hasher(block_size, name)
    # a release with hash_lookahead: (hash_block_size, fn, lookahead)
    hasher = make_request_block_hasher(block_size, name, profile=release.profile,
                                       num_hash_lookahead_tokens=lookahead)
    new_hashes = hasher(request)          # list[bytes], as vLLM's

``profile`` names the core profile whose rules apply (the core's
``profile::Hashing``; a release row's ``profile``, default the oldest
release's): the partial-block-hits rules tag extra keys with their source, seed
NONE_HASH with "vllm-none-hash" for sha256* when PYTHONHASHSEED is unset,
and can hash lookahead tokens. Extra keys (LoRA, cache salt) are built
natively; for a request with multimodal features or prompt embeds they come
from vLLM's ``generate_block_hash_extra_keys`` when that release of vLLM is
loaded, else from the port below. Importing this module loads neither vLLM
nor torch.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from collections.abc import Callable
from typing import Any

from hybridcache import releases
from hybridcache._native import BlockHasher, block_extra_keys, none_hash_seed
from hybridcache.releases import profile_of

__all__ = [
    "HASH_FUNCTION_NAMES",
    "SUPPORTED_HASHING_RELEASES",
    "BlockHasher",
    "generate_block_hash_extra_keys",
    "make_request_block_hasher",
    "none_hash_for",
]

#: The names vLLM's ``get_hash_fn_by_name`` accepts, all supported natively.
HASH_FUNCTION_NAMES: tuple[str, ...] = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")

#: The vLLM releases whose hashing rules the native hasher follows (the table's `native_hasher`).
SUPPORTED_HASHING_RELEASES: tuple[str, ...] = tuple(r.version for r in releases.RELEASES if r.native_hasher)

_VLLM_UTILS = "vllm.v1.core.kv_cache_utils"

ExtraKeysFn = Callable[[Any, int, int, int], "tuple[tuple[Any, ...] | None, int]"]


def _hash_name(hash_fn: str | Callable[[Any], bytes]) -> str:
    """A name from HASH_FUNCTION_NAMES, or one of vLLM's own hash functions."""
    if isinstance(hash_fn, str):
        name = hash_fn
    elif callable(hash_fn) and getattr(hash_fn, "__module__", None) == "vllm.utils.hashing":
        name = getattr(hash_fn, "__name__", "")
    else:
        raise ValueError(
            f"unsupported hash function {hash_fn!r}: pass one of {', '.join(HASH_FUNCTION_NAMES)} "
            "or the vllm.utils.hashing function of that name"
        )
    if name not in HASH_FUNCTION_NAMES:
        raise ValueError(
            f"unsupported hash function {name!r}: expected one of {', '.join(HASH_FUNCTION_NAMES)}"
        )
    return name


def none_hash_for(
    hash_fn: str | Callable[[Any], bytes], seed: str | None = None, profile: str | None = None
) -> bytes:
    """vLLM's ``init_none_hash(hash_fn)`` value under release ``profile``:
    ``hash_fn(seed)``. Without ``seed``, the release's rule picks it from
    ``$PYTHONHASHSEED`` (the whole-block-hits profile: 32 random bytes when unset; the
    partial-block-hits profile: "vllm-none-hash" for sha256*, a random hex seed for xxhash*)."""
    name = _hash_name(hash_fn)
    profile = profile_of(profile or releases.DEFAULT.profile)
    if seed is None:
        seed = none_hash_seed(name, os.getenv("PYTHONHASHSEED"), profile)
    if seed is None:
        return os.urandom(32)
    if name.endswith("_cbor"):
        import cbor2

        data = cbor2.dumps(seed, canonical=True)
    else:
        data = pickle.dumps(seed, protocol=pickle.HIGHEST_PROTOCOL)
    return BlockHasher(name, 1, b"").digest(data)


def _vllm_none_hash() -> bytes | None:
    mod = sys.modules.get(_VLLM_UTILS)
    value = getattr(mod, "NONE_HASH", None)
    return value if isinstance(value, bytes) else None


def make_request_block_hasher(
    block_size: int,
    hash_name: str | Callable[[Any], bytes] = "sha256_cbor",
    none_hash: bytes | None = None,
    extra_keys_fn: ExtraKeysFn | None = None,
    profile: str | None = None,
    num_hash_lookahead_tokens: int = 0,
) -> BlockHasher:
    """Drop-in for ``get_request_block_hasher(block_size, hash_fn)`` of the
    release running core profile ``profile`` (with ``hash_lookahead``:
    ``(hash_block_size, hash_fn, num_hash_lookahead_tokens)``).

    ``hash_name`` is a vLLM hash-function name or vLLM's function itself.
    ``none_hash`` defaults to vLLM's ``NONE_HASH`` when vLLM has initialized
    it, else to :func:`none_hash_for` as that release's ``init_none_hash``
    would. Unsupported names, and lookahead tokens under a profile without
    them, raise ValueError.
    """
    name = _hash_name(hash_name)
    profile = profile_of(profile or releases.DEFAULT.profile)
    if none_hash is None:
        none_hash = _vllm_none_hash()
    if none_hash is None:
        none_hash = none_hash_for(name, profile=profile)
    return BlockHasher(
        name, block_size, none_hash, extra_keys_fn or _extra_keys_for(profile), profile, num_hash_lookahead_tokens
    )


def _same_release(version: str, profile: str) -> bool:
    installed = releases.find(version or None)
    return installed is not None and installed.profile == profile


def _extra_keys_for(profile: str) -> ExtraKeysFn:
    """vLLM's generate_block_hash_extra_keys where that release of vLLM is
    loaded, else the port, under ``profile``'s rules."""

    def extra_keys(request: Any, start: int, end: int, mm_idx: int) -> tuple[tuple[Any, ...] | None, int]:
        mod = sys.modules.get(_VLLM_UTILS)
        fn = getattr(mod, "generate_block_hash_extra_keys", None)
        version = getattr(sys.modules.get("vllm"), "__version__", "")
        if fn is not None and _same_release(version, profile):
            result: tuple[tuple[Any, ...] | None, int] = fn(request, start, end, mm_idx)
            return result
        return generate_block_hash_extra_keys(request, start, end, mm_idx, profile)

    return extra_keys


def _mm_extra_keys(request: Any, start: int, end: int, mm_idx: int) -> tuple[list[Any], int]:
    """(identifier, offset in block) of each mm input overlapping the block,
    assuming ``request.mm_features`` sorted by position; mm_idx -1 means
    "start from the last input"."""
    features = request.mm_features
    if not features:
        return [], mm_idx
    last = features[-1].mm_position
    if last.offset + last.length <= start:
        return [], mm_idx
    if mm_idx < 0:
        assert -mm_idx <= len(features)
        mm_idx += len(features)
    keys: list[Any] = []
    while mm_idx < len(features):
        feature = features[mm_idx]
        assert feature.identifier is not None
        offset, length = feature.mm_position.offset, feature.mm_position.length
        if end <= offset:
            break  # the block ends before this input
        if start >= offset + length:
            mm_idx += 1  # the block is past this input
            continue
        keys.append((feature.identifier, offset - start))
        if end < offset + length:
            break  # the input goes on in the next block
        mm_idx += 1
    return keys, mm_idx


def _prompt_embeds_keys(request: Any, start: int, end: int) -> list[bytes]:
    embeds = request.prompt_embeds
    if embeds is None:
        return []
    cache: dict[tuple[int, int], bytes] = request._prompt_embeds_per_block_hashes
    digest = cache.get((start, end))
    if digest is None:
        import torch

        raw = embeds[start:end].flatten().cpu().contiguous().view(torch.uint8).numpy().data
        digest = cache[(start, end)] = hashlib.sha256(raw).digest()
    return [digest]


def generate_block_hash_extra_keys(
    request: Any, start: int, end: int, mm_idx: int, profile: str | None = None, for_event: bool = False
) -> tuple[tuple[Any, ...] | None, int]:
    """Port of vLLM's function of that name in release ``profile``: LoRA,
    mm inputs, cache salt (first block only), prompt-embeds digest, in that
    order, in the profile's form (the partial-block-hits profile: tagged) or, with
    ``for_event``, in the form KV events publish (untagged);
    ``(None, mm_idx)`` when there are none."""
    mm_keys, mm_idx = _mm_extra_keys(request, start, end, mm_idx)
    lora, salt = request.lora_request, request.cache_salt
    embeds = _prompt_embeds_keys(request, start, end)
    keys = block_extra_keys(start, lora, mm_keys, salt, embeds, profile_of(profile or releases.DEFAULT.profile), for_event)
    return keys, mm_idx
