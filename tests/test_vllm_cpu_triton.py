"""The triton-cpu plugin (tests/vllm_cpu_triton.py): it wraps the CPU
platform's config check where that reads HAS_TRITON, lets a call through
only when vLLM refuses it for lack of Triton (with HAS_TRITON reading true
for that call), and leaves every other call, refusal and read as vLLM's."""

from __future__ import annotations

import os

import pytest

import vllm_cpu_triton as shim

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def _direct(cls, config):
    from vllm.triton_utils import HAS_TRITON  # noqa: F401 - the read is what counts

    return config


def _nested(cls, config):
    def inner():
        return HAS_TRITON  # noqa: F821 - never called

    return inner


def _elsewhere(cls, config):
    return config.has_triton


def test_finds_a_read_of_has_triton_in_the_code() -> None:
    assert shim.reads_has_triton(_direct)
    assert shim.reads_has_triton(_nested)
    assert not shim.reads_has_triton(_elsewhere)
    assert not shim.reads_has_triton(len)  # no code object


class _Stop(Exception):
    pass


class _Probe:
    """A config whose model_config is None and whose every other read
    records HAS_TRITON at that moment and stops the call."""

    model_config = None

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def __getattr__(self, name: str):
        import vllm.triton_utils

        self.seen.append(vllm.triton_utils.HAS_TRITON)
        raise _Stop(name)


@pytest.mark.vllm()  # whichever vLLM is installed
def test_the_shim_acts_only_where_the_cpu_platform_refuses_without_triton() -> None:
    cpu = pytest.importorskip("vllm.platforms.cpu")
    import vllm.triton_utils

    platform = cpu.CpuPlatform
    if vllm.triton_utils.HAS_TRITON:
        pytest.skip("Triton is usable here: vLLM's own check passes")
    # The suite's conftest may have wrapped it already: vLLM's own first.
    was_installed = platform.__dict__["check_and_update_config"] is not _unwrapped(platform)
    shim.uninstall()
    original = platform.__dict__["check_and_update_config"]
    # vLLM's own behaviour on a config that stops the call at its first read
    # after model_config: vLLM 0.34.0 refuses before that read, 0.33.0 warns
    # and reads on with the real (false) flag.
    probe = _Probe()
    with pytest.raises((RuntimeError, _Stop)) as raised:
        platform.check_and_update_config(probe)
    refuses = raised.type is RuntimeError
    if refuses:
        assert "Triton" in str(raised.value) and probe.seen == []
    else:
        assert probe.seen == [False]
    try:
        assert shim.install() is shim.reads_has_triton(original.__func__)
        assert shim.install() is shim.install()  # idempotent: wrapped once
        if platform.__dict__["check_and_update_config"] is not original:
            assert platform.__dict__["check_and_update_config"].__func__._original is original
        before = shim.REFUSALS_PASSED
        probe = _Probe()
        with pytest.raises(_Stop):
            platform.check_and_update_config(probe)
        # Refused: the call went on with the flag read as true. Not refused:
        # exactly vLLM's own call, with the real flag.
        assert probe.seen == ([True] if refuses else [False])
        assert shim.REFUSALS_PASSED == before + refuses
        assert vllm.triton_utils.HAS_TRITON is False
        with pytest.raises(RuntimeError, match="something else"):  # other refusals stay
            platform.check_and_update_config(_Refuses())
    finally:
        shim.uninstall()
        assert platform.__dict__["check_and_update_config"] is original
        if was_installed:
            shim.install()


def _unwrapped(platform: type) -> object:
    """The platform's own check, under the shim's wrapper if there is one."""
    raw = platform.__dict__["check_and_update_config"]
    return getattr(raw.__func__, "_original", raw)


class _Refuses:
    @property
    def model_config(self):
        raise RuntimeError("something else")
