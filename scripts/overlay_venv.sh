#!/usr/bin/env bash
# Makes OVERLAY, a small venv that sees every package of BASE (a venv) behind
# its own: a .pth file adds BASE's site-packages after the overlay's. What is
# installed into the overlay (`OVERLAY/bin/python -m pip install ...`, pip
# coming from BASE) shadows BASE's copy and leaves BASE as it was. How a
# build other than the release wheel is tested against an oracle venv.
#
#   bash scripts/overlay_venv.sh BASE OVERLAY
set -euo pipefail
BASE=${1:?usage: overlay_venv.sh BASE OVERLAY}
OVERLAY=${2:?usage: overlay_venv.sh BASE OVERLAY}
purelib() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
base_site=$(purelib "$BASE")
"$BASE/bin/python" -m venv --without-pip "$OVERLAY"
echo "import site; site.addsitedir($("$BASE/bin/python" -c 'import sys; print(repr(sys.argv[1]))' "$base_site"))" \
  >"$(purelib "$OVERLAY")/_overlay_base.pth"
