#!/usr/bin/env bash
# A project's first build on the device machine, one call: pp4 (`configure.py --setup-py`, then
# ninja) against the project's own setup.py under BuildExtension, same jobs, same nvcc
# (/usr/local/cuda for both), pp4 first unless FIRST=1; then how well configure's text estimate ranked the units
# (bench/build/estimate_ranking.py on pp4's .ninja_log) and when each build started its longest units.
# Usage (device tool, carry .whl with the ninja wheel and .carry/sdists with the archives
# `python bench/build/projects.py --fetch .carry/sdists` names):
#   PROJECTS="exllamav2" [FIRST=1: setup.py first] [PP4_ONLY=1] bash bench/device/projects_first_build.sh
set -uo pipefail
source "$(dirname "$0")/setup.sh"
device_wheels ninja || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site
only=(); for p in ${PROJECTS:-exllamav2}; do only+=(--only "$p"); done
rm -rf /tmp/pw; mkdir -p /tmp/pw
python3 "$REPO/bench/build/projects.py" --sdists "$REPO/.carry/sdists" --work /tmp/pw -j 16 "${CUDA_HOME_ARGS[@]}" \
  "${only[@]}" ${PP4_ONLY:+--pp4-only} --first "${FIRST:-0}" --out "$OUT/projects.json" > "$OUT/projects.txt" 2>&1
echo "projects.py: rc $?"; tail -5 "$OUT/projects.txt"
for p in ${PROJECTS:-exllamav2}; do
  d=/tmp/pw/$p
  cp "$d/pp4/build/.ninja_log" "$OUT/$p-pp4-ninja_log.txt" 2>/dev/null
  cp "$d/setup-temp/.ninja_log" "$OUT/$p-setup-ninja_log.txt" 2>/dev/null
  cp "$d/pp4-configure.txt" "$OUT/$p-pp4-configure.txt" 2>/dev/null
  python3 "$REPO/bench/build/estimate_ranking.py" --build "$d/pp4/build" 2>&1 | tee -a "$OUT/estimate.txt"
  python3 - "$d" <<'PY' | tee -a "$OUT/starts.txt"
import sys
from pathlib import Path
d = Path(sys.argv[1])
for who, log in (("pp4", d / "pp4/build/.ninja_log"), ("setup.py", d / "setup-temp/.ninja_log")):
    if not log.is_file():
        continue
    rows = [ln.split("\t") for ln in log.read_text().splitlines()[1:]]
    rows = [(int(s), int(e), out) for s, e, _, out, *_ in rows if out.endswith(".o")]
    span = max(e for _, e, _ in rows) - min(s for s, _, _ in rows)
    print(f"{d.name} {who}: {len(rows)} objects, span {span / 1000:.1f} s; longest five (start..end s):")
    for s, e, out in sorted(rows, key=lambda r: r[0] - r[1])[:5]:
        print(f"  {s / 1000:7.1f} .. {e / 1000:7.1f}  {out.rsplit('/', 1)[-1]}")
PY
done
