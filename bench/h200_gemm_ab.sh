#!/usr/bin/env bash
# pp4's decode GEMM as it is in this tree against a baseline of its sources, one call on the device:
# both exl3-decode modules built cold side by side (8 jobs each), each kernel's main loop counted
# (bench/exl3_decode_sass.py), the worker's matrices at the module's own split timed new, base,
# new, base, ... (bench/exl3_gemm_sweep.py --splits none), then the whole worker with each module and
# fp16 Triton (bench/worker_ab.sh).
#
#   BASE=DIR bash bench/h200_gemm_ab.sh        (device tool: carry .whl and DIR; writes into $OUT)
#
# BASE: a folder with the baseline's pp4/sources/ext/exl3_decode files, e.g. made here by
#   mkdir -p .carry/base && git archive HEAD pp4/sources/ext/exl3_decode | tar -x -C .carry/base
# TOTAL: seconds the call may take (570): no worker variant starts in its last 90 (FIRST_FULL=0
#   passes on to worker_ab.sh). ROWS: the sweep's row counts (1,8,20). ROUNDS: how many times each
#   build is swept (2), the fastest kept. VARIANTS: worker_ab.sh's list instead of the three.
set -u
START=$SECONDS
source "$(dirname "$0")/device_setup.sh"
BASE=${BASE:?BASE names the baseline sources (see the header)}
[ -d "$BASE/pp4/sources/ext/exl3_decode" ] || { echo "no $BASE/pp4/sources/ext/exl3_decode"; exit 2; }
device_wheels ninja || exit 1
export PYTHONPATH=/tmp/site:$REPO
# The baseline tree: this checkout with the baseline's GEMM sources (configure reads the tree it runs from).
rm -rf /tmp/base-tree && mkdir -p /tmp/base-tree
tar -C "$REPO" --exclude=./.whl --exclude=./.carry --exclude=./.git -cf - . | tar -C /tmp/base-tree -xf -
rm -rf /tmp/base-tree/pp4/sources/ext/exl3_decode
cp -r "$BASE/pp4/sources/ext/exl3_decode" /tmp/base-tree/pp4/sources/ext/
build_exl3_decode /tmp/wd "$REPO" 8 & new_pid=$!
build_exl3_decode /tmp/wb /tmp/base-tree 8 & base_pid=$!
wait $new_pid || exit 1
wait $base_pid || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
for b in wd wb; do
  python3 "$REPO/bench/exl3_decode_sass.py" /tmp/$b/build/exl3-decode/obj/gemm_mul1.cu.o \
    --cuobjdump "${BENCH_CUDA:-/usr/local/cuda}/bin/cuobjdump" > "$OUT/sass-$b.txt" 2>&1
done
cd "$REPO"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for b in wd wb; do
    python3 bench/exl3_gemm_sweep.py --exl3-build /tmp/$b/build --splits none --rows "${ROWS:-1,8,20}" \
      --json "$OUT/sweep-$b-$round.json" > "$OUT/sweep-$b-$round.txt" 2>&1
    echo "sweep $b round $round: rc $?, $((SECONDS - START)) s"
  done
done
python3 - "$OUT" <<'PYEOF' | tee "$OUT/gemm-ab.txt"
import glob, json, sys
out = sys.argv[1]
best = {}  # (build, matrix, rows, pdl) -> the fastest of the rounds
for b in ("wd", "wb"):
    for path in glob.glob(f"{out}/sweep-{b}-*.json"):
        try:
            rows = json.load(open(path))["results"]
        except (OSError, ValueError):
            continue
        for row in rows:
            key = (b, row["linear"], row["rows"], row["pdl"])
            if key not in best or row["us"] < best[key]["us"]:
                best[key] = row
print("matrix  rows pdl    new us  base us  base/new  new % of copy  base % of copy")
for (b, name, m, pdl), row in sorted(best.items()):
    base = best.get(("wb", name, m, pdl))
    if b == "wd" and base:
        print(f"{name:7s} {m:4d} {'pdl' if pdl else '-':4s} {row['us']:8.1f} {base['us']:8.1f} {base['us'] / row['us']:9.3f}"
              f" {100 * row['of_copy']:13.0f}% {100 * base['of_copy']:14.0f}%")
PYEOF
VARIANTS=${VARIANTS:-"new:--backend exl3-decode --exl3-build /tmp/wd/build|base:--backend exl3-decode --exl3-build /tmp/wb/build|triton:--backend triton"} \
  OUT=$OUT DEADLINE=$((${TOTAL:-570} - 90 - (SECONDS - START))) bash "$REPO/bench/worker_ab.sh"
cat "$OUT/ab.txt" 2>/dev/null
