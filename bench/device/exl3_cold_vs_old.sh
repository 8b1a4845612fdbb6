#!/usr/bin/env bash
# EXL3 stock built cold by this checkout (every compile in the fixed root, observed) and by 001f450
# (carried in .carry/old: plain compiles, the reuse rule before both), each from an empty build
# folder and an empty store, one after the other on one machine; then this checkout's facc variant
# after its stock build (how many objects the store shares) and `ninja certify` of both variants.
# Each step is timed by bench/build/exl3_build.py (its own tree's copy: old steps run old code) into $OUT.
# A cold build takes about 300 s there (moe_mul1.cpp alone 293 s), so each step is its own call on
# the same warm machine: call 1 this checkout's cold build, call 2 its facc build and the audit
# (/tmp/wv keeps the build), call 3 001f450's cold build.
# Uses the machine's /usr/local/cuda (nvcc 13.0) through --cuda-home; carry .whl and .carry.
# Usage (device tool): bash bench/device/exl3_cold_vs_old.sh 1, then at once ... 2, then at once ... 3
set -uo pipefail
source "$(dirname "$0")/setup.sh"
CALL=${1:?call 1, 2 or 3}
START=$SECONDS
device_wheels ninja || exit 1
{ nproc; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  /usr/local/cuda/bin/nvcc --version | tail -1; g++ --version | head -1; uname -r; ldd --version | head -1
  python3 -c 'import torch,sys;print("torch", torch.__version__, torch.version.cuda, sys.version.split()[0])'
  cat /proc/sys/kernel/random/boot_id; } 2>&1 | tee "$OUT/machine-$CALL.txt"
step() {  # step WHO WORK PHASES: exl3_build.py of WHO's tree (new: this checkout, old: .carry/old)
  local src=$REPO; [ "$1" = old ] && src=$REPO/.carry/old
  PYTHONPATH=/tmp/site:$src python3 "$(bench_script "$src" bench/build/exl3_build.py)" --work "$2" "${CUDA_HOME_ARGS[@]}" \
    --wheel-dir "$REPO/.whl" -j 16 --arch 9.0 --deadline $((585 - (SECONDS - START))) --phases "$3" \
    --skip-done --call "$CALL" --json "$OUT/$1-$CALL.json" 2>&1 | tail -12 | tee "$OUT/$1-$CALL.txt"
}
if [ "$CALL" = 1 ]; then
  step new /tmp/wv pp4-cold
elif [ "$CALL" = 3 ]; then
  step old /tmp/wold pp4-cold
else
  [ -d /tmp/wv ] || { echo "no /tmp/wv: call 2 found a fresh machine, run call 1 first" | tee "$OUT/new-2.txt"; exit 1; }
  step new /tmp/wv pp4-facc,pp4-audit
  python3 - <<'PY' 2>&1 | tee "$OUT/events-2.txt"
import collections, glob, json
evs = [json.load(open(f)) for f in glob.glob("/tmp/wv/*/build/.pp4/events/*.json")]
why = collections.Counter((e.get("not_stored") or "stored").split(":")[0][:80] for e in evs)
print("events", len(evs), "not stored, by reason:", dict(why))
PY
fi
tar -czf "$OUT/logs-$CALL.tar.gz" -C /tmp wv/logs wold/logs 2>/dev/null
ls -la "$OUT"
