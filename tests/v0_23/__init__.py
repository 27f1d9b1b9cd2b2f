"""vLLM 0.23.0's own tests: parity with its manager, scheduler and engine (module marker `vllm("0.23.0")`)."""
