"""vLLM 0.33.0's own tests: its facade, views, layouts, tools and scheduler, against its manager."""
