#!/usr/bin/env bash
# Try hybridcache against a real vLLM release on this machine, from the source
# tree: a venv with that vLLM (CPU is enough), the wheel built from this tree,
# then the two commands that compare hybridcache with vLLM's own manager.
#
#   bash scripts/try.sh [--dry-run] [VERSION] [VENV]
#     VERSION  a supported vLLM release (default the newest: see --help)
#     VENV     the venv to use (default .venv-vllm-MAJOR.MINOR in the repository
#              root, the one `bash .ci/run` uses too; git ignores it)
#     --dry-run  print the steps and exit (nothing is installed or built)
#     PYTHON   the interpreter the venv is made from (default python3, >= 3.10)
#
# Steps:
#   1. scripts/install_oracle.sh VERSION VENV: vllm==VERSION without its
#      dependency tree, over a torch venv (torch's wheel with its CUDA
#      libraries, about 6 GB, downloaded once; pip's cache serves reruns);
#   2. the wheel built from this tree with maturin (needs cargo) into
#      .cache/try-dist/, installed into VENV, and the development package
#      (dev/, for `hybridcache bench --step`);
#   3. hybridcache --version, hybridcache replay (the default serving trace,
#      every call compared with vLLM's manager) and hybridcache bench --quick
#      (the manager's calls timed beside vLLM's, results verified equal).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
PY=${PYTHON:-python3}

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
versions() { "$PY" -c "import runpy; print(*runpy.run_path('python/hybridcache/releases/table.py')['VERSIONS'])"; }

dry=""
args=()
for a in "$@"; do
  case "$a" in
    --dry-run) dry=1 ;;
    -h|--help) usage; echo "supported vLLM releases: $(versions)"; exit 0 ;;
    -*) echo "try: unknown option $a (see --help)" >&2; exit 2 ;;
    *) args+=("$a") ;;
  esac
done
[ "${#args[@]}" -le 2 ] || { echo "try: at most two arguments, VERSION and VENV (see --help)" >&2; exit 2; }

supported=$(versions)
newest=${supported##* }
VERSION=${args[0]:-$newest}
case " $supported " in
  *" $VERSION "*) ;;
  *) echo "try: vLLM $VERSION is not supported; supported: $supported" >&2; exit 2 ;;
esac
MINOR=$(echo "$VERSION" | cut -d. -f1,2)
VENV=${args[1]:-$repo/.venv-vllm-$MINOR}
case "$VENV" in /*) ;; *) VENV=$PWD/$VENV ;; esac
DIST=$repo/.cache/try-dist

steps=(
  "PYTHON=$PY bash scripts/install_oracle.sh $VERSION $VENV"
  "$VENV/bin/maturin build --release --out $DIST -i $VENV/bin/python"
  "$VENV/bin/python -m pip install --quiet --no-deps --force-reinstall $DIST/vllm_hybridcache-*.whl"
  "put $repo/dev on $VENV's path (hybridcache_dev.pth)"
  "$VENV/bin/hybridcache --version"
  "$VENV/bin/hybridcache replay"
  "$VENV/bin/hybridcache bench --quick"
)
if [ -n "$dry" ]; then
  echo "try: vLLM $VERSION in $VENV"
  printf '  %s\n' "${steps[@]}"
  exit 0
fi

command -v cargo >/dev/null ||
  { echo "try: cargo is not on PATH; install Rust first (https://rustup.rs)" >&2; exit 1; }
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
  { echo "try: $PY is older than Python 3.10 (set PYTHON=)" >&2; exit 1; }

PYTHON="$PY" bash scripts/install_oracle.sh "$VERSION" "$VENV"
rm -rf "$DIST"
"$VENV/bin/maturin" build --release --out "$DIST" -i "$VENV/bin/python"
"$VENV/bin/python" -m pip install --quiet --no-deps --force-reinstall "$DIST"/vllm_hybridcache-*.whl
# The development package (dev/, for bench --step) on the venv's path, as .ci/run puts it.
"$VENV/bin/python" -c 'import site, sys; open(site.getsitepackages()[0] + "/hybridcache_dev.pth", "w").write(sys.argv[1] + "\n")' "$repo/dev"
"$VENV/bin/hybridcache" --version
echo "== hybridcache replay: the default serving trace, every call compared with vLLM $VERSION's manager"
"$VENV/bin/hybridcache" replay
echo "== hybridcache bench --quick: the manager's calls, hybridcache beside vLLM $VERSION's manager"
"$VENV/bin/hybridcache" bench --quick
echo "try: done. The whole scheduler step: $VENV/bin/hybridcache bench --step --quick"
