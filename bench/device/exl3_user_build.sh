#!/usr/bin/env bash
# The whole build as a user runs it, on the H200 machine in one call: python configure.py && ninja
# (P2P, stock and facc at once, empty store), the GPU import-and-kernel check, the audit, a no-op,
# then a restore of everything into an empty build directory from the warm store.
# Uses the machine's /usr/local/cuda (nvcc 13.0, matching its torch cu130) through --cuda-home.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$REPO"/.whl/ninja-*.whl || exit 1
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1
W=/tmp/w
B="python3 $REPO/bench/build/exl3_build.py --work $W --cuda-home /usr/local/cuda --wheel-dir $REPO/.whl -j 16"
$B --phases pp4-all-cold --json "$OUT/all.json" 2>&1 | tail -3 || exit 1
cd $W/pp4
timeout 90 python3 "$REPO/tests/gpu/exl3_gpu_check.py" build 2>&1 | tee "$OUT/gpu.txt"
cp build/.ninja_log "$OUT/pp4-all-ninja_log.txt"
$B --phases pp4-audit,pp4-noop-all,pp4-restore --json "$OUT/after.json" 2>&1 | tail -6
cp $W/bench.log "$OUT/bench.log"
