#!/usr/bin/env bash
# The worker's EXL3 backend on the H200 machine, in one device call: build the stock EXL3 module
# with pp4 (exl3_build.py's pp4-cold phase: the machine's /usr/local/cuda through --cuda-home, the
# exllamav3 and ninja wheels carried in .whl/), then bench/worker_ab.sh with the exl3 backend as
# the first variant (full session: states, gate, timing, profile, re-check) and the other variants
# after it, each gated and timed in its own process on the same machine.
#
#   OUT=/some/dir [VARIANTS=...] [LIMIT=seconds] bash bench/worker_exl3.sh [extra pp4.worker arguments]
#
# A module already built in $WORK (a warm machine's earlier call) is reused. LIMIT (default 570)
# bounds the whole script: no worker variant starts past it minus 90 s.
set -u
START=$SECONDS
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$PWD/worker-out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/w}
LIMIT=${LIMIT:-570}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$REPO"/.whl/ninja-*.whl || exit 1
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1
BUILD=$WORK/pp4/build
if python3 -c "from pp4.loader import load_target; load_target('exl3', '$BUILD')" 2>/dev/null; then
  echo "stock EXL3 module already built in $BUILD"
else
  python3 "$REPO/bench/exl3_build.py" --work "$WORK" --cuda-home /usr/local/cuda --wheel-dir "$REPO/.whl" -j 16 \
    --phases pp4-cold --json "$OUT/build.json" 2>&1 | tail -5 || true
fi
VARIANTS=${VARIANTS:-"exl3:--backend exl3 --exl3-build $BUILD|triton:--backend triton"}
OUT=$OUT VARIANTS=$VARIANTS DEADLINE=$((LIMIT - 90 - (SECONDS - START))) bash "$REPO/bench/worker_ab.sh" "$@"
