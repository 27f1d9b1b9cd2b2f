#!/usr/bin/env bash
# The binding without its raw CPython entry points (`raw-ffi` off: no
# `unsafe` in the binding, the PyO3 methods serve every call): builds that
# wheel (debug, so the core's cross-checks run), installs it in a throwaway
# venv that sees the system's torch / vLLM, and runs the pytest suite
# against it. Usage: scripts/test_safe_build.sh [pytest args] (default: tests);
# RELEASE=1 builds it optimized (the debug cross-checks off, much faster).
# VENV=path tests it against that venv's packages instead (CI: the oracle
# venv, which has torch and vLLM): the throwaway venv is an overlay of VENV
# (scripts/overlay_venv.sh), so VENV keeps the wheel it has, the release
# one in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
PY=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "${VENV:-}" ]; then
  venv=$work/venv PY=$VENV/bin/python
  bash scripts/overlay_venv.sh "$VENV" "$venv"
else
  venv=$work/venv
  "$PY" -m venv --system-site-packages "$venv"
fi
maturin build ${RELEASE:+--release} --no-default-features --features abi3 --interpreter "$PY" --out "$work/dist" >/dev/null
# --force-reinstall: in an overlay, pip finds VENV's copy of the same version;
# it installs into the overlay and leaves VENV's (outside its environment) alone.
"$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps "$work"/dist/*.whl
# The repository root does not make ./python importable: the safe wheel is tested.
"$venv/bin/python" -c "
import hybridcache, hybridcache._native as n, sys
assert hybridcache.__file__.startswith('$venv'), hybridcache.__file__
print('safe build:', n.__file__)"
PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest -q -p no:cacheprovider "${@:-tests}"
