#!/usr/bin/env bash
# pp4's EXL3 decode GEMM on the device, one call: build exl3-decode (5 units) cold, then its kernels
# and K splits side by side on the worker's matrices (bench/worker/exl3_gemm_sweep.py), and the static
# instruction count of each kernel's main loop (bench/worker/exl3_decode_sass.py).
# Usage (device tool, carry .whl): bash bench/device/decode_gemm_splits.sh    (writes into $OUT)
set -u
source "$(dirname "$0")/setup.sh"
device_wheels ninja || exit 1
export PYTHONPATH=/tmp/site:$REPO
build_exl3_decode
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 "$REPO/bench/worker/exl3_decode_sass.py" $W/build/exl3-decode/obj/gemm_mul1.cu.o \
  --cuobjdump "${BENCH_CUDA:-/usr/local/cuda}/bin/cuobjdump" > "$OUT/sass.txt" 2>&1
cd "$REPO"
python3 bench/worker/exl3_gemm_sweep.py --exl3-build $W/build --json "$OUT/sweep.json" ${SWEEP_ARGS:-} > "$OUT/sweep.txt" 2>&1
echo "sweep: rc $?"; tail -30 "$OUT/sweep.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee -a "$OUT/gpu.txt"
