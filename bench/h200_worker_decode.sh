#!/usr/bin/env bash
# The worker with pp4's decode GEMM on the H200 machine, one call, no checkpoint: build exl3-decode
# (5 units) cold, run the whole worker with --backend exl3-decode (its gate on synthetic EXL3
# weights, under faulthandler: the path that once died with SIGSEGV), then time it against fp16
# Triton side by side (bench/worker_ab.sh). The upstream exl3 column and the checkpoint need the
# 194-unit exl3 module: bench/h200_exl3_decode.sh and bench/h200_exl3_worker.sh.
# Usage (device tool, carry .whl): bash bench/h200_worker_decode.sh    (writes into $OUT)
# VARIANTS: bench/worker_ab.sh's list instead of exl3-decode (--pdl on) and triton; the build is in /tmp/wd/build.
set -u
START=$SECONDS
source "$(dirname "$0")/device_setup.sh"
device_wheels ninja || exit 1
export PYTHONPATH=/tmp/site:$REPO
build_exl3_decode
cd "$REPO"
python3 -X faulthandler -m pp4.worker --backend exl3-decode --exl3-build $W/build --gate-only \
  --json "$OUT/gate.json" > "$OUT/gate.log" 2>&1
echo "gate, exl3-decode, synthetic weights: rc $?" | tee -a "$OUT/gate.log"; tail -5 "$OUT/gate.log"
VARIANTS=${VARIANTS:-"exl3-decode:--backend exl3-decode --exl3-build $W/build --pdl on|triton:--backend triton"} \
  OUT=$OUT DEADLINE=$((500 - (SECONDS - START))) bash "$REPO/bench/worker_ab.sh"
cat "$OUT/ab.txt" 2>/dev/null
