#!/usr/bin/env bash
# The EXL3 worker on the H200 machine, second call (after bench/device/exl3_decode_checks.sh): the worker's
# two EXL3 paths on the real checkpoint against exllamav3's forward, their gates on it, then the
# three columns timed side by side at the default geometry in one run: pp4's decode GEMM
# (--backend exl3-decode), upstream's EXL3 kernels (--backend exl3), fp16 Triton (--backend triton).
#
#   OUT=/some/dir bash bench/device/exl3_worker_columns.sh
#
# Reads what the first call returned, copied into .carry/: build.tar.xz (both modules, unpacked
# at /tmp/w/build where they were built) and tiny.tar.xz (the checkpoint and reference outputs).
set -u
START=$SECONDS
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$PWD/worker-out}; mkdir -p "$OUT"
WORK=/tmp/w; BUILD=$WORK/build; TINY=$WORK/tiny
LIMIT=${LIMIT:-570}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$REPO"/.whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1
cd "$REPO"
[ -d "$BUILD" ] || tar -C / -xJf "$REPO/.carry/build.tar.xz" || exit 1
[ -d "$TINY" ] || tar -C / -xJf "$REPO/.carry/tiny.tar.xz" || exit 1
python3 tests/gpu/exl3_worker_exactness.py --checkpoint "$TINY/exl3" --reference "$TINY/reference.safetensors" \
  --exl3-build "$BUILD" --json "$OUT/exactness.json" 2>&1 | tee "$OUT/exactness.log"
for backend in exl3-decode exl3; do
  python3 -m pp4_worker --backend "$backend" --exl3-build "$BUILD" --weights "$TINY/exl3" --gate-only \
    --context 256 --json "$OUT/gate-$backend.json" > "$OUT/gate-$backend.log" 2>&1
  echo "gate on the checkpoint, $backend: rc $?"; tail -4 "$OUT/gate-$backend.log"
done
VARIANTS="exl3-decode:--backend exl3-decode --exl3-build $BUILD --pdl on|exl3:--backend exl3 --exl3-build $BUILD|triton:--backend triton" \
  OUT=$OUT DEADLINE=$((LIMIT - 90 - (SECONDS - START))) bash "$REPO/bench/worker/variants_ab.sh" "$@"
