#!/usr/bin/env bash
# The binding without its raw CPython entry points (`raw-ffi` off: no
# `unsafe` in the binding, the PyO3 methods serve every call): builds that
# wheel (debug, so the core's cross-checks run), installs it in a throwaway
# venv that sees the system's torch / vLLM, and runs the pytest suite
# against it. Usage: scripts/test_safe_build.sh [pytest args] (default: tests);
# RELEASE=1 builds it optimized (the debug cross-checks off, much faster).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
PY=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
maturin build ${RELEASE:+--release} --no-default-features --features abi3 --interpreter "$PY" --out "$work/dist" >/dev/null
"$PY" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --quiet --force-reinstall --no-deps "$work"/dist/*.whl
# The repository root does not make ./python importable: the safe wheel is tested.
"$work/venv/bin/python" -c "
import hybridcache, sys
assert hybridcache.__file__.startswith('$work'), hybridcache.__file__
print('safe build:', hybridcache.__file__)"
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider "${@:-tests}"
