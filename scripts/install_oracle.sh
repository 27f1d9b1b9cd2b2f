#!/usr/bin/env bash
# Installs vLLM 0.23.0 as a test-only oracle on a CPU machine: the wheel without
# its heavy dependency tree, then only the packages that vllm.v1.core and the
# scheduler import, found by importing them in a loop.
set -euo pipefail
PY=${PYTHON:-python3}
export HF_HUB_OFFLINE=1
pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check "$@"; }

if ! "$PY" -c 'import vllm, sys; sys.exit(vllm.__version__ != "0.23.0")' 2>/dev/null; then
  pip_install --no-deps vllm==0.23.0
fi
# Known imports first (one resolver pass), then the loop catches anything new.
pip_install numpy msgspec cbor2 regex cachetools psutil pydantic cloudpickle pyzmq \
  typing_extensions pyyaml packaging urllib3 aiohttp requests openai-harmony openai \
  pillow pybase64 uvloop py-cpuinfo prometheus_client xgrammar fastapi \
  partial_json_parser llguidance gguf 'transformers<5.21' blake3 xxhash torch

# Map module names that differ from their PyPI names.
declare -A PKG=( [zmq]=pyzmq [yaml]=pyyaml [cpuinfo]=py-cpuinfo [PIL]=pillow
                 [google]=protobuf [cv2]=opencv-python-headless [sklearn]=scikit-learn )
for _ in $(seq 1 30); do
  # vLLM logs to stdout on import, so the answer goes through a file.
  out=$(mktemp)
  "$PY" - "$out" >/dev/null 2>&1 <<'PY' || true
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
  [ -z "$missing" ] && { echo "vLLM 0.23.0 oracle importable"; exit 0; }
  case "$missing" in "!"*) echo "oracle: import failed: ${missing#!}" >&2; exit 1;; esac
  pkg=${PKG[$missing]:-$missing}
  echo "oracle: installing missing module $missing ($pkg)"
  pip_install "$pkg"
done
echo "oracle: could not make vllm.v1.core importable" >&2
exit 1
