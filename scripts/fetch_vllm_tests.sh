#!/usr/bin/env bash
# Fetches vLLM VERSION's own tests (tests/v1/core, the files the peer suite
# runs and what they import) from its sdist on PyPI, through pip only, into
# CACHE/VERSION (default .cache/vllm-tests/VERSION), e.g.
#
#   .cache/vllm-tests/VERSION/tests/v1/core/{__init__.py,utils.py,test_prefix_caching.py}
#
# Any file of the sdist can be listed, at its path there (a release's
# test_prompt_block_hash_vectors.py reads rust/src/engine-core-client/src/
# tests/prompt_block_hash_vectors.json relative to the tests folder).
#
# The files and their hashes, and the sdist's hash, are in
# scripts/vllm_tests/vllm-VERSION.sha256; every file is checked against it.
#
# How: `pip download --no-binary :all:` fetches the sdist (hash-pinned) but then
# must build its metadata, which fails for vLLM without its build toolchain.
# `--no-build-isolation` makes that failure immediate (no build env with torch
# to install) and `--no-clean` keeps pip's unpacked copy of the sdist, which is
# where the files are taken from. Should the metadata step succeed instead (a
# machine with vLLM's build deps), the tarball lands in the download folder and
# is read from there. Nothing else is fetched; no conftest of vLLM's is needed
# (scripts/run_vllm_peer_tests.py supplies the markers and the offline model
# config the tests ask for).
#
# Usage: bash scripts/fetch_vllm_tests.sh [VERSION] [CACHE]
#   (VERSION default the release table's first; idempotent)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSION=${1:-$("$PY" -c "import runpy; print(runpy.run_path('python/hybridcache/releases/table.py')['VERSIONS'][0])")}
CACHE_ROOT=${2:-.cache/vllm-tests}
CACHE=$CACHE_ROOT/$VERSION
MANIFEST=$PWD/scripts/vllm_tests/vllm-$VERSION.sha256
[ -f "$MANIFEST" ] || { echo "no test manifest for vLLM $VERSION ($MANIFEST)" >&2; exit 1; }
SDIST_SHA256=$(sed -n "s/^# sdist vllm-$VERSION.tar.gz sha256 \([0-9a-f]\{64\}\)$/\1/p" "$MANIFEST")
[ -n "$SDIST_SHA256" ] || { echo "$MANIFEST names no sdist hash" >&2; exit 1; }
mapfile -t FILES < <(grep -v '^#' "$MANIFEST" | awk 'NF == 2 { print $2 }')

have_tests() { [ -d "$CACHE" ] && (cd "$CACHE" && sha256sum -c --quiet --strict "$MANIFEST" >/dev/null 2>&1); }
if have_tests; then
  echo "vLLM $VERSION tests already in $CACHE"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/tmp" "$work/dl"
echo "vllm==$VERSION --hash=sha256:$SDIST_SHA256" >"$work/req.txt"

echo "pip download vllm==$VERSION (sdist; its metadata step is expected to fail)"
set +e
TMPDIR="$work/tmp" "$PY" -m pip download --disable-pip-version-check --no-deps \
  --no-binary :all: --no-build-isolation --no-clean --require-hashes \
  -r "$work/req.txt" -d "$work/dl" >"$work/pip.log" 2>&1
pip_rc=$?
set -e

src=""
tarball="$work/dl/vllm-$VERSION.tar.gz"
if [ -f "$tarball" ]; then
  mkdir -p "$work/x"
  tar -xzf "$tarball" -C "$work/x" "${FILES[@]/#/vllm-$VERSION/}"
  src="$work/x/vllm-$VERSION"
else
  # The sdist pip unpacked (kept by --no-clean): pip-download-*/vllm_*/ or pip-req-build-*/.
  for d in "$work"/tmp/pip-*/vllm_* "$work"/tmp/pip-req-build-*; do
    if [ -f "$d/PKG-INFO" ] && grep -qx "Version: $VERSION" "$d/PKG-INFO" &&
       grep -qx "Name: vllm" "$d/PKG-INFO"; then
      src="$d"; break
    fi
  done
fi
if [ -z "$src" ]; then
  echo "could not obtain the vLLM $VERSION sdist (pip exit $pip_rc); pip said:" >&2
  tail -n 30 "$work/pip.log" >&2
  exit 1
fi

rm -rf "$CACHE"
for f in "${FILES[@]}"; do
  [ -f "$src/$f" ] || { echo "sdist lacks $f" >&2; exit 1; }
  mkdir -p "$CACHE/$(dirname "$f")"
  cp "$src/$f" "$CACHE/$f"
done
(cd "$CACHE" && sha256sum -c --quiet --strict "$MANIFEST") ||
  { echo "the files in $CACHE do not match vLLM $VERSION's ($MANIFEST)" >&2; exit 1; }
echo "vLLM $VERSION tests in $CACHE: ${#FILES[@]} files"
