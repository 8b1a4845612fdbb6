#!/usr/bin/env bash
# What the fixed root and the observer cost EXL3 compiles on the H200 machine, one call: the same
# EXL3 units (every UNIT_STRIDE-th of the 194, by source path) compiled with --no-reuse by pp4 at
# 001f450 (carried in .carry/old: plain compiles, no root, no observer) and by this checkout (in the
# root, observed), alternating the order, side by side. CPU is ninja's whole process tree.
# Usage (device tool, carry .whl and .carry): bash bench/h200_overhead.sh [UNIT_STRIDE]
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STRIDE=${1:-4}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$REPO"/.whl/ninja-*.whl || exit 1
export PYTHONUNBUFFERED=1
NINJA=$(PYTHONPATH=/tmp/site python3 -c 'import ninja,os;print(os.path.join(ninja.BIN_DIR,"ninja"))')
for who in old new; do
  src=$REPO; [ $who = old ] && src=$REPO/.carry/old
  mkdir -p /tmp/ov-$who && cd /tmp/ov-$who
  PYTHONPATH=/tmp/site:$src python3 $src/configure.py --arch 9.0 --ext exl3 --cuda-home /usr/local/cuda \
    --wheel-dir "$REPO/.whl" --no-reuse -j 16 > configure.log 2>&1 || { tail -5 configure.log; exit 1; }
done
cd /tmp/ov-new
python3 - "$STRIDE" > /tmp/units.txt <<'PY'
import json, sys
acts = sorted(json.load(open("build/actions.json"))["actions"], key=lambda a: a["source"])
print(" ".join(a["output"] for a in acts[::int(sys.argv[1])]))
PY
echo "units: $(wc -w < /tmp/units.txt)" | tee "$OUT/overhead.txt"
for who in new old; do
  cd /tmp/ov-$who
  src=$REPO; [ $who = old ] && src=$REPO/.carry/old
  $NINJA toolchain >/dev/null 2>&1; $NINJA build/.pp4/prepass.stamp >/dev/null 2>&1
  /usr/bin/time -f "$who: %e s wall, %U+%S CPU-s" env PYTHONPATH=/tmp/site:$src $NINJA -j 16 $(cat /tmp/units.txt) \
    > ninja.log 2>> "$OUT/overhead.txt" || { tail -20 ninja.log; }
  tail -1 "$OUT/overhead.txt"
done
cd /tmp/ov-new && python3 - <<'PY' | tee -a "$OUT/overhead.txt"
import glob, json
evs = [json.load(open(f)) for f in glob.glob("build/.pp4/events/*.json")]
print("new: events", len(evs), "not observed:", sum(1 for e in evs if (e.get("not_stored") or "").startswith("it was not observed")))
PY
