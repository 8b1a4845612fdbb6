#!/usr/bin/env bash
# One GPU session of pp4_worker: capture states, gate + time every cell, then re-check the
# digests in a fresh process that loads the states from files.
#
#   OUT=/some/dir bash bench/worker/gated_session.sh [extra pp4_worker arguments]
#
# Writes to $OUT (default ./worker-out): run.log, worker.json, worker.png, reference.json,
# profile.txt, recheck.log, nvidia-smi.txt (run-failed.log if the first attempt failed).  States go to $STATES (default /tmp/pp4-worker-states):
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
  $PY -m pp4_worker --capture-states "$STATES" --write-reference "$OUT/reference.json" \
    --json "$OUT/worker.json" --plot "$OUT/worker.png" --profile "$OUT/profile.txt" "$@" 2>&1 | tee "$OUT/run.log"
}

ARGS=("$@")
run "${ARGS[@]}"
rc=$?
if [ "$rc" -ne 0 ]; then
  # Keep the failed log, then try once with torch's fused attention, one-block-per-row
  # head reductions, no second stream and the input upload before the graph: the
  # configuration closest to the plain-torch baseline, so a run still yields gated numbers.
  mv "$OUT/run.log" "$OUT/run-failed.log"
  echo "=== run failed (rc $rc): retrying with --attention sdpa --head-chunks 1 --no-overlap-noise --upload before-graph ==="
  ARGS=(--attention sdpa --head-chunks 1 --no-overlap-noise --upload before-graph "$@")
  run "${ARGS[@]}"
  rc=$?
fi
if [ "$rc" -eq 0 ]; then
  $PY -m pp4_worker --states "$STATES" --reference "$OUT/reference.json" --gate-only "${ARGS[@]}" 2>&1 \
    | tee "$OUT/recheck.log"
fi
exit "$rc"
