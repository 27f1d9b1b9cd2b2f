"""The triton-cpu plugin (tests/vllm_cpu_triton.py): it finds the CPU
platform's Triton check by the code that reads HAS_TRITON, lets that one
classmethod call see HAS_TRITON true, and leaves every other read and every
vLLM without the check alone."""

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
def test_the_shim_acts_only_where_the_cpu_platform_checks_triton() -> None:
    cpu = pytest.importorskip("vllm.platforms.cpu")
    import vllm.triton_utils

    platform = cpu.CpuPlatform
    original = platform.__dict__["check_and_update_config"]
    checks = shim.reads_has_triton(original.__func__)
    try:
        assert shim.install() is checks
        if not checks:  # e.g. vLLM 0.33.0: nothing to do, nothing touched
            assert platform.__dict__["check_and_update_config"] is original
            return
        assert shim.install() is True  # idempotent: wrapped once
        wrapped = platform.__dict__["check_and_update_config"]
        assert wrapped.__func__._original is original
        if vllm.triton_utils.HAS_TRITON or platform.get_cpu_architecture() != cpu.CpuArchEnum.X86:
            pytest.skip("Triton is usable here (or the CPU is not x86): vLLM's own check passes")
        # With the shim the call gets past the check (to the probe's first
        # read after it), seeing HAS_TRITON true; the flag is false again after.
        probe = _Probe()
        with pytest.raises(_Stop):
            platform.check_and_update_config(probe)
        assert probe.seen[:1] == [True]
        assert vllm.triton_utils.HAS_TRITON is False
        # Without it, vLLM refuses before reading anything else.
        shim.uninstall()
        assert platform.__dict__["check_and_update_config"] is original
        probe = _Probe()
        with pytest.raises(RuntimeError, match="Triton"):
            platform.check_and_update_config(probe)
        assert probe.seen == []
    finally:
        shim.uninstall()
        assert platform.__dict__["check_and_update_config"] is original
