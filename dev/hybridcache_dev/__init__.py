"""hybridcache's development tools, kept out of the wheel: the
differential fuzz (`fuzz`, `python -m hybridcache_dev.fuzz`) and its driver
per release (`drive`, `fuzz_driver` with `bad_inputs`, a package per
release whose scheduler orders its calls differently), the
hostile fuzz (`hostile_fuzz`), and `pair` (a reference and a candidate
driven call by call, for tests). They build on the tools the user commands
share (`hybridcache.tools`)."""
