"""The fuzz driver of vLLM 0.33.0 (and its deferred frees, queries and Mamba
guard), as `hybridcache_dev.drive` finds a release's own driver package:
`Driver` and `guard_reference`."""

from hybridcache_dev.v0_33.fuzz_mamba_guard import GuardedDriver as Driver
from hybridcache_dev.v0_33.fuzz_mamba_guard import guard_reference

__all__ = ["Driver", "guard_reference"]
