#!/usr/bin/env bash
# The EXL3 decode GEMM on the H200 machine, first call: build upstream's EXL3 module (exl3) and
# pp4's decode GEMM (exl3-decode) with pp4 (the machine's /usr/local/cuda through --cuda-home,
# all 16 cores), pack both for later calls, check the decode and the GEMM against upstream's
# kernels and time them, check its fused steps against the steps apart (tests/gpu/exl3_fused_check.py),
# then make a small EXL3 checkpoint with exllamav3's own conversion and
# upstream's reference outputs on it, and check pp4's GEMM against those.
#
#   OUT=/some/dir [STORE=/tmp/wv/store] [CHECK_SKIP=checkpoint,speed] [PACK=0] bash bench/device/exl3_decode_checks.sh
#
# CHECK_SKIP: the parts of tests/gpu/exl3_decode_check.py's first run to leave out (default checkpoint,
# which runs later); PACK=0: no archives of the build and the checkpoint for later calls (a call that
# goes on to bench/device/exl3_worker_columns.sh on the same machine needs none).
#
# Needs .whl/ with exllamav3 1.6.5, ninja and the packages exllamav3 imports that the machine
# lacks (pydantic, pydantic_core, annotated_types, typing_inspection, typing_extensions, marisa_trie).
set -u
source "$(dirname "$0")/setup.sh"
WORK=${WORK:-/tmp/w}; BUILD=$WORK/build
# STORE: a store an earlier call on this machine filled (bench/device/exl3_cold_vs_old.sh's /tmp/wv/store),
# so that exl3 is restored there instead of compiled again.
STORE=${STORE:-$WORK/store}
device_wheels exllamav3 ninja pydantic pydantic_core annotated_types typing_inspection typing_extensions \
  marisa_trie || exit 1
export PYTHONPATH=/tmp/site:$REPO
cd "$REPO"
if [ -f "$REPO/.carry/build.tar.xz" ] && [ ! -d "$BUILD" ]; then
  mkdir -p "$WORK" && tar -C / -xJf "$REPO/.carry/build.tar.xz" && echo "build unpacked from .carry"
fi
if ! python3 -c "from pp4.certify.loader import load_target; load_target('exl3', '$BUILD'); load_target('exl3-decode', '$BUILD')" 2>/dev/null; then
  mkdir -p "$WORK/bin"; ln -sf "$NINJA" "$WORK/bin/ninja"
  t0=$SECONDS
  (cd "$WORK" && export PATH=$WORK/bin:$PATH PP4_CACHE_DIR=$WORK/cache &&
   python3 "$REPO/configure.py" --arch 9.0 --ext exl3 --ext exl3-decode -j 16 --nice 0 --store "$STORE" \
     "${CUDA_HOME_ARGS[@]}" --wheel-dir "$REPO/.whl" && ninja exl3 exl3-decode) > "$OUT/build.log" 2>&1
  echo "build: rc $?, $((SECONDS - t0)) s" | tee -a "$OUT/build.log"
  tail -3 "$OUT/build.log"
  [ "${PACK:-1}" = 0 ] || (cd / && tar -cJf "$OUT/build.tar.xz" $(cd / && ls -d "${BUILD#/}"/exl3/plan.json "${BUILD#/}"/exl3/*.so* \
     "${BUILD#/}"/exl3-decode/plan.json "${BUILD#/}"/exl3-decode/*.so* 2>/dev/null)) && ls -la "$OUT/build.tar.xz"
fi
python3 tests/gpu/exl3_decode_check.py --exl3-build "$BUILD" --skip "${CHECK_SKIP:-checkpoint}" --json "$OUT/check.json" 2>&1 | tee "$OUT/check.log"
python3 tests/gpu/exl3_fused_check.py --exl3-build "$BUILD" --json "$OUT/fused-check.json" 2>&1 | tee "$OUT/fused-check.log"
if [ ! -f "$WORK/tiny/exl3/config.json" ]; then
  python3 tests/gpu/exl3_checkpoint.py --out "$WORK/tiny" --exl3-build "$BUILD" > "$OUT/checkpoint.log" 2>&1
  echo "checkpoint: rc $?"; tail -40 "$OUT/checkpoint.log"
  python3 tests/gpu/exl3_reference.py --out "$WORK/tiny" --exl3-build "$BUILD" > "$OUT/reference.log" 2>&1
  echo "reference: rc $?"; tail -20 "$OUT/reference.log"
  [ "${PACK:-1}" = 0 ] || (cd / && tar -cJf "$OUT/tiny.tar.xz" "${WORK#/}/tiny/exl3" "${WORK#/}/tiny/reference.safetensors" "${WORK#/}/tiny/reference.json") && ls -la "$OUT/tiny.tar.xz"
fi
python3 tests/gpu/exl3_decode_check.py --exl3-build "$BUILD" --skip decode,gemm,speed \
  --reference "$WORK/tiny/reference.safetensors" --json "$OUT/check-checkpoint.json" 2>&1 | tee "$OUT/check-checkpoint.log"
