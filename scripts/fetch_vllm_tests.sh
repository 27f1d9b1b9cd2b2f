#!/usr/bin/env bash
# Fetches vLLM 0.23.0's own prefix-caching tests (tests/v1/core) from its sdist
# on PyPI, through pip only, into a cache folder (default .cache/vllm-tests):
#
#   .cache/vllm-tests/tests/{__init__.py,v1/__init__.py}
#   .cache/vllm-tests/tests/v1/core/{__init__.py,utils.py,test_prefix_caching.py}
#
# How: `pip download --no-binary :all:` fetches the sdist (hash-pinned) but then
# must build its metadata, which fails for vLLM without its build toolchain.
# `--no-build-isolation` makes that failure immediate (no build env with torch
# to install) and `--no-clean` keeps pip's unpacked copy of the sdist, which is
# where the files are taken from. Should the metadata step succeed instead (a
# machine with vLLM's build deps), the tarball lands in the download folder and
# is read from there. Nothing else is fetched; test_prefix_caching.py needs no
# conftest of vLLM's (scripts/run_vllm_peer_tests.py supplies the fixtures).
#
# Usage: bash scripts/fetch_vllm_tests.sh [CACHE_DIR]    (idempotent)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSION=0.23.0
SDIST_SHA256=760269db3d9611e12e524681df1bca0977d5d2f5fcb4481cc34d33efc4ae7ff5
TEST_SHA256=f313b45805a2bd329bed9f02d8cee99b9bcdb50b59fcb04b88da80bb0877d90f
CACHE=${1:-.cache/vllm-tests}
FILES=(tests/__init__.py tests/v1/__init__.py tests/v1/core/__init__.py
       tests/v1/core/utils.py tests/v1/core/test_prefix_caching.py)

have_tests() {
  [ -f "$CACHE/VERSION" ] && [ "$(cat "$CACHE/VERSION")" = "$VERSION" ] &&
    echo "$TEST_SHA256  $CACHE/tests/v1/core/test_prefix_caching.py" | sha256sum -c --quiet - 2>/dev/null
}
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

rm -rf "$CACHE/tests"
for f in "${FILES[@]}"; do
  [ -f "$src/$f" ] || { echo "sdist lacks $f" >&2; exit 1; }
  mkdir -p "$CACHE/$(dirname "$f")"
  cp "$src/$f" "$CACHE/$f"
done
echo "$TEST_SHA256  $CACHE/tests/v1/core/test_prefix_caching.py" | sha256sum -c --quiet - ||
  { echo "test_prefix_caching.py does not match vLLM $VERSION's" >&2; exit 1; }
echo "$VERSION" >"$CACHE/VERSION"
echo "vLLM $VERSION tests in $CACHE: ${FILES[*]}"
