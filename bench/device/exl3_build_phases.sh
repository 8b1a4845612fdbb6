#!/usr/bin/env bash
# The EXL3 build figures on the H200 machine, one call: pp4 cold build of stock, no-op, facc after
# stock, audit, P2P, the GPU import-and-kernel check, a restore into an empty build directory, and
# a recompile audit if time is left. Uses the machine's own /usr/local/cuda (nvcc 13.0, matching
# its torch cu130) through --cuda-home; the exllamav3 and ninja wheels are carried in .whl/.
# Usage (device tool): bash bench/device/exl3_build_phases.sh    (writes into $OUT)
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$REPO"/.whl/ninja-*.whl || exit 1
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1
{ nproc; nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.sm --format=csv,noheader
  /usr/local/cuda/bin/nvcc --version | tail -2; g++ --version | head -1
  python3 -c 'import torch,sys;print("torch", torch.__version__, torch.version.cuda, sys.version.split()[0])'; } 2>&1 | tee "$OUT/machine.txt"
W=/tmp/w
python3 "$REPO/bench/build/exl3_build.py" --work $W --cuda-home /usr/local/cuda --wheel-dir "$REPO/.whl" -j 16 \
  --phases pp4-cold,pp4-noop,pp4-facc,pp4-audit,pp4-noop-all --json "$OUT/build.json" || { cp $W/bench.log "$OUT/"; exit 1; }
cd $W/pp4
python3 "$REPO/tests/gpu/exl3_gpu_check.py" build 2>&1 | tee "$OUT/gpu.txt"
cp build/.ninja_log "$OUT/pp4-ninja_log.txt"
python3 "$REPO/bench/build/exl3_build.py" --work $W --cuda-home /usr/local/cuda --wheel-dir "$REPO/.whl" -j 16 \
  --phases pp4-restore --json "$OUT/restore.json" 2>&1 | tail -4
cp $W/bench.log "$OUT/bench.log"
left=$(( 560 - ($(date +%s) - start) ))
echo "seconds left for the recompile audit: $left"
if [ $left -gt 120 ]; then
  timeout $((left - 20)) python3 -m pp4.certify.audit build/certificate.json.gz --recompile 3 --objects > "$OUT/audit.txt" 2>&1
  tail -8 "$OUT/audit.txt"
fi
