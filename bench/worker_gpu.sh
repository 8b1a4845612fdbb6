#!/usr/bin/env bash
# One GPU session of pp4.worker: capture states, gate + time every cell, then re-check the
# digests in a fresh process that loads the states from files.
#
#   OUT=/some/dir bash bench/worker_gpu.sh [extra pp4.worker arguments]
#
# Writes to $OUT (default ./worker-out): run.log, worker.json, worker.png, reference.json,
# profile.txt, recheck.log, nvidia-smi.txt.  States go to $STATES (default /tmp/pp4-worker-states):
# they are tens of MB and are never committed.
set -u
OUT=${OUT:-$PWD/worker-out}
STATES=${STATES:-/tmp/pp4-worker-states}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
set -o pipefail

nvidia-smi --query-gpu=name,uuid,driver_version,power.limit,power.default_limit,clocks.sm,clocks.max.sm \
  --format=csv > "$OUT/nvidia-smi.txt" 2>&1 || true
$PY -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'

run() {  # run NAME ARGS...: full gate + timing
  $PY -m pp4.worker --capture-states "$STATES" --write-reference "$OUT/reference.json" \
    --json "$OUT/worker.json" --plot "$OUT/worker.png" --profile "$OUT/profile.txt" "$@" 2>&1 | tee "$OUT/run.log"
}

run "$@"
rc=$?
if [ "$rc" -eq 1 ]; then
  # Gate failed: keep its log, and try once without the second (noise) stream, the one
  # place where graph capture and eager execution are structured differently.
  mv "$OUT/run.log" "$OUT/run-gate-failed.log"
  echo "=== gate failed (rc 1): retrying with --no-overlap-noise ==="
  run --no-overlap-noise "$@"
  rc=$?
fi
if [ "$rc" -eq 0 ]; then
  $PY -m pp4.worker --states "$STATES" --reference "$OUT/reference.json" --gate-only "$@" 2>&1 \
    | tee "$OUT/recheck.log"
fi
exit "$rc"
