"""Training run for a profile-guided build (scripts/build_wheel.sh): the
calls a serving loop makes, so the compiler lays the hot paths out densely
(under a Python scheduler a call's cost is mostly instruction-cache misses).

Runs on an instrumented hybridcache alone (no vLLM, no torch): the bench's
scheduler trace for every configuration, with a seed and batch sizes the
bench's defaults do not use, through the drop-in API, then the batched
array API. Takes a few seconds per configuration.
"""

from __future__ import annotations

import sys
from array import array
from pathlib import Path

# The development package (dev/, not in the wheel: the bench's recorder and its batched decode driver).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))

from hybridcache.bench import CONFIGS, run_recording  # noqa: E402
from hybridcache.releases import SUPPORTED_VLLM_VERSIONS  # noqa: E402
from hybridcache_dev.bench_batched import accept_drafts, decoding_manager  # noqa: E402
from hybridcache_dev.bench_trace import Workload, record  # noqa: E402

SEED = 7
# Each release's facade and rules (the table in hybridcache.releases): their
# hot paths differ (a later scheduler calls `cache_blocks` for every running
# request; Mamba caching rules).
RELEASES = SUPPORTED_VLLM_VERSIONS


def drop_in(config: str, running: int, steps: int, release: str) -> None:
    w = Workload(config=config, running=running, steps=steps, seed=SEED, release=release)
    result = run_recording(record(w), use_vllm=False)
    if not result["verified"]:
        raise SystemExit(f"training replay diverged: {result.get('divergence')}")


def arrays(config: str, running: int, steps: int) -> None:
    m, reqs, rng = decoding_manager(config, running, steps, SEED)
    handles = array("Q", [m.request_handle(r.request_id) for r in reqs]).tobytes()
    for _ in range(steps):
        drafts = [rng.choice([0, 0, 1, 2, 4]) for _ in reqs]
        m.allocate_decode_arrays(
            handles,
            array("I", [1 + d for d in drafts]).tobytes(),
            array("I", [r.num_computed_tokens for r in reqs]).tobytes(),
            array("I", [r.num_tokens for r in reqs]).tobytes(),
            0,
            reqs,
        )
        accept_drafts(reqs, drafts, rng)
        m.new_step_starts()


class _VllmShapedRequest:
    """vLLM's `Request` as far as the native `append_output_token_ids`
    reads it (vLLM is not imported here): the training exercises that
    descriptor's path, which vLLM's scheduler takes once per sampled token."""

    def __init__(self, prompt: list[int], hasher: object) -> None:
        self._output_token_ids: list[int] = []
        self._all_token_ids = list(prompt)
        self.block_hashes: list[bytes] = []
        self._block_hasher = hasher

    def append_output_token_ids(self, token_ids: int) -> None:
        raise AssertionError("replaced by the native descriptor")

    def update_block_hashes(self) -> None:
        raise AssertionError("the native hasher's requests are hashed by the descriptor")


def token_appends(requests: int, tokens: int) -> None:
    from hybridcache import _native
    from hybridcache.hashing import make_request_block_hasher

    cls = _VllmShapedRequest
    descriptor = _native.native_token_append(cls, cls.__dict__["append_output_token_ids"],
                                             cls.__dict__["update_block_hashes"])
    if descriptor is None:
        return  # built without raw-ffi
    cls.append_output_token_ids = descriptor  # type: ignore[method-assign]
    hasher = make_request_block_hasher(16, "sha256_cbor")._bound_call()
    reqs = [_VllmShapedRequest(list(range(i % 40 + 1)), hasher) for i in range(requests)]
    for t in range(tokens):
        for r in reqs:
            r.append_output_token_ids(t)


def main() -> int:
    token_appends(requests=256, tokens=200)
    for config in CONFIGS:
        for release in RELEASES:
            for running in (128, 512):
                drop_in(config, running, steps=30, release=release)
        arrays(config, running=384, steps=40)
        print(f"pgo training: {config} done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
