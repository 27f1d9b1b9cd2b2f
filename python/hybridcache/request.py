"""A minimal request type for users without vLLM.

It carries every attribute vLLM's KVCacheManager reads from a
``vllm.v1.request.Request`` (so the very same object can be handed to vLLM's
manager and to hybridcache's), and keeps ``block_hashes`` up to date as tokens
are appended, the way vLLM's request block hasher does.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable
from typing import Any, Callable

from hybridcache import _native
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
    """A request's LoRA adapter, as far as the KV cache cares: its name goes
    into the block hashes (blocks of different adapters never match) and,
    with its id, into KV events (vLLM's `LoRARequest` fields).

    Args:
        lora_name: the adapter's name.
        lora_int_id: the adapter's integer id.
    """

    __slots__ = ("lora_name", "lora_int_id")

    def __init__(self, lora_name: str, lora_int_id: int) -> None:
        """See the class docstring."""
        self.lora_name = lora_name
        self.lora_int_id = lora_int_id

    @property
    def name(self) -> str:
        """The adapter's name (vLLM's alias of `lora_name`)."""
        return self.lora_name

    @property
    def adapter_id(self) -> int:
        """The adapter's id (vLLM's alias of `lora_int_id`)."""
        return self.lora_int_id


class Request:
    """What a serving loop tracks per request, as far as the KV-cache manager
    cares: for users without vLLM (vLLM's `Request` works as well).

    Args:
        request_id: unique among the requests the manager holds (str).
        prompt_token_ids: the prompt.
        hash_block_size: tokens per block hash; must equal the manager's
            `hash_block_size`: a manager with prefix caching refuses a
            request hashed at another size (ValueError at its lookup or
            admission). None: no hashes (prefix caching off).
        lora_request: the LoRA adapter, or None.
        cache_salt: a salt mixed into the first block's hash, so only
            requests with the same salt share cached blocks.
        block_hasher: ``(parent hash or None, token ids, extra keys or None)
            -> bytes``, the chain hash of one full block (default SHA-256).
            For hashes bit-identical to vLLM's, build vLLM's Request with
            `hybridcache.hashing.make_request_block_hasher` instead.
        skip_reading_prefix_cache: never look this request up in the prefix
            cache (its blocks are still cached for others).

    Raises TypeError when `request_id` is not a str.

    What the caller updates between manager calls (docs/usage.md, "The caller's
    contract between steps"): `num_computed_tokens` (tokens whose KV is computed, set
    after admission and advanced after every step, lowered by rejected
    drafts), output tokens through `append_output_token_ids` (which keeps
    `block_hashes` current), `num_in_flight_tokens` (scheduled tokens not
    yet computed, with asynchronous scheduling; read by the managers of
    releases that free windows on processed tokens), `shared_prefix_boundary`
    (the third value a 3-tuple `get_computed_blocks` returns),
    `spec_token_ids` (this step's draft tokens,
    read by the caller's scheduler to size `num_new_tokens`, never by the
    manager) and, on preemption, `num_computed_tokens = 0` and
    `num_preemptions += 1`.
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
        """See the class docstring for the arguments."""
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
        # Tokens scheduled whose KV is not computed yet (vLLM's async
        # scheduling): a later release's manager frees sliding-window blocks only
        # behind the processed tokens. 0 for a synchronous loop.
        self.num_in_flight_tokens = 0
        # Where this request's prompt stops sharing a cached prefix (the third
        # value of a 3-tuple `get_computed_blocks`, stored here as
        # vLLM's scheduler stores it): sparse retention keeps that block.
        self.shared_prefix_boundary = 0
        self._hash_block_size = hash_block_size
        self._block_hasher = block_hasher
        self.block_hashes: list[bytes] = []
        self._update_block_hashes()

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt and output tokens (draft tokens not included)."""
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        """``len(all_token_ids)``: prompt plus output tokens, without drafts."""
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens appended with `append_output_token_ids`."""
        return len(self._all_token_ids) - self.num_prompt_tokens

    @property
    def num_tokens_with_spec(self) -> int:
        """`num_tokens` plus this step's draft tokens (`spec_token_ids`):
        what a step computes up to, as in vLLM's scheduler."""
        return len(self._all_token_ids) + len(self.spec_token_ids)

    @property
    def prefix_cache_hit_limit(self) -> int | None:
        """vLLM's lookup gate and bound: 0 when the request skips the
        prefix cache, else None (unbounded)."""
        return 0 if self.skip_reading_prefix_cache else None

    def get_max_cache_hit_length(self, bound: int | None = None) -> int:
        """vLLM's longest hit allowed: the least of `num_tokens - 1`,
        the hit limit and `bound`."""
        limits = (self.num_tokens - 1, self.prefix_cache_hit_limit, bound)
        return min(limit for limit in limits if limit is not None)

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        """Appends sampled (accepted) tokens and hashes every block they
        fill (`block_hashes` grows by one per `hash_block_size` tokens).
        Takes one token id or an iterable of them."""
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
        """``Request(id, num_tokens=..., num_computed_tokens=...)``."""
        return (
            f"Request({self.request_id!r}, num_tokens={self.num_tokens}, "
            f"num_computed_tokens={self.num_computed_tokens})"
        )


# The manager reads `_hash_block_size` of this class's instances (and only
# theirs) to refuse requests hashed at another size.
_native._register_request_class(Request)
