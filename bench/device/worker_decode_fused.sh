#!/usr/bin/env bash
# The worker with pp4's decode GEMM on the GPU machine, one call, no checkpoint: build exl3-decode
# (5 units) cold, check its fused steps against the steps run apart (tests/gpu/exl3_fused_check.py),
# then time the whole worker side by side (bench/worker/variants_ab.sh; the first variant's session also
# runs the gate, a profile and a re-check in a fresh process): exl3-decode as it runs by default
# (fused steps, --pdl on), exl3-decode with every step its own kernel (--exl3-fuse off), and fp16
# Triton. The upstream exl3 column and the checkpoint need the 194-unit exl3 module:
# bench/device/exl3_decode_checks.sh and bench/device/exl3_worker_columns.sh.
# Usage (device tool, carry .whl): bash bench/device/worker_decode_fused.sh    (writes into $OUT)
# VARIANTS: bench/worker/variants_ab.sh's list instead of those three; the build is in /tmp/wd/build.
set -u
START=$SECONDS
source "$(dirname "$0")/setup.sh"
device_wheels ninja || exit 1
export PYTHONPATH=/tmp/site:$REPO
build_exl3_decode || exit 1
cd "$REPO"
python3 -X faulthandler tests/gpu/exl3_fused_check.py --exl3-build $W/build --json "$OUT/fused-check.json" \
  2>&1 | tee "$OUT/fused-check.log"
VARIANTS=${VARIANTS:-"exl3-decode:--backend exl3-decode --exl3-build $W/build|unfused:--backend exl3-decode --exl3-build $W/build --exl3-fuse off|triton:--backend triton"} \
  OUT=$OUT DEADLINE=$((560 - (SECONDS - START))) bash "$REPO/bench/worker/variants_ab.sh"
cat "$OUT/ab.txt" 2>/dev/null
