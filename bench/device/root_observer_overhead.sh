#!/usr/bin/env bash
# What the fixed root and the observer cost EXL3 compiles on the device machine, one call: the same
# EXL3 units (every UNIT_STRIDE-th of the 194, by source path) compiled with --no-reuse several ways,
# each in its own build folder, in ABBA order (A B B A ...) so that a drift of the machine falls on
# both, side by side. CPU is the whole build's, its compile server's included. Then the launch alone
# (bench/build/observe_overhead.py --units 0), before the builds. The ways (WAYS, two of them):
#   new     this checkout as it builds (in the fixed root, observed)
#   noroot  this checkout with PP4_NO_ROOT=1 for configure and ninja (observed, no root): the root's
#           own cost is new against noroot
#   old     pp4 at 001f450, carried in .carry/old (plain compiles, no root, no observer)
# Usage (device tool, carry .whl, and .carry for old):
#   WAYS="new noroot" ROUNDS=2 bash bench/device/root_observer_overhead.sh [UNIT_STRIDE]
set -uo pipefail
source "$(dirname "$0")/setup.sh"
STRIDE=${1:-4}
read -r -a ways <<< "${WAYS:-new old}"
ROUNDS=${ROUNDS:-1}
device_wheels ninja || exit 1
src_of() { if [ "$1" = old ]; then echo "$REPO/.carry/old"; else echo "$REPO"; fi; }
env_of() { if [ "$1" = noroot ]; then echo PP4_NO_ROOT=1; fi; }  # the environment a way adds
for who in "${ways[@]}"; do
  src=$(src_of $who)
  mkdir -p /tmp/ov-$who && cd /tmp/ov-$who
  env $(env_of $who) PYTHONPATH=/tmp/site:$src python3 $src/configure.py --arch 9.0 --ext exl3 "${CUDA_HOME_ARGS[@]}" \
    --wheel-dir "$REPO/.whl" --no-reuse -j 16 > configure.log 2>&1 || { tail -5 configure.log; exit 1; }
done
cd /tmp/ov-${ways[0]}
python3 - "$STRIDE" > /tmp/units.txt <<'PY'
import json, sys
acts = sorted(json.load(open("build/actions.json"))["actions"], key=lambda a: a["source"])
print(" ".join(a["output"] for a in acts[::int(sys.argv[1])]))
PY
echo "units: $(wc -w < /tmp/units.txt); ways ${ways[*]}; $ROUNDS round(s), ABBA" | tee "$OUT/overhead.txt"
# The launch alone: /bin/true started plainly, in the root, and in the root observed (median of 50),
# first: it comes back even when the call is cut short.
(cd /tmp/ov-${ways[0]} && PYTHONPATH=/tmp/site:$REPO python3 "$REPO/bench/build/observe_overhead.py" build --units 0 2>&1 | tee -a "$OUT/overhead.txt")
for ((r = 0; r < ROUNDS; r++)); do
  order=("${ways[@]}"); ((r % 2)) && order=("${ways[1]}" "${ways[0]}")
  for who in "${order[@]}"; do
    cd /tmp/ov-$who
    src=$(src_of $who)
    $NINJA toolchain >/dev/null 2>&1; $NINJA build/.pp4/prepass.stamp >/dev/null 2>&1
    rm -f $(cat /tmp/units.txt)
    # CPU of the whole build, the compile server's included (it outlives ninja: bench/common/accounting.py).
    env $(env_of $who) PYTHONPATH=/tmp/site:$src python3 "$REPO/bench/common/accounting.py" "round $r $who" \
      $NINJA -j 16 $(cat /tmp/units.txt) > ninja-$r.log 2>> "$OUT/overhead.txt" || { tail -n 20 ninja-$r.log; }
    tail -1 "$OUT/overhead.txt"
  done
done
python3 - "$OUT/overhead.txt" <<'PY' | tee -a "$OUT/overhead.txt"
import collections, re, sys
cpu, wall = collections.defaultdict(float), collections.defaultdict(float)
for line in open(sys.argv[1]):
    m = re.match(r"round \d+ (\w+): ([\d.]+) s wall, ([\d.]+)\+([\d.]+) CPU-s", line)
    if m:
        cpu[m[1]] += float(m[3]) + float(m[4]); wall[m[1]] += float(m[2])
ways = list(cpu)
for w in ways:
    print(f"{w}: {wall[w]:.1f} s wall, {cpu[w]:.1f} CPU-s in all")
if len(ways) == 2:
    a, b = ways
    print(f"{a} against {b}: {cpu[a] / cpu[b]:.3f}x CPU, {wall[a] / wall[b]:.3f}x wall")
PY
for who in "${ways[@]}"; do
  [ $who = old ] && continue
  cd /tmp/ov-$who && python3 - $who <<'PY' | tee -a "$OUT/overhead.txt"
import collections, glob, json, sys
evs = [json.load(open(f)) for f in glob.glob("build/.pp4/events/*.json")]
why = collections.Counter((e.get("not_stored") or "stored").split(":")[0][:80] for e in evs)
rooted = sum(1 for e in evs if e.get("mounts"))
print(f"{sys.argv[1]}: events", len(evs), f"({rooted} in the fixed root)", "not stored, by reason:", dict(why))
PY
done
