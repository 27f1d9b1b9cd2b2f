#!/usr/bin/env bash
# The binding without its raw CPython entry points (`raw-ffi` off: no
# `unsafe` in the binding, the PyO3 methods serve every call): builds that
# wheel (debug, so the core's cross-checks run), installs it in a throwaway
# venv that sees the system's torch / vLLM, and runs the pytest suite
# against it. Usage: scripts/test_safe_build.sh [pytest args] (default: tests)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
PY=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
maturin build --no-default-features --features abi3 --interpreter "$PY" --out "$work/dist" >/dev/null
"$PY" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --quiet --force-reinstall --no-deps "$work"/dist/*.whl
# From a folder where ./python is not importable, so the safe wheel is tested.
cd "$work"
"$work/venv/bin/python" -c "import hybridcache._native as n; assert hasattr(n, 'NativeManager')"
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$repo" "${@:-$repo/tests}"
