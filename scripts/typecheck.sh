#!/usr/bin/env bash
# mypy over the whole Python package (config: [tool.mypy] in pyproject.toml;
# the native module is typed by python/hybridcache/_native.pyi). vLLM, torch
# and the other optional packages are typed as Any, so the result is the same
# with or without them installed.
#
#   scripts/typecheck.sh            # with python3
#   PYTHON=/path/to/python scripts/typecheck.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import mypy" 2>/dev/null; then
    echo "typecheck: installing mypy into $("$PYTHON" -c 'import sys; print(sys.prefix)')" >&2
    "$PYTHON" -m pip install --quiet "mypy>=1.10"
fi
"$PYTHON" -m mypy python/hybridcache "$@"
# The development package (dev/, not in the wheel), over the package's sources.
MYPYPATH=python:dev exec "$PYTHON" -m mypy dev/hybridcache_dev "$@"
