#!/usr/bin/env bash
# Installs vLLM VERSION as a test-only oracle on a CPU machine: a small venv of
# its own over a torch venv shared by every release that pins the same torch.
#
#   bash scripts/install_oracle.sh [VERSION] [VENV]
#     VERSION  vLLM version (default the release table's first); needs
#              scripts/oracle/vllm-VERSION.txt
#     VENV     the release's venv (default .venv-vllm-MAJOR.MINOR in the repository
#              root; git ignores .venv-vllm-*)
#     PYTHON   the interpreter the venvs are made from (default python3, >= 3.10)
#     ORACLE_BASE_DIR  where the shared torch venvs live (default the repository
#              root; git ignores .venv-torch-*)
#
# Two layers:
#   * the torch venv, ORACLE_BASE_DIR/.venv-torch-PIN, named after the torch
#     pin in vLLM VERSION's wheel metadata (scripts/oracle_requirements.py
#     base-name, e.g. .venv-torch-2.14.0 for torch==2.14.0). It holds torch
#     with its dependencies (torch's PyPI wheel is the CUDA build, whose
#     import needs its nvidia-* libraries even on a CPU machine; ~5 GB) and
#     the packages of the release that created it
#     (scripts/oracle/vllm-VERSION.txt, installed with their dependencies).
#     Releases that pin the same torch share it.
#   * the release's venv, VENV: vllm==VERSION without its dependency tree
#     (--no-deps: none of flashinfer, torchaudio, ...), a .pth file that puts
#     the torch venv's site-packages on sys.path after its own, and only what
#     the torch venv lacks or holds at another version: the release's list and
#     the test tools (scripts/oracle/test-tools.txt) are installed into it, and
#     pip takes whatever the torch venv already satisfies from there. Its own
#     site-packages comes first, so a version installed here shadows the torch
#     venv's. $VENV/bin/python is the oracle's interpreter.
# Every package vLLM names gets the version range vLLM's own wheel metadata
# asks for (a pip constraints file written by scripts/oracle_requirements.py),
# so pip's resolver finds no conflict; the script checks that at the end, in
# the release's venv, and fails naming any package outside vLLM's range. The
# other requirements of vLLM (flashinfer, torchaudio, ...) are left out on
# purpose.
#
# Idempotent: a release venv that already passes the check is left as it is
# (ORACLE_FORCE=1 reinstalls into it; the torch venv is only rebuilt when its
# torch does not import at the pin). A release venv of the earlier layout (one
# venv per release holding its own torch, made by this script) is recreated in
# the new one. A version is added with its package list,
# scripts/oracle/vllm-VERSION.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
PY=${PYTHON:-python3}
VERSION=${1:-$("$PY" -c "import runpy; print(runpy.run_path('python/hybridcache/releases/table.py')['VERSIONS'][0])")}
MINOR=$(echo "$VERSION" | cut -d. -f1,2)
VENV=${2:-$repo/.venv-vllm-$MINOR}
BASE_DIR=${ORACLE_BASE_DIR:-$repo}
LIST=$repo/scripts/oracle/vllm-$VERSION.txt
TOOLS=$repo/scripts/oracle/test-tools.txt
PINS=$repo/scripts/oracle_requirements.py
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
[ -f "$LIST" ] || { echo "oracle: no package list for vLLM $VERSION ($LIST)" >&2; exit 1; }

vpy=$VENV/bin/python
PTH=_oracle_torch_venv.pth
# pip's post-install check would list every requirement of vLLM left out on
# purpose as an ERROR; oracle_requirements.py check does the real check.
pip_install() { local py=$1; shift; "$py" -m pip install --quiet --no-warn-conflicts "$@"; }
site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'; }

# The venv records what it was made from; a changed list makes it reinstall.
stamp() { cat "$LIST" "$TOOLS" "$PINS" | sha256sum | cut -d' ' -f1; }
oracle_ok() {
  [ -x "$vpy" ] && [ "$(cat "$VENV/.oracle-stamp" 2>/dev/null)" = "$(stamp)" ] &&
    [ -f "$(site_of "$vpy")/$PTH" ] &&
    "$vpy" -c "import sys, torch, vllm; sys.exit(vllm.__version__ != '$VERSION')" >/dev/null 2>&1 &&
    "$vpy" "$PINS" check >/dev/null 2>&1
}
if oracle_ok && [ -z "${ORACLE_FORCE:-}" ]; then
  echo "oracle: vLLM $VERSION venv $VENV already complete"
  "$vpy" "$PINS" check
  exit 0
fi

"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
  { echo "oracle: $PY is older than Python 3.10" >&2; exit 1; }
if [ -x "$vpy" ] && [ -f "$VENV/.oracle-stamp" ] && [ ! -f "$(site_of "$vpy")/$PTH" ]; then
  echo "oracle: $VENV holds its own torch (the earlier layout): recreating it over a shared torch venv"
  "$PY" -m venv --clear "$VENV"
elif [ ! -x "$vpy" ]; then
  echo "oracle: creating venv $VENV from $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  "$PY" -m venv "$VENV"
fi

echo "oracle: installing vllm==$VERSION (--no-deps) into $VENV"
pip_install "$vpy" --no-deps "vllm==$VERSION"
constraints=$VENV/vllm-$VERSION-constraints.txt
"$vpy" "$PINS" constraints "$constraints"

# The shared torch venv: named after vLLM's torch pin, made from the same
# interpreter as the release's venv (the .pth adds a lib/pythonX.Y path).
BASE=$BASE_DIR/.venv-$("$vpy" "$PINS" base-name)
bpy=$BASE/bin/python
torch_req=$("$vpy" "$PINS" torch-requirement)
base_ok() {
  [ -x "$bpy" ] && [ "$(cat "$BASE/.oracle-base" 2>/dev/null)" = "$torch_req" ] &&
    "$bpy" "$PINS" torch-ok "$torch_req" >/dev/null 2>&1
}
interp=$("$vpy" -c 'import sys; print(sys._base_executable)')
mkdir -p "$BASE"
exec 9>"$BASE/.oracle-lock"
command -v flock >/dev/null && flock 9  # another release's install may be building it
if base_ok; then
  echo "oracle: torch venv $BASE already complete ($torch_req)"
else
  [ -x "$bpy" ] || "$interp" -m venv "$BASE"
  echo "oracle: installing $torch_req with its dependencies and vLLM $VERSION's list into the torch venv $BASE"
  pip_install "$bpy" -c "$constraints" "$torch_req" -r "$LIST"
  echo "$torch_req" >"$BASE/.oracle-base"
  base_ok || { echo "oracle: torch does not import in $BASE at $torch_req" >&2; exit 1; }
fi
flock -u 9 2>/dev/null || true
exec 9>&-
v_xy=$("$vpy" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
b_xy=$("$bpy" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$v_xy" = "$b_xy" ] ||
  { echo "oracle: $BASE is Python $b_xy, $VENV is Python $v_xy: remove one (or set ORACLE_BASE_DIR)" >&2; exit 1; }
# After the venv's own site-packages (a .pth line runs when site processes it).
echo "import site; site.addsitedir('$(site_of "$bpy")')" >"$(site_of "$vpy")/$PTH"

echo "oracle: installing what the torch venv lacks of vLLM $VERSION's list and the test tools (vLLM's pins: $constraints)"
pip_install "$vpy" -c "$constraints" -r "$LIST" -r "$TOOLS"

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
  pip_install "$vpy" -c "$constraints" "$pkg"
done
[ -n "$ok" ] || { echo "oracle: could not make vllm.v1.core importable" >&2; exit 1; }
# A package the torch venv holds outside this release's range (one it got
# as a dependency, not named in the list): this release's version goes into
# its own venv, where it shadows the torch venv's.
mapfile -t outside < <("$vpy" "$PINS" outside)
if [ "${#outside[@]}" -gt 0 ]; then
  echo "oracle: the torch venv holds ${outside[*]} outside vLLM $VERSION's pins: installing its range into $VENV"
  pip_install "$vpy" -c "$constraints" "${outside[@]}"
fi
"$vpy" "$PINS" check
stamp >"$VENV/.oracle-stamp"
echo "oracle: vLLM $VERSION importable in $VENV (torch from $BASE)"
