#!/usr/bin/env bash
# The closed world at EXL3 scale on the device machine, one call: EXL3 stock built cold by this
# checkout (in the fixed root, observed, signed, stored), how many of its 194 units were stored and
# why not the others; then a second build folder restoring them (wall and CPU of the whole build);
# then the prepass and the check before ninja decides on the 264-unit bench (bench/build/prepass_observed.py)
# beside the same bench of the tree this session started from (2930cb6, carried in .carry/today).
# Usage (device tool, carry .whl and .carry): bash bench/device/exl3_closed_world.sh [exl3|prepass|both]
# (writes into $OUT; one part fits a call of 10 minutes)
set -uo pipefail
source "$(dirname "$0")/setup.sh"
device_wheels ninja || exit 1
export PYTHONPATH=/tmp/site:$REPO
build() {  # build DIR: configure and `ninja exl3` there against /tmp/cw-store, timed (bench/common/accounting.py)
  mkdir -p "$1" && cd "$1"
  python3 "$REPO/configure.py" --arch 9.0 --ext exl3 "${CUDA_HOME_ARGS[@]}" --wheel-dir "$REPO/.whl" -j 16 --nice 0 \
    --store /tmp/cw-store > configure.log 2>&1 || { tail -5 configure.log; exit 1; }
  $NINJA toolchain > /dev/null 2>&1
  python3 "$REPO/bench/common/accounting.py" "$(basename "$1")" $NINJA -j 16 exl3 > ninja.log 2>> "$OUT/closed-world.txt" \
    || { tail -20 ninja.log | tee -a "$OUT/closed-world.txt"; exit 1; }
  tail -1 "$OUT/closed-world.txt"
  python3 - <<'PY' | tee -a "$OUT/closed-world.txt"
import collections, glob, json
evs = [json.load(open(f)) for f in glob.glob("build/.pp4/events/*.json")]
batch = json.load(open("build/.pp4/prepass-events.json"))["events"].values() if glob.glob("build/.pp4/prepass-events.json") else []
evs += list(batch)
status = collections.Counter(e["status"] for e in evs)
why = collections.Counter((e.get("not_stored") or "stored").split(":")[0][:100] for e in evs if e["status"] == "compiled")
print(f"  events {len(evs)}: {dict(status)}; compiled, by whether stored: {dict(why)}")
PY
}
PART=${1:-both}
if [ "$PART" != prepass ]; then
  build /tmp/cw1
  tar -C /tmp/cw1/build/.pp4 -czf "$OUT/cw1-events.tar.gz" events
  build /tmp/cw2
fi
[ "$PART" = exl3 ] && exit 0
for tree in now today; do
  src=$REPO; [ $tree = today ] && src=$REPO/.carry/today
  mkdir -p /tmp/pp-$tree && cd /tmp/pp-$tree
  PYTHONPATH=/tmp/site:$src python3 "$src/configure.py" --arch 9.0 --ext p2p "${CUDA_HOME_ARGS[@]}" -j 16 \
    --store /tmp/pp-$tree/store > configure.log 2>&1 || { tail -5 configure.log; exit 1; }
  PYTHONPATH=/tmp/site:$src $NINJA p2p > ninja.log 2>&1 || { tail -20 ninja.log; exit 1; }
done
for round in 1 2; do
  for tree in now today; do
    src=$REPO; [ $tree = today ] && src=$REPO/.carry/today
    (cd /tmp/pp-$tree && PYTHONPATH=/tmp/site:$src python3 "$(bench_script "$src" bench/build/prepass_observed.py)" build --units 264 --rounds 3) 2>&1 \
      | tail -2 | sed "s/^/round $round $tree: /" | tee -a "$OUT/closed-world.txt"
  done
done
