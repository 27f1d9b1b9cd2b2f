#!/usr/bin/env bash
# Installs vLLM VERSION as a test-only oracle, in its own venv, on a CPU machine.
#
#   bash scripts/install_oracle.sh [VERSION] [VENV]
#     VERSION  vLLM version (default 0.23.0; 0.33.0 too); needs scripts/oracle/vllm-VERSION.txt
#     VENV     the venv (default .venv-vllm-MAJOR.MINOR in the repository root,
#              e.g. .venv-vllm-0.23; git ignores .venv-vllm-*)
#     PYTHON   the interpreter the venv is made from (default python3, >= 3.10)
#
# In the venv: the vLLM wheel without its dependency tree (--no-deps: none of
# flashinfer, torchaudio, ...), the packages its KV-cache manager and scheduler
# import (scripts/oracle/vllm-VERSION.txt, plus any an import loop finds
# missing), and the test tools (scripts/oracle/test-tools.txt). Every package
# vLLM names gets the version range vLLM's own wheel metadata asks for (a pip
# constraints file written by scripts/oracle_requirements.py: torch==2.11.0
# for 0.23.0, torch==2.14.0 for 0.33.0), so pip's resolver finds no conflict;
# the script checks that at the end and fails naming any package outside
# vLLM's range. The other requirements of vLLM (flashinfer, torchaudio, ...)
# are left out on purpose. The lists are installed with their dependencies:
# torch's PyPI wheel is the CUDA build, whose import needs its nvidia-*
# libraries even on a CPU machine.
#
# Idempotent: a venv that already passes the check is left as it is
# (ORACLE_FORCE=1 reinstalls into it). One venv per vLLM version, so oracles
# of several versions sit side by side; a version is added with its package
# list, scripts/oracle/vllm-VERSION.txt (0.33.0's is the set that
# ../shared/reference/vllm-0.23-to-0.33.md section 5 found to work).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
VERSION=${1:-0.23.0}
MINOR=$(echo "$VERSION" | cut -d. -f1,2)
VENV=${2:-$repo/.venv-vllm-$MINOR}
PY=${PYTHON:-python3}
LIST=$repo/scripts/oracle/vllm-$VERSION.txt
TOOLS=$repo/scripts/oracle/test-tools.txt
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
[ -f "$LIST" ] || { echo "oracle: no package list for vLLM $VERSION ($LIST)" >&2; exit 1; }

vpy=$VENV/bin/python
# pip's post-install check would list every requirement of vLLM left out on
# purpose as an ERROR; oracle_requirements.py check does the real check.
pip_install() { "$vpy" -m pip install --quiet --no-warn-conflicts "$@"; }

# The venv records what it was made from; a changed list makes it reinstall.
stamp() { cat "$LIST" "$TOOLS" "$repo/scripts/oracle_requirements.py" | sha256sum | cut -d' ' -f1; }
oracle_ok() {
  [ -x "$vpy" ] && [ "$(cat "$VENV/.oracle-stamp" 2>/dev/null)" = "$(stamp)" ] &&
    "$vpy" -c "import sys, vllm; sys.exit(vllm.__version__ != '$VERSION')" >/dev/null 2>&1 &&
    "$vpy" "$repo/scripts/oracle_requirements.py" check >/dev/null 2>&1
}
if oracle_ok && [ -z "${ORACLE_FORCE:-}" ]; then
  echo "oracle: vLLM $VERSION venv $VENV already complete"
  "$vpy" "$repo/scripts/oracle_requirements.py" check
  exit 0
fi

if [ ! -x "$vpy" ]; then
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
    { echo "oracle: $PY is older than Python 3.10" >&2; exit 1; }
  echo "oracle: creating venv $VENV from $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  "$PY" -m venv "$VENV"
fi

echo "oracle: installing vllm==$VERSION (--no-deps) into $VENV"
pip_install --no-deps "vllm==$VERSION"
constraints=$VENV/vllm-$VERSION-constraints.txt
"$vpy" "$repo/scripts/oracle_requirements.py" constraints "$constraints"
echo "oracle: installing what vllm.v1.core imports and the test tools (vLLM's pins: $constraints)"
pip_install -c "$constraints" -r "$LIST" -r "$TOOLS"

# Map module names that differ from their PyPI names.
declare -A PKG=( [zmq]=pyzmq [yaml]=pyyaml [cpuinfo]=py-cpuinfo [PIL]=pillow
                 [google]=protobuf [cv2]=opencv-python-headless [sklearn]=scikit-learn )
ok=""
for _ in $(seq 1 30); do
  # vLLM logs to stdout on import, so the answer goes through a file.
  out=$(mktemp)
  "$vpy" - "$out" >/dev/null 2>&1 <<'PY' || true
import importlib, sys
missing = ""
for mod in ("vllm.v1.core.kv_cache_manager", "vllm.v1.core.sched.scheduler",
            "vllm.distributed.kv_events"):
    try:
        importlib.import_module(mod)
    except ModuleNotFoundError as e:
        missing = e.name.split(".")[0]
        break
    except Exception as e:  # importable deps but broken: report, do not loop
        missing = "!" + repr(e)
        break
open(sys.argv[1], "w").write(missing)
PY
  missing=$(cat "$out"); rm -f "$out"
  [ -z "$missing" ] && { ok=1; break; }
  case "$missing" in "!"*) echo "oracle: import failed: ${missing#!}" >&2; exit 1;; esac
  pkg=${PKG[$missing]:-$missing}
  echo "oracle: installing missing module $missing ($pkg); add it to $LIST"
  pip_install -c "$constraints" "$pkg"
done
[ -n "$ok" ] || { echo "oracle: could not make vllm.v1.core importable" >&2; exit 1; }
"$vpy" "$repo/scripts/oracle_requirements.py" check
stamp >"$VENV/.oracle-stamp"
echo "oracle: vLLM $VERSION importable in $VENV"
