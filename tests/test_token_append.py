"""The native `Request.append_output_token_ids` (`hybridcache.vllm_tokens`,
part of `install()`'s native hashing), in every oracle venv: differential
against vLLM's own method on twin requests, token by token. Tokens, output
tokens and block hashes stay identical, and so do errors, for
hybridcache's hasher (with and, on 0.33.0, without lookahead), vLLM's
Python hasher, no hasher, every spelling of the call and a subclass
overriding `update_block_hashes`. install() / uninstall() put it on and
take it off; `install(native_hashing=False)` leaves vLLM's. Without the
raw-ffi feature there is no descriptor and vLLM's method stays."""

from __future__ import annotations

import random
from typing import Any

import pytest

pytestmark = pytest.mark.vllm("0.23.0", "0.33.0", "0.34.0")

vllm = pytest.importorskip("vllm")

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

import hybridcache.vllm as hc_vllm  # noqa: E402
from hybridcache import _native, releases, vllm_tokens  # noqa: E402

VLLM_APPEND = Request.__dict__["append_output_token_ids"]
RELEASE = releases.find(vllm.__version__)
# Lookahead tokens where the installed release's hasher takes them.
HASH_LOOKAHEAD = RELEASE is not None and RELEASE.hash_lookahead
LOOKAHEADS = (0, 1, 3) if HASH_LOOKAHEAD else (0,)


def _has_descriptor() -> bool:
    ok = vllm_tokens.install_token_append()
    vllm_tokens.uninstall_token_append()
    return ok


RAW_FFI = _has_descriptor()
needs_descriptor = pytest.mark.skipif(not RAW_FFI, reason="the binding is built without raw-ffi")


@pytest.fixture(autouse=True)
def _clean() -> Any:
    hc_vllm.uninstall()
    yield
    hc_vllm.uninstall()
    assert Request.__dict__["append_output_token_ids"] is VLLM_APPEND


def _hashers(block_size: int, lookahead: int) -> dict[str, Any]:
    fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(fn)
    args = (block_size, fn) + ((lookahead,) if HASH_LOOKAHEAD else ())
    native = hc_vllm.native_request_block_hasher(kv_cache_utils.get_request_block_hasher)(*args)
    assert hc_vllm.native_hasher_of(native) is not None
    return {"native": native, "vllm": kv_cache_utils.get_request_block_hasher(*args), "none": None}


def _request(rid: str, tokens: list[int], hasher: Any, cls: type = Request) -> Any:
    params = SamplingParams(max_tokens=64)
    return cls(request_id=rid, prompt_token_ids=list(tokens), sampling_params=params, pooling_params=None,
               arrival_time=0.0, block_hasher=hasher)


def _state(r: Any) -> tuple[Any, ...]:
    return list(r._output_token_ids), list(r._all_token_ids), list(r.block_hashes)


def _outcome(call: Any) -> Any:
    try:
        return ("ok", call())
    except Exception as e:  # noqa: BLE001 - the differential compares errors too
        return ("error", type(e), str(e))


def _twins(rid: str, tokens: list[int], hasher: Any, cls: type = Request) -> tuple[Any, Any]:
    return _request(rid, tokens, hasher, cls), _request(rid, tokens, hasher, cls)


@needs_descriptor
def test_the_engines_native_hasher_puts_it_on_and_uninstall_takes_it_off() -> None:
    import vllm.v1.engine.core as engine_core

    fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(fn)
    hc_vllm.install()
    assert not vllm_tokens.token_append_installed()  # until the engine builds its hasher
    assert hc_vllm.native_hasher_of(engine_core.get_request_block_hasher(16, fn)) is not None
    assert vllm_tokens.token_append_installed()
    assert Request.__dict__["append_output_token_ids"] is not VLLM_APPEND
    hc_vllm.install()  # idempotent
    assert vllm_tokens.token_append_installed()

    # A hash function hybridcache does not reproduce: vLLM's hasher, and
    # vLLM's method (requests hashed in Python keep their Python path).
    def custom(data: Any) -> bytes:
        return b"x" * 32

    assert hc_vllm.native_hasher_of(engine_core.get_request_block_hasher(16, custom)) is None
    assert not vllm_tokens.token_append_installed()
    engine_core.get_request_block_hasher(16, fn)
    assert vllm_tokens.token_append_installed()
    hc_vllm.uninstall()
    assert not vllm_tokens.token_append_installed()
    hc_vllm.install(native_hashing=False)
    assert engine_core.get_request_block_hasher is kv_cache_utils.get_request_block_hasher
    assert not vllm_tokens.token_append_installed() and hc_vllm.is_installed()


@needs_descriptor
@pytest.mark.parametrize("lookahead", LOOKAHEADS)
@pytest.mark.parametrize("kind", ["native", "vllm", "none"])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_appends_and_hashes_as_vllms_method(kind: str, block_size: int, lookahead: int) -> None:
    rng = random.Random(f"{kind}-{block_size}-{lookahead}")
    hasher = _hashers(block_size, lookahead)[kind]
    assert vllm_tokens.install_token_append()
    for trial in range(4):
        prompt = [rng.randrange(50000) for _ in range(rng.randint(1, 40))]
        theirs, ours = _twins(f"r{trial}", prompt, hasher)
        for _ in range(60):
            spelling = rng.choice(["int", "int", "int", "bool", "list", "tuple", "keyword", "empty"])
            token = rng.randrange(50000)
            args: tuple[Any, ...] = ()
            kwargs: dict[str, Any] = {}
            if spelling == "int":
                args = (token,)
            elif spelling == "bool":
                args = (bool(token % 2),)
            elif spelling == "list":
                args = ([token, rng.randrange(50000)],)
            elif spelling == "tuple":
                args = ((token,) * rng.randint(1, 5),)
            elif spelling == "keyword":
                kwargs = {"token_ids": token}
            else:
                args = ([],)
            want = _outcome(lambda: VLLM_APPEND(theirs, *args, **kwargs))
            got = _outcome(lambda: ours.append_output_token_ids(*args, **kwargs))
            assert got == want, spelling
            assert _state(ours) == _state(theirs), spelling
        if kind != "none":
            assert len(ours.block_hashes) == max(0, ours.num_tokens - lookahead) // block_size


@needs_descriptor
def test_errors_and_odd_callers_as_vllms_method() -> None:
    hashers = _hashers(4, 0)
    assert vllm_tokens.install_token_append()
    theirs, ours = _twins("r", list(range(7)), hashers["native"])
    bad_calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((), {}), ((1, 2), {}), ((), {"tokens": 1}), ((None,), {}), ((1.5,), {}), (("ab",), {}),
    ]
    for args, kwargs in bad_calls:
        want = _outcome(lambda: VLLM_APPEND(theirs, *args, **kwargs))
        got = _outcome(lambda: ours.append_output_token_ids(*args, **kwargs))
        assert got[:2] == want[:2], (args, kwargs)
        assert _state(ours) == _state(theirs), (args, kwargs)
    # Another builtin bound to the hasher is not the hasher: vLLM's rule calls it.
    native = hc_vllm.native_hasher_of(hashers["native"])
    theirs._block_hasher = ours._block_hasher = native.digest
    assert _outcome(lambda: ours.append_output_token_ids(5))[:2] == \
        _outcome(lambda: VLLM_APPEND(theirs, 5))[:2]
    assert _state(ours) == _state(theirs)

    # A hasher that raises: the tokens are appended, no hash is, as in vLLM.
    def broken(request: Any) -> list[bytes]:
        raise RuntimeError("hasher down")

    theirs._block_hasher = ours._block_hasher = broken
    assert _outcome(lambda: ours.append_output_token_ids(5)) == _outcome(lambda: VLLM_APPEND(theirs, 5))
    assert _state(ours) == _state(theirs)
    # A request missing its token list: vLLM's method appends the output
    # token, then fails on the other list.
    theirs, ours = _twins("gone", list(range(7)), hashers["native"])
    del theirs._all_token_ids, ours._all_token_ids
    assert _outcome(lambda: ours.append_output_token_ids(5))[:2] == \
        _outcome(lambda: VLLM_APPEND(theirs, 5))[:2]
    assert list(ours._output_token_ids) == list(theirs._output_token_ids) == [5]
    # block_hashes replaced by something that is not a list: vLLM's rule.
    theirs, ours = _twins("r2", list(range(7)), hashers["native"])
    theirs.block_hashes, ours.block_hashes = tuple(theirs.block_hashes), tuple(ours.block_hashes)
    assert _outcome(lambda: ours.append_output_token_ids(5)) == _outcome(lambda: VLLM_APPEND(theirs, 5))
    assert _state(ours) == _state(theirs)


@needs_descriptor
def test_a_subclass_and_a_replaced_update_run_their_own() -> None:
    seen: list[str] = []

    class Traced(Request):  # type: ignore[misc]
        def update_block_hashes(self) -> None:
            seen.append(self.request_id)
            super().update_block_hashes()

    hasher = _hashers(4, 0)["native"]
    assert vllm_tokens.install_token_append()
    r = _request("sub", list(range(6)), hasher, Traced)
    seen.clear()
    r.append_output_token_ids(9)
    assert seen == ["sub"]
    # A replaced update_block_hashes: the next install keeps vLLM's method,
    # which calls the replacement.
    plain = _request("plain", list(range(6)), hasher)
    original_update = Request.__dict__["update_block_hashes"]
    try:
        Request.update_block_hashes = lambda self: seen.append("replaced")  # type: ignore[method-assign]
        assert not vllm_tokens.install_token_append()
        assert Request.__dict__["append_output_token_ids"] is VLLM_APPEND
        plain.append_output_token_ids(9)
    finally:
        Request.update_block_hashes = original_update  # type: ignore[method-assign]
    assert seen == ["sub", "replaced"]
    assert vllm_tokens.install_token_append()


@needs_descriptor
def test_another_method_in_place_is_kept() -> None:
    def other(self: Any, token_ids: Any) -> None:
        raise AssertionError("not vLLM's")

    Request.append_output_token_ids = other  # type: ignore[method-assign]
    try:
        assert not vllm_tokens.install_token_append()
        assert Request.__dict__["append_output_token_ids"] is other
    finally:
        Request.append_output_token_ids = VLLM_APPEND  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="stands for"):
        _native.native_token_append(Request, other, Request.__dict__["update_block_hashes"])


@pytest.mark.skipif(RAW_FFI, reason="the binding has the raw-ffi descriptor")
def test_without_raw_ffi_vllms_method_stays() -> None:
    hc_vllm.install()
    _hashers(16, 0)
    hc_vllm.native_request_block_hasher(kv_cache_utils.get_request_block_hasher, token_append=True)(
        16, get_hash_fn_by_name("sha256"))
    assert not vllm_tokens.token_append_installed()
    assert Request.__dict__["append_output_token_ids"] is VLLM_APPEND


_SHADOWED_FIELD = '''
import sys
from hybridcache import _native
from hybridcache.hashing import make_request_block_hasher

reads = []


class Shaped:
    """vLLM's Request as the native append reads it, but with a property
    named like a field, shadowing a stale entry of the same name in the
    instance dict (as a data descriptor does in CPython's lookup)."""

    def __init__(self, prompt, hasher):
        self._output_token_ids = []
        self._all_token_ids = list(prompt)
        self._block_hasher = hasher
        self._hashes = []
        self.__dict__["block_hashes"] = ["stale"]

    @property
    def block_hashes(self):
        reads.append(1)
        return self._hashes

    def append_output_token_ids(self, token_ids):
        raise AssertionError("replaced by the native descriptor")

    def update_block_hashes(self):
        raise AssertionError("the native hasher's requests are hashed by the descriptor")


d = _native.native_token_append(Shaped, Shaped.__dict__["append_output_token_ids"],
                                Shaped.__dict__["update_block_hashes"])
if d is None:
    print("no raw-ffi")
    sys.exit(0)
Shaped.append_output_token_ids = d
r = Shaped(list(range(3)), make_request_block_hasher(4, "sha256_cbor")._bound_call())
for t in range(10):
    r.append_output_token_ids(t)
assert r._all_token_ids == list(range(3)) + list(range(10)) and r._output_token_ids == list(range(10))
assert len(reads) >= 10, reads  # every append, and the hashing of each new block
assert len(r._hashes) == 3 and r.__dict__["block_hashes"] == ["stale"], (r._hashes, r.__dict__["block_hashes"])
print("ok")
'''


def test_a_class_attribute_named_like_a_field_is_honoured() -> None:
    """The descriptor reads the request's fields from its dict only where
    the class defines none of them: a property of that name wins over the
    dict's entry, as in CPython's lookup (a fresh process: the descriptor
    is made for one class per process)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _SHADOWED_FIELD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("ok", "no raw-ffi")
    if RAW_FFI:
        assert out.stdout.strip() == "ok"
