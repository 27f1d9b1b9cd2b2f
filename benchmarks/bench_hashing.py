"""Request block hashing: vLLM 0.23.0's Python hasher vs hybridcache's native one.

Times one scheduler step's worth of `request_block_hasher(request)` calls on
real `vllm.v1.request.Request` objects:

  decode/none  1024 requests, none with a new full block (15 of 16 steps)
  decode   1024 requests, each with exactly 1 new full block to hash
  decode+lora  the same with a LoRA request and cache salt (extra keys)
  prefill  1024 requests x 32 new full blocks (512-token prompts)

and checks that both produce the same hashes. Usage:

    python benchmarks/bench_hashing.py [--requests 1024] [--block-size 16] [--repeat 9]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import logging
import os
import random
import time
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.disable(logging.WARNING)


def build(n: int, block_size: int, blocks: int, prefilled: int, lora: bool, hasher: Any) -> list[Any]:
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    rng = random.Random(0)
    params = SamplingParams(max_tokens=16)
    reqs = []
    for i in range(n):
        tokens = [rng.randrange(150_000) for _ in range((prefilled + blocks) * block_size + 3)]
        extra: dict[str, Any] = {}
        if lora:
            extra = {"lora_request": LoRARequest(f"lora{i % 4}", i % 4 + 1, "/x"), "cache_salt": "salt"}
        r = Request(f"r{i}", tokens, params, None, **extra)
        r.block_hashes = hasher(r)[:prefilled]  # the blocks hashed in earlier steps
        reqs.append(r)
    return reqs


def step_time(hasher: Callable[[Any], list[bytes]], reqs: list[Any], repeat: int) -> tuple[float, list[list[bytes]]]:
    """Least CPU seconds of one pass over reqs (block_hashes left unchanged);
    CPU time and the minimum keep other load on the machine out of it."""
    times, out = [], []
    for _ in range(repeat):
        t = time.process_time()
        out = [hasher(r) for r in reqs]
        times.append(time.process_time() - t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()

    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as kcu

    from hybridcache.hashing import make_request_block_hasher

    names = ["sha256_cbor", "xxhash_cbor", "sha256", "xxhash"]
    if importlib.util.find_spec("xxhash") is None:
        names = [n for n in names if not n.startswith("xxhash")]
        print("(xxhash not installed: xxhash variants skipped)")
    n, bs = args.requests, args.block_size
    scenarios = [  # (label, new blocks per request, blocks already hashed, lora)
        ("decode/none", 0, 4, False),  # no block completed: the usual decode step
        ("decode", 1, 4, False),
        ("decode+lora", 1, 4, True),
        ("prefill", 32, 0, False),
    ]
    print(f"{n} requests, block_size {bs}, best CPU time of {args.repeat} passes"
          " (us/blk: per request for decode/none)\n")
    print(f"{'hash':<12} {'step':<12} {'blocks':>7} {'vLLM ms':>9} {'native ms':>10} {'speedup':>8}"
          f" {'vLLM us/blk':>12} {'native us/blk':>14}")
    for name in names:
        fn = get_hash_fn_by_name(name)
        kcu.init_none_hash(fn)
        theirs = kcu.get_request_block_hasher(bs, fn)
        ours = make_request_block_hasher(bs, name)
        for label, blocks, prefilled, lora in scenarios:
            reqs = build(n, bs, blocks, prefilled, lora, theirs)
            gc.collect()
            gc.freeze()  # as vLLM's engine does after startup: no full-heap GC passes in the timings
            t_v, out_v = step_time(theirs, reqs, args.repeat)
            t_n, out_n = step_time(ours, reqs, args.repeat)
            assert out_v == out_n, f"{name} {label}: hashes differ"
            total = n * blocks
            per = max(total, n)  # per request where no block is hashed
            print(f"{name:<12} {label:<12} {total:>7} {t_v * 1e3:>9.2f} {t_n * 1e3:>10.2f} {t_v / t_n:>7.1f}x"
                  f" {t_v / per * 1e6:>12.2f} {t_n / per * 1e6:>14.2f}")
    print("\nall hashes identical")


if __name__ == "__main__":
    main()
