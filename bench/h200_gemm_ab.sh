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
# TRY: optionally a third folder of the same form (a candidate beside this tree), built, counted,
#   swept and run as 'try' after the other two.
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
# A tree per source set: this checkout with that set's GEMM sources (configure reads the tree it runs from).
source_tree() {  # source_tree SOURCES DEST
  rm -rf "$2" && mkdir -p "$2"
  tar -C "$REPO" --exclude=./.whl --exclude=./.carry --exclude=./.git -cf - . | tar -C "$2" -xf -
  rm -rf "$2/pp4/sources/ext/exl3_decode"
  cp -r "$1/pp4/sources/ext/exl3_decode" "$2/pp4/sources/ext/"
}
source_tree "$BASE" /tmp/base-tree
BUILDS="wd wb"
JOBS=8
if [ -n "${TRY:-}" ]; then
  [ -d "$TRY/pp4/sources/ext/exl3_decode" ] || { echo "no $TRY/pp4/sources/ext/exl3_decode"; exit 2; }
  source_tree "$TRY" /tmp/try-tree
  BUILDS="wd wb wt"
  JOBS=6
fi
pids=()
build_exl3_decode /tmp/wd "$REPO" $JOBS & pids+=($!)
build_exl3_decode /tmp/wb /tmp/base-tree $JOBS & pids+=($!)
[ -n "${TRY:-}" ] && { build_exl3_decode /tmp/wt /tmp/try-tree $JOBS & pids+=($!); }
for pid in "${pids[@]}"; do wait "$pid" || exit 1; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
for b in $BUILDS; do
  python3 "$REPO/bench/exl3_decode_sass.py" /tmp/$b/build/exl3-decode/obj/gemm_mul1.cu.o \
    --cuobjdump "${BENCH_CUDA:-/usr/local/cuda}/bin/cuobjdump" > "$OUT/sass-$b.txt" 2>&1
done
cd "$REPO"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for b in $BUILDS; do
    python3 bench/exl3_gemm_sweep.py --exl3-build /tmp/$b/build --splits none --rows "${ROWS:-1,8,20}" \
      --json "$OUT/sweep-$b-$round.json" > "$OUT/sweep-$b-$round.txt" 2>&1
    echo "sweep $b round $round: rc $?, $((SECONDS - START)) s"
  done
done
python3 - "$OUT" $BUILDS <<'PYEOF' | tee "$OUT/gemm-ab.txt"
import glob, json, sys
out, builds = sys.argv[1], sys.argv[2:]
best = {}  # (build, matrix, rows, pdl) -> the fastest of the rounds
for b in builds:
    for path in glob.glob(f"{out}/sweep-{b}-*.json"):
        try:
            rows = json.load(open(path))["results"]
        except (OSError, ValueError):
            continue
        for row in rows:
            key = (b, row["linear"], row["rows"], row["pdl"])
            if key not in best or row["us"] < best[key]["us"]:
                best[key] = row
others = [b for b in builds if b != "wb"]
names = {"wd": "new", "wt": "try"}
head = "".join(f"{names[b] + ' us':>9}" for b in others) + f"{'base us':>9}"
head += "".join(f"{'base/' + names[b]:>10}" for b in others) + "  % of copy, then max error (" + ", ".join(names[b] for b in others) + ", base)"
print(f"matrix  rows pdl {head}")
for (b, name, m, pdl), base in sorted(best.items()):
    if b != "wb":
        continue
    row = [best.get((o, name, m, pdl)) for o in others]
    if None in row:
        continue
    line = "".join(f"{r['us']:9.1f}" for r in row) + f"{base['us']:9.1f}"
    line += "".join(f"{base['us'] / r['us']:10.3f}" for r in row)
    line += "  " + ", ".join(f"{100 * r['of_copy']:.0f}%" for r in row + [base])
    line += "  " + ", ".join(f"{r['max_rel_err']:.1e}" for r in row + [base])
    print(f"{name:7s} {m:4d} {'pdl' if pdl else '-':4s}{line}")
PYEOF
DEFAULT_VARIANTS="new:--backend exl3-decode --exl3-build /tmp/wd/build|base:--backend exl3-decode --exl3-build /tmp/wb/build"
[ -n "${TRY:-}" ] && DEFAULT_VARIANTS+="|try:--backend exl3-decode --exl3-build /tmp/wt/build"
VARIANTS=${VARIANTS:-"$DEFAULT_VARIANTS|triton:--backend triton"} \
  OUT=$OUT DEADLINE=$((${TOTAL:-570} - 90 - (SECONDS - START))) bash "$REPO/bench/worker_ab.sh"
cat "$OUT/ab.txt" 2>/dev/null
