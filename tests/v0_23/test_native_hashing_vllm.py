"""`hybridcache.vllm.install()` gives vLLM's engine hybridcache's native request
block hasher: bit-identical block hashes for each of vLLM's hash functions and
extra-key cases, vLLM's own hasher for any other function, one switch to turn
it off, and uninstall() restoring vLLM's. The scheduler lock-step
(tests/v0_23/test_vllm_scheduler_e2e.py) pins identical schedules and events with it."""

from __future__ import annotations

import random
from typing import Any

import pytest

# Compares against vLLM 0.23.0 (tests/conftest.py: left to that release's venv elsewhere).
pytestmark = pytest.mark.vllm("0.23.0")

from hybridcache_dev.oracle import module_needs_vllm  # noqa: E402

vllm = module_needs_vllm("0.23.0")

import vllm.v1.engine.core as engine_core  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

import hybridcache.vllm as hc_vllm  # noqa: E402
from hybridcache.hashing import BlockHasher  # noqa: E402

VLLM_FACTORY = kv_cache_utils.get_request_block_hasher


@pytest.fixture(autouse=True)
def _clean() -> Any:
    hc_vllm.uninstall()
    yield
    hc_vllm.uninstall()
    assert engine_core.get_request_block_hasher is VLLM_FACTORY


def test_install_rebinds_the_engines_hasher_and_uninstall_restores() -> None:
    hc_vllm.install()
    assert hc_vllm.native_hashing_installed()
    assert engine_core.get_request_block_hasher is not VLLM_FACTORY
    hc_vllm.install()  # idempotent: not wrapped twice
    assert getattr(engine_core.get_request_block_hasher, "hybridcache_native", False)
    hc_vllm.uninstall()
    assert engine_core.get_request_block_hasher is VLLM_FACTORY and not hc_vllm.native_hashing_installed()


def test_the_switch_keeps_vllms_hasher(monkeypatch: Any) -> None:
    hc_vllm.install(native_hashing=False)
    assert hc_vllm.is_installed() and engine_core.get_request_block_hasher is VLLM_FACTORY
    hc_vllm.uninstall()
    monkeypatch.setenv(hc_vllm.NATIVE_HASHING_ENV, "0")
    hc_vllm.install()
    assert engine_core.get_request_block_hasher is VLLM_FACTORY
    hc_vllm.uninstall()
    monkeypatch.setenv(hc_vllm.NATIVE_HASHING_ENV, "maybe")
    with pytest.raises(ValueError, match="HYBRIDCACHE_NATIVE_HASHING"):
        hc_vllm.install()


def test_other_hash_functions_fall_back_to_vllms_hasher() -> None:
    factory = hc_vllm.native_request_block_hasher(VLLM_FACTORY)

    def custom(data: Any) -> bytes:
        return b"x" * 32

    assert hc_vllm.native_hasher_of(factory(16, custom)) is None
    assert isinstance(hc_vllm.native_hasher_of(factory(16, get_hash_fn_by_name("sha256"))), BlockHasher)


def _request(rid: str, tokens: list[int], lora: bool, salt: str | None) -> Request:
    params = SamplingParams(max_tokens=64)
    params.update_from_generation_config({}, 50256)
    return Request(request_id=rid, prompt_token_ids=tokens, sampling_params=params, pooling_params=None,
                   arrival_time=0.0, cache_salt=salt,
                   lora_request=LoRARequest("adapter-a", 3, "/tmp/adapter-a") if lora else None)


@pytest.mark.parametrize("name", ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"])
@pytest.mark.parametrize("lora,salt", [(False, None), (True, None), (False, "salt-1"), (True, "salt-2")])
@pytest.mark.parametrize("block_size,seed", [(4, None), (16, None), (16, "1234")])
def test_block_hashes_identical_to_vllms(name: str, lora: bool, salt: str | None, block_size: int,
                                         seed: str | None, monkeypatch: Any) -> None:
    # NONE_HASH: random per process without PYTHONHASHSEED, hash_fn(seed) with it.
    if seed is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", seed)
    fn = get_hash_fn_by_name(name)
    kv_cache_utils.init_none_hash(fn)
    native = hc_vllm.native_request_block_hasher(VLLM_FACTORY)(block_size, fn)
    assert isinstance(hc_vllm.native_hasher_of(native), BlockHasher)
    python = VLLM_FACTORY(block_size, fn)
    rng = random.Random(hash((name, lora, salt, block_size)) & 0xFFFF)
    prompt = [rng.randrange(0, 50000) for _ in range(rng.randint(1, 70))]
    a, b = _request("a", prompt, lora, salt), _request("b", prompt, lora, salt)
    a.block_hashes.extend(python(a))
    b.block_hashes.extend(native(b))
    for _ in range(40):  # decode: tokens arrive one or several at a time
        new = [rng.randrange(0, 50000) for _ in range(rng.choice([1, 1, 3]))]
        a.append_output_token_ids(list(new))
        b.append_output_token_ids(list(new))
        a.block_hashes.extend(python(a))
        b.block_hashes.extend(native(b))
        assert b.block_hashes == a.block_hashes
    assert len(a.block_hashes) == a.num_tokens // block_size
