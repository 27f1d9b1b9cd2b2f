"""The workload side of the simulations: simulator-side request state and
the seeded generators of tokens, shared prefixes, prompts and draft counts.

Every generator draws from the `random.Random` it is given, in a fixed order,
so one seed is one trace.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hybridcache.request import Request


@dataclass(eq=False)
class Seq:
    """Simulator-side state of one request (hashed by identity)."""

    req: Request
    max_tokens: int  # output tokens it may produce
    drafts: int = 0  # draft tokens proposed for the next step
    load_steps: int = 0  # remaining steps of an async KV load
    encoder_tokens: int = 0  # cross attention: encoder length
    index: int = -1  # arrival order (the bench's recordings refer to it)

    @property
    def rid(self) -> str:
        return self.req.request_id


TokenSource = Callable[[int], list[int]]


def vocab_tokens(rng: random.Random, vocab_size: int) -> TokenSource:
    """`n` token ids uniform in [0, vocab_size)."""
    return lambda n: [rng.randrange(vocab_size) for _ in range(n)]


def bit_tokens(rng: random.Random, bits: int = 15) -> TokenSource:
    """`n` token ids of `bits` random bits (cheaper; for long traces)."""
    r = rng.getrandbits
    return lambda n: [r(bits) for _ in range(n)]


def shared_prefix_len(rng: random.Random, lo: int, hi: int, align: int) -> int:
    """A shared prefix's length: uniform in [lo, hi], half the time rounded
    down to a multiple of `align` (at least `align`): whole-block hits."""
    n = rng.randint(lo, hi)
    if rng.random() < 0.5:
        n = max(align, n - n % align)
    return n


def prompt_with_prefix(
    rng: random.Random,
    tokens: TokenSource,
    n: int,
    prefixes: Sequence[Sequence[int]],
    shared_prefix_prob: float,
) -> list[int]:
    """`n` tokens: with probability `shared_prefix_prob` starting with (up to
    `n` tokens of) one of `prefixes`, the rest fresh."""
    prompt: list[int] = []
    if prefixes and rng.random() < shared_prefix_prob:
        prompt = list(rng.choice(prefixes)[:n])
    prompt += tokens(n - len(prompt))
    return prompt


def drifting_drafts(rng: random.Random, previous: int, top: int) -> int:
    """Draft count of the next step, suffix-decoding style: it drifts up and
    down, drops to 0, jumps back to the maximum."""
    if top == 0:
        return 0
    r = rng.random()
    if r < 0.25:
        return 0
    if r < 0.35:
        return top
    if r < 0.7:
        return min(top, max(0, previous + rng.choice((-2, -1, 1, 2))))
    return rng.randint(1, top)


def bursty_drafts(rng: random.Random, top: int, no_draft_prob: float) -> int:
    """Draft count of the next step: none with `no_draft_prob`, else uniform in [1, top]."""
    if rng.random() < no_draft_prob:
        return 0
    return rng.randint(1, top)
