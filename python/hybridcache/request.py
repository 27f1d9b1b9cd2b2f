"""A minimal request type for users without vLLM.

It carries every attribute vLLM 0.23.0's KVCacheManager reads from a
``vllm.v1.request.Request`` (so the very same object can be handed to vLLM's
manager and to hybridcache's), and keeps ``block_hashes`` up to date as tokens
are appended, the way vLLM's request block hasher does.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable
from typing import Any, Callable

from hybridcache._native import block_extra_keys

BlockHasher = Callable[[bytes | None, "list[int]", "tuple[Any, ...] | None"], bytes]

# Seed of every hash chain; fixed so hashes are reproducible across processes.
NONE_HASH: bytes = hashlib.sha256(b"hybridcache-none-hash").digest()


def sha256_block_hash(
    parent: bytes | None, token_ids: list[int], extra_keys: tuple[Any, ...] | None
) -> bytes:
    """Chain hash of one full block: sha256(parent || tokens as int64 || extra)."""
    h = hashlib.sha256(parent if parent is not None else NONE_HASH)
    h.update(array("q", token_ids).tobytes())
    if extra_keys:
        h.update(repr(extra_keys).encode())
    return h.digest()


class LoRARequest:
    """The two LoRA fields the manager reports in KV events."""

    __slots__ = ("lora_name", "lora_int_id")

    def __init__(self, lora_name: str, lora_int_id: int) -> None:
        self.lora_name = lora_name
        self.lora_int_id = lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id


class Request:
    """What a serving loop tracks per request, as far as the KV-cache manager cares.

    ``hash_block_size`` of ``None`` disables hashing (prefix caching off).
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Iterable[int],
        hash_block_size: int | None = 16,
        *,
        lora_request: LoRARequest | None = None,
        cache_salt: str | None = None,
        block_hasher: BlockHasher = sha256_block_hash,
        skip_reading_prefix_cache: bool = False,
    ) -> None:
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be str, got {type(request_id).__name__}")
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._all_token_ids = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.lora_request = lora_request
        self.cache_salt = cache_salt
        self.mm_features: list[Any] = []
        self.prompt_embeds = None
        self._prompt_embeds_per_block_hashes: dict[tuple[int, int], bytes] = {}
        self.skip_reading_prefix_cache = skip_reading_prefix_cache
        self.spec_token_ids: list[int] = []
        self._hash_block_size = hash_block_size
        self._block_hasher = block_hasher
        self.block_hashes: list[bytes] = []
        self._update_block_hashes()

    @property
    def all_token_ids(self) -> list[int]:
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._all_token_ids) - self.num_prompt_tokens

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        if isinstance(token_ids, int):
            self._all_token_ids.append(token_ids)
        else:
            self._all_token_ids.extend(token_ids)
        self._update_block_hashes()

    def _extra_keys(self, start: int) -> tuple[Any, ...] | None:
        return block_extra_keys(start, self.lora_request, cache_salt=self.cache_salt)

    def _update_block_hashes(self) -> None:
        size = self._hash_block_size
        if size is None:
            return
        hashes = self.block_hashes
        start = len(hashes) * size
        while start + size <= len(self._all_token_ids):
            parent = hashes[-1] if hashes else None
            block = self._all_token_ids[start : start + size]
            hashes.append(self._block_hasher(parent, block, self._extra_keys(start)))
            start += size

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, num_tokens={self.num_tokens}, "
            f"num_computed_tokens={self.num_computed_tokens})"
        )
