"""Native request block hashing is bit-identical to vLLM 0.23.0's.

Known answers need nothing else; the parity tests compare against vLLM's own
`hash_block_tokens`, `get_request_block_hasher`, `init_none_hash` and
`generate_block_hash_extra_keys` (xxhash variants only where the `xxhash`
package, which vLLM needs for them, is installed).
"""

from __future__ import annotations

import importlib.util
import random
import sys
from typing import Any

import pytest

# Compares against vLLM 0.23.0 (tests/conftest.py: left to that release's venv elsewhere).
pytestmark = pytest.mark.vllm("0.23.0")

from hybridcache._native import BlockHasher
from hybridcache.hashing import (
    HASH_FUNCTION_NAMES,
    generate_block_hash_extra_keys,
    make_request_block_hasher,
    none_hash_for,
)

NONE = bytes(range(100, 132))
PARENT = bytes(range(32))
HAVE_XXHASH = importlib.util.find_spec("xxhash") is not None


def names(cbor_only: bool = False) -> list[Any]:
    out = []
    for name in HASH_FUNCTION_NAMES:
        if cbor_only and not name.endswith("_cbor"):
            continue
        marks = [] if HAVE_XXHASH or not name.startswith("xxhash") else [
            pytest.mark.skip(reason="vLLM's xxhash functions need the xxhash package")
        ]
        out.append(pytest.param(name, marks=marks, id=name))
    return out


# ---- without vLLM ----------------------------------------------------------

# hashlib.sha256 / xxhash.xxh3_128 of cbor2.dumps(x, canonical=True) and of
# pickle.dumps(x, 5), x = (bytes(range(32)), tokens, extra).
KNOWN = [
    ((1, 2, 3), None, {
        "sha256_cbor": "fccdb4c6d4b7e81553546614b047df4a3d4172d78bc8a79941391c2dae5aeb0d",
        "xxhash_cbor": "f27a876667648ab1d8b157d55e51724c",
        "sha256": "7d7faf41fed165be38697385219c20dff66ae76570ab46e5457904dcbd938768",
        "xxhash": "835ad6409fb4422885f7fa0e0f8e3211",
    }),
    (tuple(range(16)), ("lora",), {
        "sha256_cbor": "ebc55749854b061806a9389d7e12e988ce65b213389b6e233268884a12fb4a4c",
        "xxhash_cbor": "3daaa6ce7ca4ececbf7e6b486812cc6d",
        "sha256": "9ec5afc05a31d66dfd875617c66ac0585feebcb525af509914b340fcb11e4e04",
        "xxhash": "173f1a4fa5c9070a3e49ce2b7cc2119f",
    }),
]


@pytest.mark.parametrize("name", HASH_FUNCTION_NAMES)
def test_known_answers(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The native path must not need Python's serializers (the fallback does).
    monkeypatch.setitem(sys.modules, "cbor2", None)
    monkeypatch.setitem(sys.modules, "pickle", None)
    h = BlockHasher(name, 4, NONE)
    for tokens, extra, want in KNOWN:
        assert h.hash_block(PARENT, list(tokens), extra).hex() == want[name]
    assert h.digest_size == (32 if name.startswith("sha256") else 16)
    assert h.hash_name == name and h.block_size == 4 and h.none_hash == NONE
    with pytest.raises(ImportError):  # and the fallback does use them
        h.hash_block(PARENT, [1, True], None)


def test_unsupported_names_and_bad_arguments() -> None:
    for bad in ("md5", "blake3", "SHA256_CBOR", ""):
        with pytest.raises(ValueError, match="unsupported hash function.*sha256_cbor"):
            BlockHasher(bad, 16, NONE)
        with pytest.raises(ValueError, match="unsupported hash function"):
            make_request_block_hasher(16, bad, none_hash=NONE)
    with pytest.raises(ValueError, match="unsupported hash function"):
        make_request_block_hasher(16, lambda x: b"", none_hash=NONE)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_size"):
        BlockHasher("sha256_cbor", 0, NONE)
    with pytest.raises(TypeError):
        BlockHasher("sha256_cbor", 16, "not bytes")  # type: ignore[arg-type]
    h = BlockHasher("sha256_cbor", 2, NONE)
    with pytest.raises(ValueError, match="extra_keys_per_block has 1 entries for 2 blocks"):
        h.hash_blocks([1, 2, 3, 4, 5], extra_keys_per_block=[None])
    with pytest.raises(ValueError, match="start_block"):
        h.hash_blocks([1, 2], start_block=-1)


@pytest.mark.parametrize("name", HASH_FUNCTION_NAMES)
def test_hash_blocks_chains_like_hash_block(name: str) -> None:
    h = BlockHasher(name, 3, NONE)
    tokens = list(range(1000, 1011))  # 3 full blocks + 2
    chain = h.hash_blocks(tokens)
    assert len(chain) == 3
    parent = None
    for i, d in enumerate(chain):
        assert d == h.hash_block(parent, tokens[3 * i : 3 * i + 3])
        parent = d
    assert h.hash_blocks(tokens, chain[0], 1) == chain[1:]
    assert h.hash_blocks(iter(tokens)) == chain  # any iterable
    assert h.hash_block(None, [1]) == h.hash_block(b"", [1]) == h.hash_block(NONE, [1])


# ---- parity with vLLM --------------------------------------------------------


@pytest.fixture(scope="module")
def kcu(vllm_available: bool) -> Any:
    import vllm.v1.core.kv_cache_utils as kcu

    return kcu


@pytest.fixture
def vllm_none_hash(kcu: Any, monkeypatch: pytest.MonkeyPatch) -> bytes:
    monkeypatch.setattr(kcu, "NONE_HASH", NONE, raising=False)
    return NONE


def vllm_fn(name: str) -> Any:
    from vllm.utils.hashing import get_hash_fn_by_name

    return get_hash_fn_by_name(name)


def random_tokens(rng: random.Random, n: int) -> list[int]:
    """Mostly vocabulary ids, with every integer width the encoders switch on."""
    edges = [0, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32, 2**63 - 1, -1, -25, -257, -(2**31) - 1, -(2**63)]
    return [rng.choice(edges) if rng.random() < 0.1 else rng.randrange(200_000) for _ in range(n)]


EXTRA_KEYS: list[Any] = [
    None,
    (),
    ("my-lora",),
    ("salt-\u00e9\u4e2d",),
    (("mm-hash-a", 0),),
    ("lora", ("mm-a", -3), ("mm-b", 5), "salt"),
    (b"\x01" * 32,),  # prompt-embeds digest
    ("x" * 300, b"y" * 300, (("nested", (1, 2)), ()), None, True, False),
    (2**64, -(2**64), -(2**64) - 1, 2**100, -(2**100), 2**130),  # bignums / LONG1
]


@pytest.mark.parametrize("name", names())
def test_hash_block_matches_vllm(name: str, kcu: Any, vllm_none_hash: bytes) -> None:
    fn = vllm_fn(name)
    h = BlockHasher(name, 16, vllm_none_hash)
    rng = random.Random(name)
    for extra in EXTRA_KEYS:
        for parent in (None, b"", PARENT, rng.randbytes(16)):
            for n in (0, 1, 5, 16, 64):
                tokens = random_tokens(rng, n)
                want = kcu.hash_block_tokens(fn, parent, tokens, extra)
                assert h.hash_block(parent, tokens, extra) == want, (parent, tokens, extra)


@pytest.mark.parametrize("name", names())
def test_fallbacks_match_vllm(name: str, kcu: Any, vllm_none_hash: bytes) -> None:
    """Shapes the core does not encode go through Python's serializer."""
    fn = vllm_fn(name)
    h = BlockHasher(name, 16, vllm_none_hash)
    s = "".join(["sa", "me"])  # one object, twice: pickle memo reference
    cases: list[tuple[Any, Any]] = [
        ([1, True, 3], None),  # bool token
        ([1, 2**70, 3], None),  # token beyond i64
        ([1, 2], (s, s)),
        ([1, 2], ((s, 1), s)),
        ([1, 2], ("", "")),
        ([1, 2], (1.5,)),  # float key
        ([1, 2], ("\udc80",)),  # lone surrogate: pickle ok, cbor2 raises
    ]
    for tokens, extra in cases:
        try:
            want = kcu.hash_block_tokens(fn, PARENT, tokens, extra)
        except Exception as e:  # noqa: BLE001 - the native one must fail alike
            with pytest.raises(type(e)):
                h.hash_block(PARENT, tokens, extra)
            continue
        assert h.hash_block(PARENT, tokens, extra) == want, (tokens, extra)


@pytest.mark.parametrize("name", [n for n in names() if not n.id.endswith("_cbor")])
def test_pickle_over_one_frame_matches_vllm(name: str, kcu: Any, vllm_none_hash: bytes) -> None:
    tokens = list(range(70_000, 70_000 + 14_000))  # 5 bytes each: > 64 KiB of pickle
    h = BlockHasher(name, len(tokens), vllm_none_hash)
    assert h.hash_blocks(tokens) == [kcu.hash_block_tokens(vllm_fn(name), None, tokens, None)]


@pytest.mark.parametrize("block_size", [1, 3, 16, 64])
@pytest.mark.parametrize("name", names())
def test_hash_blocks_matches_vllm(name: str, block_size: int, kcu: Any, vllm_none_hash: bytes) -> None:
    fn = vllm_fn(name)
    h = BlockHasher(name, block_size, vllm_none_hash)
    rng = random.Random(f"{name}{block_size}")
    for _ in range(5):
        tokens = random_tokens(rng, rng.randrange(0, 6 * block_size + 3))
        start_block = rng.randrange(0, 3)
        parent = PARENT if start_block else None
        n = max(0, len(tokens) // block_size - start_block)
        extra = [rng.choice(EXTRA_KEYS) for _ in range(n)]
        want, prev = [], parent
        for i in range(n):
            b = (start_block + i) * block_size
            prev = kcu.hash_block_tokens(fn, prev, tokens[b : b + block_size], extra[i])
            want.append(prev)
        assert h.hash_blocks(tokens, parent, start_block, extra) == want


def make_requests(name: str, block_size: int, kcu: Any, **kw: Any) -> tuple[Any, Any]:
    """The same request twice: hashed by vLLM's hasher and by ours."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    theirs = kcu.get_request_block_hasher(block_size, vllm_fn(name))
    ours = make_request_block_hasher(block_size, vllm_fn(name))  # vLLM's fn object works too
    assert ours.none_hash is NONE  # picked up vLLM's NONE_HASH
    args = dict(sampling_params=SamplingParams(max_tokens=10_000), pooling_params=None, **kw)
    return Request("a", block_hasher=theirs, **args), Request("b", block_hasher=ours, **args)


def mm_features(rng: random.Random, prompt_len: int) -> list[Any]:
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    out, pos = [], rng.randrange(0, 8)
    while pos < prompt_len - 1:
        length = rng.randrange(1, 40)
        length = min(length, prompt_len - pos)
        ident = rng.choice(["img-a", "img-b", f"img-{pos}"])
        out.append(MultiModalFeatureSpec(data=None, modality="image", identifier=ident,
                                         mm_position=PlaceholderRange(offset=pos, length=length)))
        pos += length + rng.randrange(0, 30)
    return out


@pytest.mark.parametrize("block_size", [1, 4, 16, 64])
@pytest.mark.parametrize("name", names())
def test_request_block_hasher_matches_vllm(
    name: str, block_size: int, kcu: Any, vllm_none_hash: bytes
) -> None:
    from vllm.lora.request import LoRARequest

    rng = random.Random(f"req{name}{block_size}")
    for trial in range(8):
        prompt_len = rng.randrange(0 if trial else 1, 5 * block_size + 40)
        prompt = random_tokens(rng, prompt_len) if trial % 2 else [rng.randrange(50_000) for _ in range(prompt_len)]
        kw: dict[str, Any] = {"prompt_token_ids": prompt}
        if trial % 4 in (1, 3):
            kw["lora_request"] = LoRARequest(f"lora-{trial}", trial + 1, "/nowhere")
        if trial % 4 in (2, 3):
            kw["cache_salt"] = rng.choice(["salt", "", "s\u00e9l"])
        if trial >= 4 and prompt_len > 1:
            kw["mm_features"] = mm_features(rng, prompt_len)
        theirs, ours = make_requests(name, block_size, kcu, **kw)
        assert ours.block_hashes == theirs.block_hashes
        for _ in range(rng.randrange(1, 12)):
            new = [rng.randrange(50_000) for _ in range(rng.choice([1, 1, 1, block_size, 3 * block_size + 1]))]
            theirs.append_output_token_ids(new)
            ours.append_output_token_ids(new)
            assert ours.block_hashes == theirs.block_hashes
        assert len(ours.block_hashes) == ours.num_tokens // block_size


@pytest.mark.parametrize("name", names(cbor_only=True))
def test_request_with_prompt_embeds_matches_vllm(name: str, kcu: Any, vllm_none_hash: bytes) -> None:
    import torch

    embeds = torch.arange(37 * 4, dtype=torch.float32).reshape(37, 4)
    theirs, ours = make_requests(name, 8, kcu, prompt_token_ids=None, prompt_embeds=embeds)
    assert len(theirs.block_hashes) == 4
    assert ours.block_hashes == theirs.block_hashes
    theirs.append_output_token_ids([5, 6, 7])
    ours.append_output_token_ids([5, 6, 7])
    assert ours.block_hashes == theirs.block_hashes


def test_same_object_lora_name_and_salt(kcu: Any, vllm_none_hash: bytes) -> None:
    """lora_name and cache_salt being one object changes vLLM's pickle."""
    from vllm.lora.request import LoRARequest

    s = "".join(["x", "y"])
    for name in ("sha256", "sha256_cbor"):
        theirs, ours = make_requests(name, 4, kcu, prompt_token_ids=list(range(9)),
                                     lora_request=LoRARequest(s, 1, "/p"), cache_salt=s)
        assert ours.block_hashes == theirs.block_hashes


def test_extra_keys_port_matches_vllm(kcu: Any) -> None:
    """The port used when vLLM is not loaded equals vLLM's function."""
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    rng = random.Random(7)
    for trial in range(30):
        n = rng.randrange(1, 200)
        req = Request("r", list(range(n)), SamplingParams(max_tokens=1), None,
                      mm_features=mm_features(rng, n),
                      lora_request=LoRARequest("l", 1, "/p") if trial % 2 else None,
                      cache_salt="salt" if trial % 3 == 0 else None)
        bs = rng.choice([1, 4, 16])
        ours_idx = theirs_idx = 0
        for start in range(0, n - bs + 1, bs):
            if start and rng.random() < 0.2:
                ours_idx = theirs_idx = -1
            a, ours_idx = generate_block_hash_extra_keys(req, start, start + bs, ours_idx)
            b, theirs_idx = kcu.generate_block_hash_extra_keys(req, start, start + bs, theirs_idx)
            assert (a, ours_idx) == (b, theirs_idx)


@pytest.mark.parametrize("name", names())
def test_none_hash_matches_init_none_hash(name: str, kcu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "1234")
    monkeypatch.setattr(kcu, "NONE_HASH", b"", raising=False)
    kcu.init_none_hash(vllm_fn(name))
    assert none_hash_for(name) == kcu.NONE_HASH
    assert make_request_block_hasher(16, name).none_hash == kcu.NONE_HASH


def test_bound_hasher_answers_as_the_hasher() -> None:
    """The engine's hasher under `install()` (`BlockHasher._bound_call`, a
    one-argument builtin): the same hashes as calling the hasher, whether
    the request has a new full block or not, and the same errors."""
    from types import SimpleNamespace

    h = BlockHasher("sha256_cbor", 4, NONE)
    bound = h._bound_call()
    assert getattr(bound, "__self__", bound) is h
    r = SimpleNamespace(block_hashes=[], _all_token_ids=[], mm_features=None, prompt_embeds=None,
                        lora_request=None, cache_salt=None)
    for token in range(1, 14):
        r._all_token_ids.append(token)
        got = bound(r)
        assert got == h(r)
        assert got == ([] if token % 4 else [h.hash_block(r.block_hashes[-1] if r.block_hashes else None,
                                                          r._all_token_ids[-4:])])
        r.block_hashes.extend(got)
    assert len(r.block_hashes) == 3
    # Lists of other types, or no such attributes: the hasher's own path and errors.
    t = SimpleNamespace(block_hashes=tuple(r.block_hashes[:1]), _all_token_ids=list(range(1, 9)),
                        mm_features=None, prompt_embeds=None, lora_request=None, cache_salt=None)
    assert bound(t) == h(t) == [r.block_hashes[1]]
    for bad in (None, object()):
        with pytest.raises(AttributeError) as theirs:
            h(bad)
        with pytest.raises(AttributeError) as ours:
            bound(bad)
        assert str(ours.value) == str(theirs.value)
