#!/usr/bin/env bash
# The reuse prepass on the 264-unit bench on the H200 machine, one call: this checkout's prepass with
# P2P's real observation sets (bench/build/prepass_observed.py, on a P2P build made here first) against
# the rule before observation at 001f450 (carried in .carry/old) on its own bench
# (bench/build/prepass_scale.py), alternating, twice each, side by side.
# Usage (device tool, carry .whl and .carry): bash bench/device/prepass_264_units.sh    (writes into $OUT)
set -uo pipefail
source "$(dirname "$0")/setup.sh"
device_wheels ninja || exit 1
mkdir -p /tmp/pp && cd /tmp/pp
PYTHONPATH=/tmp/site:$REPO python3 "$REPO/configure.py" --arch 9.0 --ext p2p "${CUDA_HOME_ARGS[@]}" -j 16 \
  --store /tmp/pp/store > configure.log 2>&1 || { tail -5 configure.log; exit 1; }
PYTHONPATH=/tmp/site:$REPO $NINJA p2p > ninja.log 2>&1 || { tail -20 ninja.log; exit 1; }
# 001f450's bench provisions the pinned nvcc for its compile section, and this machine has no
# package index: there it takes the same toolkit as the build above (only paths; nothing compiles).
if [ "${#CUDA_HOME_ARGS[@]}" -gt 0 ]; then
  sed -i "s|tc = provision(lock_for_cuda(torch_cuda_version())).toolchain|from pp4.toolchain.provision import override; tc = override(Path('${CUDA_HOME_ARGS[1]}'))|" \
    "$REPO/.carry/old/bench/checkouts.py"
  grep -q "tc = override" "$REPO/.carry/old/bench/checkouts.py" || { echo "cannot point 001f450's bench at ${CUDA_HOME_ARGS[1]}"; exit 1; }
fi
for round in 1 2; do
  echo "round $round" | tee -a "$OUT/prepass.txt"
  (cd /tmp/pp && PYTHONPATH=/tmp/site:$REPO python3 "$REPO/bench/build/prepass_observed.py" build --units 264 --rounds 3) 2>&1 \
    | tail -3 | sed 's/^/now: /' | tee -a "$OUT/prepass.txt"
  (cd /tmp && PYTHONPATH=/tmp/site:$REPO/.carry/old python3 "$REPO/.carry/old/bench/prepass_scale.py" --units 264 --rounds 3) 2>&1 \
    | tail -3 | sed 's/^/001f450: /' | tee -a "$OUT/prepass.txt"
done
