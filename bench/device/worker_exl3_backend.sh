#!/usr/bin/env bash
# The worker's EXL3 backend on the H200 machine, in one device call: build the stock EXL3 module
# (MODULE=stock, the default, or facc) with pp4 (cold, the machine's /usr/local/cuda through
# --cuda-home, the exllamav3 and ninja wheels carried in .whl/), then bench/worker/variants_ab.sh with the exl3 backend as
# the first variant (full session: states, gate, timing, profile, re-check) and the other variants
# after it, each gated and timed in its own process on the same machine.
#
#   OUT=/some/dir [MODULE=stock|facc] [VARIANTS=...] [LIMIT=seconds] bash bench/device/worker_exl3_backend.sh [extra pp4_worker arguments]
#
# A module already built in $WORK (a warm machine's earlier call) is reused. LIMIT (default 570)
# bounds the whole script: no worker variant starts past it minus 90 s.
set -u
START=$SECONDS
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$PWD/worker-out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/w}
LIMIT=${LIMIT:-570}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$REPO"/.whl/ninja-*.whl || exit 1
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1
MODULE=${MODULE:-stock}  # or facc: which pp4-built EXL3 module is built and run
TARGET=$([ "$MODULE" = facc ] && echo exl3-facc || echo exl3)
BUILD=$WORK/build
if python3 -c "from pp4.certify.loader import load_target; load_target('$TARGET', '$BUILD')" 2>/dev/null; then
  echo "$TARGET already built in $BUILD"
else
  # Cold: empty build directory and store; the machine's nvcc through --cuda-home, all 16 cores.
  rm -rf "$BUILD" "$WORK/store"; mkdir -p "$WORK/bin"; ln -sf "$(python3 -c "import ninja; print(ninja.BIN_DIR)")/ninja" "$WORK/bin/ninja"
  t0=$SECONDS
  (cd "$WORK" && export PATH=$WORK/bin:$PATH PP4_CACHE_DIR=$WORK/cache MAX_JOBS=16 TORCH_CUDA_ARCH_LIST=9.0 &&
   python3 "$REPO/configure.py" --arch 9.0 --ext "$TARGET" -j 16 --nice 0 --store "$WORK/store" \
     --cuda-home /usr/local/cuda --wheel-dir "$REPO/.whl" && ninja "$TARGET") > "$OUT/build.log" 2>&1
  echo "build of $TARGET: rc $?, $((SECONDS - t0)) s (configure + ninja $TARGET, -j 16)" | tee -a "$OUT/build.log"
fi
VARIANTS=${VARIANTS:-"exl3:--backend exl3 --exl3-module $MODULE --exl3-build $BUILD|triton:--backend triton"}
OUT=$OUT VARIANTS=$VARIANTS DEADLINE=$((LIMIT - 90 - (SECONDS - START))) bash "$REPO/bench/worker/variants_ab.sh" "$@"
