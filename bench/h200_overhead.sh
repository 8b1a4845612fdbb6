#!/usr/bin/env bash
# What the fixed root and the observer cost EXL3 compiles on the H200 machine, one call: the same
# EXL3 units (every UNIT_STRIDE-th of the 194, by source path) compiled with --no-reuse by pp4 at
# 001f450 (carried in .carry/old: plain compiles, no root, no observer) and by this checkout (in the
# root, observed), alternating the order, side by side. CPU is ninja's whole process tree. Then the
# launch alone (bench/observe_overhead.py --units 0), before the builds.
# Usage (device tool, carry .whl and .carry): bash bench/h200_overhead.sh [UNIT_STRIDE]
set -uo pipefail
source "$(dirname "$0")/device_setup.sh"
STRIDE=${1:-4}
device_wheels ninja || exit 1
for who in old new; do
  src=$REPO; [ $who = old ] && src=$REPO/.carry/old
  mkdir -p /tmp/ov-$who && cd /tmp/ov-$who
  PYTHONPATH=/tmp/site:$src python3 $src/configure.py --arch 9.0 --ext exl3 "${CUDA_HOME_ARGS[@]}" \
    --wheel-dir "$REPO/.whl" --no-reuse -j 16 > configure.log 2>&1 || { tail -5 configure.log; exit 1; }
done
cd /tmp/ov-new
python3 - "$STRIDE" > /tmp/units.txt <<'PY'
import json, sys
acts = sorted(json.load(open("build/actions.json"))["actions"], key=lambda a: a["source"])
print(" ".join(a["output"] for a in acts[::int(sys.argv[1])]))
PY
echo "units: $(wc -w < /tmp/units.txt)" | tee "$OUT/overhead.txt"
# The launch alone: /bin/true started plainly, in the root, and in the root observed (median of 50),
# first: it comes back even when the call is cut short.
(cd /tmp/ov-new && PYTHONPATH=/tmp/site:$REPO python3 "$REPO/bench/observe_overhead.py" build --units 0 2>&1 | tee -a "$OUT/overhead.txt")
for who in new old; do
  cd /tmp/ov-$who
  src=$REPO; [ $who = old ] && src=$REPO/.carry/old
  $NINJA toolchain >/dev/null 2>&1; $NINJA build/.pp4/prepass.stamp >/dev/null 2>&1
  /usr/bin/time -f "$who: %e s wall, %U+%S CPU-s" env PYTHONPATH=/tmp/site:$src $NINJA -j 16 $(cat /tmp/units.txt) \
    > ninja.log 2>> "$OUT/overhead.txt" || { tail -20 ninja.log; }
  tail -1 "$OUT/overhead.txt"
done
cd /tmp/ov-new && python3 - <<'PY' | tee -a "$OUT/overhead.txt"
import collections, glob, json
evs = [json.load(open(f)) for f in glob.glob("build/.pp4/events/*.json")]
why = collections.Counter((e.get("not_stored") or "stored").split(":")[0][:80] for e in evs)
print("new: events", len(evs), "not stored, by reason:", dict(why))
PY
