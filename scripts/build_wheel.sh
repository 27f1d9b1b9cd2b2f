#!/usr/bin/env bash
# Builds the release wheel (one abi3 wheel) into OUT (default: dist),
# tagged manylinux_2_28 and profile-guided.
#
# manylinux_2_28, as vLLM's own wheels are (serving images on RHEL 8 / UBI 8
# have glibc 2.28): maturin links with zig (`--zig`, PyPI's ziglang) against
# glibc 2.28's symbols, whatever glibc the build machine has, and checks the
# result against the manylinux_2_28 policy; scripts/check_wheel.sh then reads
# the tag back with auditwheel. The tools (scripts/build-tools.txt) live in
# their own venv, BUILD_VENV (default .venv-build), which
# scripts/install_build_tools.sh makes or reuses.
#
# Profile-guided: an instrumented build runs scripts/pgo_train.py, then the
# wheel is built with that profile, so the hot paths are laid out for a
# serving loop (about 40 % fewer instruction-cache misses per call, measured
# with benchmarks/step_callgrind.py). As pydantic-core builds its release wheels. Both builds are
# maturin's zig builds, so cargo sees the same settings and gives every crate
# the same metadata hash, hence the same symbol names, by which LLVM matches
# the profile to the code (a plain host build gets other hashes, and its
# profile would match nothing). Only the instrumented one links with the
# host's cc (a later `-C linker` in RUSTFLAGS wins): zig's cc does not take
# the `-u __llvm_profile_runtime` that rustc passes when it links an
# instrumented library ("unrecognized file extension"). That wheel is only
# imported by the training run here, so its tag is not checked. The script
# checks that each build's rustc got its profile flag and that the crates'
# hashes agree (cargo's verbose logs).
#
# Needs llvm-profdata matching rustc's LLVM (`rustup component add
# llvm-tools`, tried here); without it, or with HYBRIDCACHE_PGO=0, the wheel
# is built without a profile (same code, same results, slower).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
OUT=${1:-dist}
PY=${PYTHON:-python3}
BUILD_VENV=${BUILD_VENV:-$repo/.venv-build}
mkdir -p "$OUT"

PYTHON="$PY" bash scripts/install_build_tools.sh "$BUILD_VENV"
# maturin runs zig as `python3 -m ziglang`: the build venv's python first.
export PATH="$BUILD_VENV/bin:$PATH"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

host=$(rustc -vV | sed -n 's/^host: //p')
ZIG=(--zig --compatibility manylinux_2_28)  # links for glibc 2.28

# build DIR RUSTFLAGS MATURIN_ARGS...: the release wheel into DIR; cargo's
# verbose log in DIR.log, its tail shown on failure.
build() {
    local dir=$1 log=$1.log flags=$2
    shift 2
    if ! RUSTFLAGS=$flags CARGO_TERM_VERBOSE=true maturin build --release --out "$dir" \
            --interpreter "$PY" "$@" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "build_wheel: maturin build failed (log above)" >&2
        return 1
    fi
    grep -E '^warning|Warning:|Built wheel' "$log" | sort -u || true
}

# rustc_line LOG CRATE: cargo's command line for CRATE's rustc in LOG.
rustc_line() { grep -E "Running \`.*rustc --crate-name $2 " "$1" | tail -n 1; }
# The metadata hash cargo gave CRATE in LOG (it decides the symbol names).
crate_hash() { rustc_line "$1" "$2" | grep -oE -- '-C metadata=[0-9a-f]+' || true; }
# needs_flag LOG FLAG: the binding's (crate _native) rustc got FLAG.
needs_flag() {
    rustc_line "$1" _native | grep -qF -- "$2" ||
        { echo "build_wheel: the binding's rustc did not get $2 ($1)" >&2; exit 1; }
}

finish() {  # finish DIR: the one wheel in DIR, checked, into OUT
    local wheel
    wheel=$(ls "$1"/*.whl)
    AUDITWHEEL="$BUILD_VENV/bin/auditwheel" bash scripts/check_wheel.sh "$wheel"
    mv "$wheel" "$OUT/"
    echo "build_wheel: $OUT/$(basename "$wheel")"
}

plain_build() {
    build "$work/plain" "" "${ZIG[@]}"
    finish "$work/plain"
}

find_profdata() {
    local sysroot tool
    sysroot=$(rustc --print sysroot)
    tool="$sysroot/lib/rustlib/$host/bin/llvm-profdata"
    if [ ! -x "$tool" ] && command -v rustup >/dev/null; then
        rustup component add llvm-tools >/dev/null 2>&1 || true
    fi
    [ -x "$tool" ] && echo "$tool"
}

if [ "${HYBRIDCACHE_PGO:-1}" = "0" ]; then
    plain_build
    exit 0
fi
profdata_tool=$(find_profdata || true)
if [ -z "$profdata_tool" ]; then
    echo "build_wheel: llvm-profdata not found; building without a profile" >&2
    plain_build
    exit 0
fi

# Its own target folder: the instrumented objects never mix with the final ones.
export CARGO_TARGET_DIR="$repo/target-pgo"

echo "== pgo: instrumented build (zig's settings, the host's linker)"
build "$work/instrumented" "-Cprofile-generate=$work/raw -Clinker=${CC:-cc}" "${ZIG[@]}" --auditwheel skip
needs_flag "$work/instrumented.log" "-Cprofile-generate=$work/raw"
"$PY" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --no-deps "$work"/instrumented/*.whl

echo "== pgo: training run"
# From the work folder, so the instrumented wheel is imported, not ./python.
(cd "$work" && "$work/venv/bin/python" "$repo/scripts/pgo_train.py")
if ! "$profdata_tool" merge -o "$work/merged.profdata" "$work/raw"; then
    echo "build_wheel: llvm-profdata could not merge the profile; building without one" >&2
    plain_build
    exit 0
fi

echo "== pgo: optimized build (zig, glibc 2.28)"
build "$work/optimized" "-Cprofile-use=$work/merged.profdata" "${ZIG[@]}"
needs_flag "$work/optimized.log" "-Cprofile-use=$work/merged.profdata"
for crate in _native hybridcache_core; do
    a=$(crate_hash "$work/instrumented.log" "$crate") b=$(crate_hash "$work/optimized.log" "$crate")
    if [ -z "$a" ] || [ "$a" != "$b" ]; then
        echo "build_wheel: $crate: '$a' instrumented, '$b' optimized: the profile's symbols would not match" >&2
        exit 1
    fi
done
finish "$work/optimized"
