"""Native request block hashing under vLLM 0.33.0's rules, bit-identical to
vLLM 0.33.0's own `get_request_block_hasher(hash_block_size, fn,
num_hash_lookahead_tokens)` on randomized requests: plain tokens, LoRA (name
and path), cache salt, multimodal inputs at varied offsets, prompt embeds,
lookahead 0/1/3 tokens, tokens appended over many steps, every hash
function; NONE_HASH with PYTHONHASHSEED set and unset (in subprocesses, as
vLLM's engine initialises it once per process). Needs vLLM 0.33.0 (the 0.33
venv); vLLM 0.23.0's rules are pinned by test_native_hashing_vllm.py."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from typing import Any

import pytest

vllm = pytest.importorskip("vllm", reason="needs vLLM 0.33.0 (the 0.33 venv)")
from hybridcache_dev.oracle import module_needs_vllm  # noqa: E402

module_needs_vllm("0.33.0")
torch = pytest.importorskip("torch")

import vllm.v1.engine.core as engine_core  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

import hybridcache.vllm as hc_vllm  # noqa: E402
from hybridcache.hashing import (  # noqa: E402
    BlockHasher,
    generate_block_hash_extra_keys,
    make_request_block_hasher,
    none_hash_for,
)

VLLM_FACTORY = kv_cache_utils.get_request_block_hasher
# vLLM's xxhash functions need the optional xxhash package (not among
# vLLM 0.33.0's requirements): without it, only vLLM's sha256 can answer.
try:
    import xxhash  # noqa: F401

    NAMES = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
except ImportError:  # pragma: no cover
    NAMES = ["sha256", "sha256_cbor"]
ALL_NAMES = [
    n if n in NAMES else pytest.param(n, marks=pytest.mark.skip(reason="xxhash is not installed"))
    for n in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
]
# One string object for an image seen twice: pickle's memo sees it.
SHARED_ID = "img-shared"


def _features(rng: random.Random, n_tokens: int) -> list[MultiModalFeatureSpec]:
    """Sorted, non-overlapping inputs: some adjacent, some inside a block,
    some spanning several blocks; identifiers partly repeated."""
    out: list[MultiModalFeatureSpec] = []
    pos = rng.randrange(0, 6)
    while pos < n_tokens - 1 and len(out) < 6:
        length = rng.choice([1, 2, 3, 5, 9, 17, 30])
        length = min(length, n_tokens - pos)
        ident = SHARED_ID if rng.random() < 0.3 else f"img-{rng.randrange(1000)}"
        out.append(MultiModalFeatureSpec(data=None, modality="image", identifier=ident,
                                         mm_position=PlaceholderRange(offset=pos, length=length)))
        pos += length + rng.choice([0, 0, 1, 4, 11])
    return out


def _request(rid: str, tokens: list[int] | None, hasher: Any, *, lora: bool = False, salt: str | None = None,
             mm: list[MultiModalFeatureSpec] | None = None, embeds: Any = None) -> Request:
    params = SamplingParams(max_tokens=64)
    return Request(request_id=rid, prompt_token_ids=tokens, sampling_params=params, pooling_params=None,
                   arrival_time=0.0, cache_salt=salt, mm_features=mm, prompt_embeds=embeds,
                   lora_request=LoRARequest("adapter-a", 3, "/tmp/adapter-a") if lora else None,
                   block_hasher=hasher)


def _case(rng: random.Random, kind: str) -> dict[str, Any]:
    n = rng.randint(1, 90)
    tokens = [rng.randrange(0, 50000) for _ in range(n)]
    case: dict[str, Any] = {"tokens": tokens}
    if kind in ("lora", "mixed"):
        case["lora"] = True
    if kind in ("salt", "mixed"):
        case["salt"] = f"salt-{rng.randrange(100)}"
    if kind in ("mm", "mixed"):
        case["mm"] = _features(rng, n)
    if kind == "embeds":
        case["tokens"] = None
        case["embeds"] = torch.randn(n, 4, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
    return case


def _pair(name: str, block_size: int, lookahead: int) -> tuple[Any, Any]:
    fn = get_hash_fn_by_name(name)
    kv_cache_utils.init_none_hash(fn)
    native = hc_vllm.native_request_block_hasher(VLLM_FACTORY)(block_size, fn, lookahead)
    hasher = hc_vllm.native_hasher_of(native)
    assert isinstance(hasher, BlockHasher) and hasher.num_hash_lookahead_tokens == lookahead
    return VLLM_FACTORY(block_size, fn, lookahead), native


@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize("kind", ["plain", "lora", "salt", "mm", "embeds", "mixed"])
@pytest.mark.parametrize("lookahead", [0, 1, 3])
def test_request_hashes_identical_to_vllm_033(name: str, kind: str, lookahead: int) -> None:
    rng = random.Random(f"{name}-{kind}-{lookahead}")
    for block_size in (1, 4, 16):
        python, native = _pair(name, block_size, lookahead)
        for trial in range(3):
            case = _case(rng, kind)
            a = _request(f"a{trial}", case["tokens"], python, lora=case.get("lora", False),
                         salt=case.get("salt"), mm=case.get("mm"), embeds=case.get("embeds"))
            b = _request(f"b{trial}", case["tokens"], native, lora=case.get("lora", False),
                         salt=case.get("salt"), mm=case.get("mm"), embeds=case.get("embeds"))
            assert b.block_hashes == a.block_hashes, (block_size, case)
            for _ in range(25):  # decode: one token, or several (drafts accepted)
                new = [rng.randrange(0, 50000) for _ in range(rng.choice([1, 1, 2, 5]))]
                a.append_output_token_ids(list(new))
                b.append_output_token_ids(list(new))
                assert b.block_hashes == a.block_hashes, (block_size, case)
            # Lookahead hashes wait for their tokens: fewer hashes than full blocks.
            assert len(a.block_hashes) == max(0, a.num_tokens - lookahead) // block_size


@pytest.mark.parametrize("name", ALL_NAMES)
def test_objects_pickle_sees_twice_hash_as_in_vllm(name: str) -> None:
    """Pickle writes an object seen twice as a memo reference: a LoRA whose
    name is its path, a salt that is the name, an identifier that is the
    interned "mm" tag itself, one image twice in a block."""
    same = "adapter-x"
    cases: list[dict[str, Any]] = [
        dict(lora=LoRARequest(same, 1, same)),
        dict(lora=LoRARequest(same, 1, "/p"), salt=same),
        dict(lora=LoRARequest("lora", 1, "lora"), salt="cache_salt"),
        dict(mm=[MultiModalFeatureSpec(data=None, modality="image", identifier="mm",
                                       mm_position=PlaceholderRange(offset=1, length=2)),
                 MultiModalFeatureSpec(data=None, modality="image", identifier="mm",
                                       mm_position=PlaceholderRange(offset=3, length=2))]),
    ]
    for lookahead in (0, 2):
        python, native = _pair(name, 8, lookahead)
        for case in cases:
            tokens = list(range(40))
            reqs = []
            for hasher in (python, native):
                r = _request("r", tokens, hasher, salt=case.get("salt"), mm=case.get("mm"))
                r.lora_request = case.get("lora")
                r.block_hashes.clear()
                r.update_block_hashes()
                reqs.append(r)
            assert reqs[1].block_hashes == reqs[0].block_hashes and reqs[0].block_hashes, case


def test_resumed_hasher_on_a_multimodal_request_starts_in_the_window() -> None:
    """A hasher meeting a request that already has hashes (the engine's
    resumed requests) starts its multimodal scan at the first input ending
    after the hashed prefix (0.33.0), not at the last input (0.23.0)."""
    rng = random.Random(7)
    for name in NAMES:
        for lookahead in (0, 2):
            python, native = _pair(name, 4, lookahead)
            for _ in range(20):
                tokens = [rng.randrange(0, 100) for _ in range(rng.randint(8, 60))]
                mm = _features(rng, len(tokens))
                a = _request("a", tokens, None, mm=mm)
                b = _request("b", tokens, None, mm=mm)
                cut = rng.randrange(0, len(tokens) // 4 + 1)
                full = python(a)
                a.block_hashes.extend(full[:cut])
                b.block_hashes.extend(full[:cut])
                assert native(b) == python(a) == full[cut:]


def test_extra_keys_port_is_vllms_and_events_get_the_untagged_form() -> None:
    """hybridcache's port of generate_block_hash_extra_keys (used without
    vLLM loaded) gives 0.33.0's tagged keys; `for_event` gives what
    to_event_extra_keys publishes."""
    rng = random.Random(3)
    for _ in range(60):
        case = _case(rng, rng.choice(["lora", "salt", "mm", "mixed", "embeds"]))
        req = _request("r", case["tokens"], None, lora=case.get("lora", False), salt=case.get("salt"),
                       mm=case.get("mm"), embeds=case.get("embeds"))
        idx = 0
        for start in range(0, req.num_tokens, 4):
            want, want_idx = kv_cache_utils.generate_block_hash_extra_keys(req, start, start + 4, idx)
            got, got_idx = generate_block_hash_extra_keys(req, start, start + 4, idx, "0.33.0")
            assert (got, got_idx) == (want, want_idx)
            event, _ = generate_block_hash_extra_keys(req, start, start + 4, idx, "0.33.0", for_event=True)
            assert [event] == (kv_cache_utils.to_event_extra_keys([want]) or [None])
            idx = want_idx


def test_factory_takes_033s_signature_and_falls_back_otherwise() -> None:
    fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(fn)
    factory = hc_vllm.native_request_block_hasher(VLLM_FACTORY)
    native = hc_vllm.native_hasher_of
    for call in [(16, fn), (16, fn, 0), (16, fn, 2)]:
        assert isinstance(native(factory(*call)), BlockHasher)
    assert native(factory(16, fn, num_hash_lookahead_tokens=3)).num_hash_lookahead_tokens == 3

    def custom(data: Any) -> bytes:
        return b"x" * 32

    assert native(factory(16, custom, 1)) is None
    # Calls 0.33.0's factory does not take go to it (and fail there as in vLLM).
    with pytest.raises(TypeError):
        factory(16, fn, 1, 2)
    with pytest.raises(TypeError):
        factory(16, fn, lookahead=1)


def test_install_rebinds_the_033_engines_hasher() -> None:
    try:
        hc_vllm._install_hasher(hc_vllm.check_vllm_version())
        assert hc_vllm.native_hashing_installed()
        fn = get_hash_fn_by_name(NAMES[-1])
        kv_cache_utils.init_none_hash(fn)
        # The engine's own call (vllm/v1/engine/core.py): (hash_block_size, fn, lookahead).
        hasher = hc_vllm.native_hasher_of(engine_core.get_request_block_hasher(16, fn, 1))
        assert isinstance(hasher, BlockHasher) and hasher.none_hash == kv_cache_utils.NONE_HASH
    finally:
        hc_vllm._uninstall_hasher()
    assert engine_core.get_request_block_hasher is VLLM_FACTORY


def test_lookahead_needs_the_033_rules() -> None:
    with pytest.raises(ValueError, match="no lookahead hashes"):
        make_request_block_hasher(16, "sha256", b"\0" * 32, profile="0.23.0", num_hash_lookahead_tokens=1)
    with pytest.raises(ValueError, match="must be >= 0"):
        make_request_block_hasher(16, "sha256", b"\0" * 32, profile="0.33.0", num_hash_lookahead_tokens=-1)
    with pytest.raises(NotImplementedError, match="no hashing rules"):
        make_request_block_hasher(16, "sha256", b"\0" * 32, profile="0.1.0")


_NONE_HASH_PROBE = """
import json, sys
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from hybridcache.hashing import none_hash_for
out = {}
for name in sys.argv[1:]:
    fn = get_hash_fn_by_name(name)
    kv_cache_utils.init_none_hash(fn)
    out[name] = [kv_cache_utils.NONE_HASH.hex(), kv_cache_utils.get_none_hash_seed(),
                 none_hash_for(name, profile="0.33.0").hex(),
                 none_hash_for(name, seed=kv_cache_utils.get_none_hash_seed(), profile="0.33.0").hex()]
print(json.dumps(out))
"""


def _probe(seed: str | None) -> dict[str, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    r = subprocess.run([sys.executable, "-c", _NONE_HASH_PROBE, *NAMES], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    result: dict[str, list[str]] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("seed", [None, "1234", "random"])
def test_none_hash_identical_to_vllm_033_in_a_fresh_process(seed: str | None) -> None:
    # A second process only where the value must differ or repeat across them.
    first = _probe(seed)
    second = _probe(seed) if seed is None else first
    for name in NAMES:
        vllm_hash, vllm_seed, ours, ours_from_vllms_seed = first[name]
        assert ours_from_vllms_seed == vllm_hash  # hash_fn(seed), whatever the seed
        if seed is None and name.startswith("xxhash"):
            # A random hex seed per process: not reproducible, by design.
            assert len(vllm_seed) == 64 and int(vllm_seed, 16) >= 0
            assert second[name][0] != vllm_hash and ours != vllm_hash
        else:
            assert vllm_seed == (seed if seed is not None else "vllm-none-hash")
            assert ours == vllm_hash == second[name][0]
