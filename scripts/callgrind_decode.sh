#!/usr/bin/env bash
# Deterministic decode cost: callgrind instruction counts of the core-only
# decode loop (rust/core/examples/decode_profile.rs), per decode
# allocate_slots call, as the difference of two runs (S1 and S2 steps) so
# setup and the prompt allocations cancel out.
# Usage: scripts/callgrind_decode.sh [binary] [running] [S1] [S2]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-}
if [ -z "$bin" ]; then
  cargo build --release -q -p hybridcache-core --example decode_profile
  bin=target/release/examples/decode_profile
fi
running=${2:-128}; s1=${3:-100}; s2=${4:-500}
ir() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$@" 2>&1 \
    | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
for cfg in full swa mamba; do
  for drafts in wide small; do
    a=$(ir "$cfg" "$running" "$s1" "$drafts")
    b=$(ir "$cfg" "$running" "$s2" "$drafts")
    echo "$cfg $drafts: $(( (b - a) / (running * (s2 - s1)) )) instructions per decode call"
  done
done
