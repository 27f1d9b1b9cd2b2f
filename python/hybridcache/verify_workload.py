"""The workload of `hybridcache verify`: waves of prompts, each wave one
`LLM.generate` call, so that later waves meet the prefix cache the earlier
ones filled.

The built-in workload exercises what differs between KV-cache managers:
  - prefix sharing: every request of a wave starts with one of two long shared
    prefixes, and later waves repeat them (prefix-cache hits across calls);
  - preemption: the last wave sends many long requests at once, more than a
    small pool (`hybridcache verify --num-blocks`) holds;
  - varying drafts: prompts that repeat phrases, on which an ngram drafter
    (an engine's `speculative_config`) proposes drafts of varying length.
A prompts file (one prompt a line; a blank line starts a new wave) replaces it.
Nothing here imports vLLM or torch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

WORDS = (
    "the of and to in is was for on that with as by at from his her they this which are be or an had not but "
    "what all were when we there can more one their if has two will so time up out about who into them also "
    "some other than then its only new after first over any these most may such where like between through "
    "year city water river house garden light night morning window table paper letter story music voice street "
    "market school bridge mountain forest island station engine signal number question answer reason moment "
    "family friend doctor teacher farmer worker captain driver painter writer singer runner builder keeper "
    "red blue green yellow white black silver golden quiet loud early late small large warm cold bright dark "
    "open close carry build write read speak listen travel follow return begin finish remember forget "
    "north south east west spring summer autumn winter monday friday today tomorrow always never often"
).split()


@dataclass(frozen=True)
class Request:
    """One request: its prompt text and how many tokens it generates."""

    prompt: str
    max_tokens: int


def _phrase(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def builtin(requests: int = 24, max_tokens: int = 24, seed: int = 0) -> list[list[Request]]:
    """The built-in waves: about `requests` requests in all, each generating
    `max_tokens` tokens (long ones twice that)."""
    rng = random.Random(seed)
    prefixes = [_phrase(rng, 48), _phrase(rng, 40)]
    per = max(2, requests // 4)

    def shared(i: int) -> Request:
        return Request(prefixes[i % 2] + " " + _phrase(rng, 4 + i % 7), max_tokens)

    def repetitive(i: int) -> Request:
        loop = _phrase(rng, 3 + i % 4)
        return Request(" ".join([loop] * (4 + i % 5)) + " " + _phrase(rng, 2), max_tokens)

    waves = [
        [shared(i) for i in range(per)],  # fills the prefix cache
        [shared(i) for i in range(per)] + [repetitive(i) for i in range(per // 2)],  # hits, drafts
        [Request(prefixes[i % 2] + " " + _phrase(rng, 24), 2 * max_tokens)  # many long ones: preemption
         for i in range(max(requests - 2 * per - per // 2, 2))],
    ]
    return waves


def from_file(path: Path, max_tokens: int) -> list[list[Request]]:
    """Waves from a prompts file: one prompt a line, a blank line between
    waves."""
    waves: list[list[Request]] = [[]]
    for line in Path(path).read_text().splitlines():
        if line.strip():
            waves[-1].append(Request(line.strip(), max_tokens))
        elif waves[-1]:
            waves.append([])
    waves = [w for w in waves if w]
    if not waves:
        raise ValueError(f"{path}: no prompts")
    return waves
