#!/usr/bin/env bash
# Kernel variants of the worker side by side on one GPU, in one call.  The first variant gets
# the full session of bench/worker/gated_session.sh (states, gate, timing, profile, re-check in a fresh
# process); every other variant its own states, gate and timing, on the same machine.
#
#   OUT=/some/dir [VARIANTS='name:args|name:args'] [DEADLINE=seconds] bash bench/worker/variants_ab.sh [extra pp4_worker arguments for all]
#
# FIRST_FULL=0: the first variant runs like the others (no profile, no re-check): a shorter call.
# TREES='name=DIR ...': the variant of that name runs the worker of the pp4 tree in DIR (another
# commit's Python), every other variant this checkout's.
# DEADLINE: no variant starts later than this many seconds after the script began (each
# takes 40-90 s on the H200 machine): list the variants in the order they matter.
# Default VARIANTS: 'triton:--backend triton|torch:--backend torch'.
# Writes $OUT/ab.txt (each variant's median per cell, the ratio of each to the first, each one's
# ratio to the weight-read floor, and which variants' gate digests agree in every cell) and $OUT/worker-ab.tar.gz: one folder per variant with the
# files gated_session.sh writes (one archive, because the device tool returns at most 8 files).
# Each run measures its own copy bandwidth, so each ratio to the floor stands on its own as well.
set -u
START=$SECONDS
DEADLINE=${DEADLINE:-}
FINAL=${OUT:-$PWD/worker-out}
OUT=$(mktemp -d /tmp/worker-ab.XXXX)
PY=${PYTHON:-python3}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
VARIANTS=${VARIANTS:-"triton:--backend triton|torch:--backend torch"}
mkdir -p "$FINAL"
trap 'cp "$OUT/ab.txt" "$FINAL/" 2>/dev/null; tar -czf "$FINAL/worker-ab.tar.gz" -C "$OUT" .' EXIT
IFS='|' read -ra LIST <<< "$VARIANTS"
names=()
rc_all=0
for i in "${!LIST[@]}"; do
  name=${LIST[$i]%%:*}
  if [ -n "$DEADLINE" ] && [ $((SECONDS - START)) -ge "$DEADLINE" ]; then
    echo "=== variant $name: not started, $((SECONDS - START)) s gone of DEADLINE=$DEADLINE" | tee -a "$OUT/rc.txt"
    continue
  fi
  read -ra vargs <<< "${LIST[$i]#*:}"
  names+=("$name")
  mkdir -p "$OUT/$name"
  echo "=== variant $name: ${vargs[*]} $*"
  if [ "$i" -eq 0 ] && [ "${FIRST_FULL:-1}" != 0 ]; then
    OUT=$OUT/$name STATES=/tmp/pp4-states-$name bash "$REPO/bench/worker/gated_session.sh" "${vargs[@]}" "$@"
    rc=$?
  else
    tree=$REPO
    for entry in ${TREES:-}; do [ "${entry%%=*}" = "$name" ] && tree=${entry#*=}; done
    # pp4.worker, not pp4_worker: a tree of a commit before the worker had its own package has
    # only the old name, and every later tree forwards it (pp4/worker/__main__.py).
    (cd "$tree" && PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" $PY -m pp4.worker --capture-states "/tmp/pp4-states-$name" \
      --json "$OUT/$name/worker.json" --plot "$OUT/$name/worker.png" "${vargs[@]}" "$@") 2>&1 | tee "$OUT/$name/run.log"
    rc=${PIPESTATUS[0]}
  fi
  echo "variant $name: rc $rc" | tee -a "$OUT/rc.txt"
  [ "$rc" -eq 0 ] || rc_all=1
done
$PY - "$OUT" "${names[@]}" <<'PYEOF' | tee "$OUT/ab.txt"
import json, sys
out, names = sys.argv[1], sys.argv[2:]
cells, digests = {}, {}
for n in names:
    try:
        doc = json.load(open(f"{out}/{n}/worker.json"))
        cells[n] = {c["cell"]: c for c in doc["timing"]["cells"]}
    except (OSError, ValueError, KeyError) as exc:
        print(f"{n}: no results ({exc})")
        continue
    if "digests" in doc.get("gate", {}):
        digests[n] = doc["gate"]["digests"]
have = [n for n in names if n in cells]
if have:
    first = have[0]
    head = [f"{n} ms" for n in have] + [f"{n}/{first}" for n in have[1:]] + [f"ratio {n}" for n in have]
    print(f"{'cell':16} " + " ".join(f"{h:>16}" for h in head))
    for cell, c0 in cells[first].items():
        row = [cells[n].get(cell) for n in have]
        if None in row:
            continue
        vals = [f"{r['median_ms']:.3f}" for r in row] + [f"{r['median_ms'] / c0['median_ms']:.3f}" for r in row[1:]]
        vals += [f"{r['ratio']:.2f}" for r in row]
        print(f"{cell:16} " + " ".join(f"{v:>16}" for v in vals))
# Variants whose gate digests are the same in every cell computed the same bits (one group per line).
groups = {}
for n, d in digests.items():
    groups.setdefault(json.dumps(d, sort_keys=True), []).append((n, len(d)))
for members in groups.values():
    print(f"same gate digests in all {members[0][1]} cells: " + ", ".join(n for n, _ in members))
PYEOF
exit "$rc_all"
