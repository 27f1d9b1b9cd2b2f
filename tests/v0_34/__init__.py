"""vLLM 0.34.0's own tests: its facade's differences (the hit limit, the probe, evict_first, zeroing from the config, the removed method) against its manager."""
