#!/usr/bin/env bash
# Installs the wheel's build tools (scripts/build-tools.txt: maturin with zig,
# auditwheel) from PyPI into their own venv, VENV (default .venv-build in the
# repository root; git ignores it), made from PYTHON (default python3, >= 3.10).
# Idempotent: a venv whose stamp matches the list is left as it is.
#
#   bash scripts/install_build_tools.sh [VENV]
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
VENV=${1:-$repo/.venv-build}
PY=${PYTHON:-python3}
LIST=$repo/scripts/build-tools.txt
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
stamp=$(sha256sum "$LIST" | cut -d' ' -f1)
if [ -x "$VENV/bin/maturin" ] && [ -x "$VENV/bin/auditwheel" ] &&
   [ "$(cat "$VENV/.tools-stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "build tools: $VENV already complete"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
    { echo "build tools: $PY is older than Python 3.10" >&2; exit 1; }
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet -r "$LIST"
"$VENV/bin/python" -m ziglang version >/dev/null
echo "$stamp" >"$VENV/.tools-stamp"
"$VENV/bin/python" -c "
from importlib.metadata import version as v
print('build tools: $VENV:', ', '.join(f'{n} {v(n)}' for n in ('maturin', 'ziglang', 'auditwheel')))"
