"""The fuzz driver of vLLM 0.33.0 (and its deferred frees, queries and Mamba guard)."""
