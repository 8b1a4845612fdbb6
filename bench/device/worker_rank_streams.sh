#!/usr/bin/env bash
# The worker with each rank's steps on a stream of its own (--rank-streams on, the default) against
# the ranks one after the other (off), for pp4's EXL3 decode GEMM and for fp16 Triton, one call on the device: one
# exl3-decode module built cold, then four variants in turn (bench/worker/variants_ab.sh), each with its
# own gate. The summary (ab.txt) gives each cell's time, the ratios, and which variants' gate
# digests agree: streams change where kernels run, not what they compute, so on and off must agree.
#
#   bash bench/device/worker_rank_streams.sh   (device tool: carry .whl)
#
# TOTAL: seconds the call may take (570); no variant starts in its last 90 s. TRITON_ARGS: more
# arguments for the fp16 variant without streams (e.g. "--profile $OUT/triton-profile.txt").
set -u
START=$SECONDS
source "$(dirname "$0")/setup.sh"
device_wheels ninja || exit 1
export PYTHONPATH=/tmp/site:$REPO
build_exl3_decode /tmp/ab-new "$REPO" 16 || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
decode="--backend exl3-decode --exl3-build /tmp/ab-new/build"
VARIANTS="streams:$decode --rank-streams on|serial:$decode --rank-streams off|triton:--backend triton --rank-streams off ${TRITON_ARGS:-}|triton-streams:--backend triton --rank-streams on" \
  FIRST_FULL=0 OUT=$OUT DEADLINE=$((${TOTAL:-570} - 90 - (SECONDS - START))) bash "$REPO/bench/worker/variants_ab.sh"
