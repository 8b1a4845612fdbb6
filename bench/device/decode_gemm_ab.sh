#!/usr/bin/env bash
# pp4's EXL3 decode path as it is in this tree against other commits' trees, one call on the device:
# one exl3-decode module built cold per distinct set of GEMM sources, side by side; each one's main
# loop counted (bench/worker/exl3_decode_sass.py); this tree's fused steps checked against the steps apart
# (tests/gpu/exl3_fused_check.py); the worker's matrices at each module's own split timed
# (bench/worker/exl3_gemm_sweep.py --splits none, the builds in turn, ROUNDS times); then the whole worker
# of every tree with its module, and fp16 Triton (bench/worker/variants_ab.sh).
#
#   TREES='base=DIR try=DIR ...' bash bench/device/decode_gemm_ab.sh   (device tool: carry .whl and each DIR)
#
# TREES: other commits' whole trees, each made here by
#   mkdir -p .carry/NAME && git archive REV | tar -x -C .carry/NAME
# A tree whose pp4_worker/ext/exl3_decode equals one before it (this tree first) shares that
# tree's module, so a tree that changes only Python costs no build. The sweep's table is against
# the build of the tree named base (else the first other build).
# ORDER: the worker variants in the order they run, this tree's being "new" (default: new, the
#   trees in TREES' order, triton); no variant starts in the call's last 90 s.
# TOTAL: seconds the call may take (570). ROWS: the sweep's row counts (1,8,20). ROUNDS: sweeps
#   per build (1), the fastest kept. FUSED_CHECK=0 skips the fused steps' check. TRITON_ARGS: more
#   worker arguments for the fp16 variant (e.g. "--profile $OUT/triton-profile.txt").
set -u
START=$SECONDS
source "$(dirname "$0")/setup.sh"
device_wheels ninja || exit 1
export PYTHONPATH=/tmp/site:$REPO
names=(new) dirs=("$REPO")
for entry in ${TREES:-}; do
  name=${entry%%=*} dir=$(cd "${entry#*=}" 2>/dev/null && pwd)
  [ -n "$dir" ] && [ -f "$dir/configure.py" ] || { echo "TREES: $entry is not a pp4 tree (no configure.py)"; exit 2; }
  names+=("$name") dirs+=("$dir")
done
# One build per distinct set of GEMM sources: build_of[i] is tree i's build folder; builds[k] is
# built from build_trees[k] and named build_names[k].
build_of=() builds=() build_names=() build_trees=()
# The GEMM's sources: pp4_worker/ext/exl3_decode, or pp4/sources/ext/exl3_decode in a tree of a commit
# before the worker had its own package.
decode_sources() { if [ -d "$1/pp4_worker/ext/exl3_decode" ]; then echo "$1/pp4_worker/ext/exl3_decode";
                   else echo "$1/pp4/sources/ext/exl3_decode"; fi; }
for i in "${!names[@]}"; do
  src=$(decode_sources "${dirs[$i]}")
  for j in $(seq 0 $((i - 1))); do
    if diff -rq "$src" "$(decode_sources "${dirs[$j]}")" > /dev/null; then build_of[$i]=${build_of[$j]}; break; fi
  done
  if [ -z "${build_of[$i]:-}" ]; then
    build_of[$i]=/tmp/ab-${names[$i]}
    builds+=("${build_of[$i]}") build_names+=("${names[$i]}") build_trees+=("${dirs[$i]}")
  fi
  echo "tree ${names[$i]}: ${dirs[$i]}, module ${build_of[$i]}" | tee -a "$OUT/trees.txt"
done
jobs=$(( 16 / ${#builds[@]} )); [ "$jobs" -ge 4 ] || jobs=4
pids=()
for k in "${!builds[@]}"; do
  build_exl3_decode "${builds[$k]}" "${build_trees[$k]}" "$jobs" & pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || exit 1; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
for k in "${!builds[@]}"; do
  python3 "$REPO/bench/worker/exl3_decode_sass.py" "${builds[$k]}/build/exl3-decode/obj/gemm_mul1.cu.o" \
    --cuobjdump "${BENCH_CUDA:-/usr/local/cuda}/bin/cuobjdump" > "$OUT/sass-${build_names[$k]}.txt" 2>&1
done
cd "$REPO"
if [ "${FUSED_CHECK:-1}" != 0 ]; then
  python3 tests/gpu/exl3_fused_check.py --exl3-build "${build_of[0]}/build" --json "$OUT/fused-check.json" \
    > "$OUT/fused-check.txt" 2>&1
  echo "fused check: rc $?, $((SECONDS - START)) s"; tail -1 "$OUT/fused-check.txt"
fi
for round in $(seq 1 "${ROUNDS:-1}"); do
  for k in "${!builds[@]}"; do
    python3 bench/worker/exl3_gemm_sweep.py --exl3-build "${builds[$k]}/build" --splits none --rows "${ROWS:-1,8,20}" \
      --json "$OUT/sweep-${build_names[$k]}-$round.json" > "$OUT/sweep-${build_names[$k]}-$round.txt" 2>&1
    echo "sweep ${build_names[$k]} round $round: rc $?, $((SECONDS - START)) s"
  done
done
python3 - "$OUT" "${build_names[@]}" <<'PYEOF' | tee "$OUT/gemm-ab.txt"
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
ref = "base" if "base" in builds else (builds[1] if len(builds) > 1 else builds[0])
others = [b for b in builds if b != ref]
head = "".join(f"{b + ' us':>10}" for b in others) + f"{ref + ' us':>10}"
head += "".join(f"{ref + '/' + b:>12}" for b in others) + "  % of copy, then max error (" + ", ".join(others + [ref]) + ")"
print(f"matrix  rows pdl {head}")
for (b, name, m, pdl), base in sorted(best.items()):
    if b != ref:
        continue
    row = [best.get((o, name, m, pdl)) for o in others]
    if None in row:
        continue
    line = "".join(f"{r['us']:10.1f}" for r in row) + f"{base['us']:10.1f}"
    line += "".join(f"{base['us'] / r['us']:12.3f}" for r in row)
    line += "  " + ", ".join(f"{100 * r['of_copy']:.0f}%" for r in row + [base])
    line += "  " + ", ".join(f"{r['max_rel_err']:.1e}" for r in row + [base])
    print(f"{name:7s} {m:4d} {'pdl' if pdl else '-':4s}{line}")
PYEOF
variants=() trees=()
for name in ${ORDER:-${names[*]} triton}; do
  if [ "$name" = triton ]; then variants+=("triton:--backend triton ${TRITON_ARGS:-}"); continue; fi
  for i in "${!names[@]}"; do
    [ "${names[$i]}" = "$name" ] || continue
    variants+=("$name:--backend exl3-decode --exl3-build ${build_of[$i]}/build")
    [ "$i" -gt 0 ] && trees+=("$name=${dirs[$i]}")
  done
done
VARIANTS=$(IFS='|'; echo "${variants[*]}") TREES="${trees[*]}" FIRST_FULL=0 \
  OUT=$OUT DEADLINE=$((${TOTAL:-570} - 90 - (SECONDS - START))) bash "$REPO/bench/worker/variants_ab.sh"
cat "$OUT/ab.txt" 2>/dev/null
