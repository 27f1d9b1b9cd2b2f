#!/usr/bin/env bash
# Checks the release wheel's platform tag: the file is tagged manylinux_2_28
# (as vLLM's own wheels), and auditwheel (scripts/build-tools.txt) finds its
# native module consistent with that tag or an older one: no glibc symbol
# newer than 2.28, no library outside the manylinux policy. Prints
# auditwheel's report.
#
#   bash scripts/check_wheel.sh WHEEL   (AUDITWHEEL=path; default: the build
#                                        venv's, .venv-build/bin/auditwheel)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
TAG=manylinux_2_28
wheel=${1:?usage: check_wheel.sh WHEEL}
aw=${AUDITWHEEL:-$repo/.venv-build/bin/auditwheel}
arch=$(uname -m)
case "$(basename "$wheel")" in
  *-"${TAG}_$arch".whl) ;;
  *) echo "check_wheel: $(basename "$wheel") is not tagged ${TAG}_$arch" >&2; exit 1 ;;
esac
report=$("$aw" show "$wheel")
echo "$report"
# auditwheel wraps its lines; the tag is the quoted word after this phrase.
found=$(echo "$report" | tr '\n' ' ' | sed -n 's/.*consistent with the following platform tag: "\([^"]*\)".*/\1/p')
if [[ $found =~ ^manylinux_2_([0-9]+)_${arch}$ ]] && (( BASH_REMATCH[1] <= 28 )); then
  echo "check_wheel: $(basename "$wheel"): tagged ${TAG}_$arch, auditwheel: consistent with $found"
else
  echo "check_wheel: auditwheel finds $(basename "$wheel") consistent with '${found:-no manylinux tag}', not ${TAG}_$arch" >&2
  exit 1
fi
