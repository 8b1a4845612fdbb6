#!/usr/bin/env bash
# The worker's kernel backends side by side on one GPU, in one call: the Triton backend (fused
# small kernels) with the full session of bench/worker_gpu.sh (states, gate, timing, profile,
# re-check), then the torch backend's gate and timing on the same machine.
#
#   OUT=/some/dir bash bench/worker_ab.sh [extra pp4.worker arguments for both]
#
# Writes $OUT/ab.txt (each backend's median per cell and the ratio torch / triton) and
# $OUT/worker-ab.tar.gz: triton/ and torch/ with the files worker_gpu.sh writes (one archive,
# because the device tool returns at most 8 files).  Each run measures its own copy bandwidth,
# so each ratio to the weight-read floor stands on its own as well.
set -u
FINAL=${OUT:-$PWD/worker-out}
OUT=$(mktemp -d /tmp/worker-ab.XXXX)
PY=${PYTHON:-python3}
REPO=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$FINAL" "$OUT/triton" "$OUT/torch"
trap 'cp "$OUT/ab.txt" "$FINAL/" 2>/dev/null; tar -czf "$FINAL/worker-ab.tar.gz" -C "$OUT" .' EXIT
OUT=$OUT/triton STATES=/tmp/pp4-states-triton bash "$REPO/bench/worker_gpu.sh" --backend triton "$@"
rc_triton=$?
$PY -m pp4.worker --capture-states /tmp/pp4-states-torch --json "$OUT/torch/worker.json" --plot "$OUT/torch/worker.png" \
  --backend torch "$@" 2>&1 | tee "$OUT/torch/run.log"
rc_torch=${PIPESTATUS[0]}
$PY - "$OUT" <<'PYEOF' | tee "$OUT/ab.txt"
import json, sys
out = sys.argv[1]
docs = {}
for b in ("triton", "torch"):
    try:
        docs[b] = json.load(open(f"{out}/{b}/worker.json"))
    except (OSError, ValueError) as exc:
        print(f"{b}: no results ({exc})")
if len(docs) == 2:
    cells = {b: {c["cell"]: c for c in d["timing"]["cells"]} for b, d in docs.items()}
    print(f"{'cell':16} {'torch ms':>9} {'triton ms':>9} {'torch/triton':>12} {'ratio torch':>11} {'ratio triton':>12}")
    for name in cells["triton"]:
        t, p = cells["triton"][name], cells["torch"].get(name)
        if p:
            print(f"{name:16} {p['median_ms']:9.3f} {t['median_ms']:9.3f} {p['median_ms'] / t['median_ms']:12.2f} "
                  f"{p['ratio']:11.2f} {t['ratio']:12.2f}")
PYEOF
echo "rc triton $rc_triton, torch $rc_torch"
[ "$rc_triton" -eq 0 ] && [ "$rc_torch" -eq 0 ]
