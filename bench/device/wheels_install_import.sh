#!/usr/bin/env bash
# `ninja wheel` on the H200 machine, run right after bench/device/exl3_remote_restore.sh on the same warm machine
# (it builds on checkout 2, /tmp/w2, where EXL3 stock is built): build EXL3 facc and P2P, make the
# three wheels, install them with pip into a fresh venv that sees the machine's torch but not pp4,
# and import all three into one process and call kernels there (tests/gpu/exl3_gpu_check.py --installed).
# Measured 2026-12-04: docs/results/wheels-2026-12-04/h200/.
# Usage (device tool): bash bench/device/wheels_install_import.sh    (writes into $OUT)
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f /tmp/w2/pp4/build.ninja ] || { echo "no /tmp/w2/pp4/build.ninja: run bench/device/exl3_remote_restore.sh first on this machine"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$REPO"/.whl/ninja-*.whl "$REPO"/.whl/redis-*.whl || exit 1
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1 PP4_CACHE_DIR=/tmp/w2/cache
NINJA=$(python3 -c 'import ninja,os;print(os.path.join(ninja.BIN_DIR,"ninja"))')
cd /tmp/w2/pp4
t0=$(date +%s.%N)
$NINJA exl3-facc p2p 2>&1 | tail -3
t1=$(date +%s.%N)
$NINJA wheel 2>&1 | grep -E "^wheel|error" | tee "$OUT/wheels.txt"
t2=$(date +%s.%N)
python3 -c "print(f'facc and p2p built in {$t1 - $t0:.1f} s; ninja wheel (3 wheels) in {$t2 - $t1:.1f} s')" | tee -a "$OUT/wheels.txt"
ls -l dist | tee -a "$OUT/wheels.txt"
# A fresh venv that sees torch's folder (on that machine a venv of its own, /opt/torch/.venv) and
# nothing of pp4: pip then finds the torch the wheels require, and pp4 cannot be imported.
python3 -m venv /tmp/clean || exit 1
TORCH_SITE=$(cd /tmp && env -u PYTHONPATH python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
echo "$TORCH_SITE" > "$(/tmp/clean/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch-site.pth"
cd /tmp
env -u PYTHONPATH /tmp/clean/bin/python -m pip install --no-index /tmp/w2/pp4/dist/*.whl 2>&1 | tail -1 | tee -a "$OUT/wheels.txt"
env -u PYTHONPATH /tmp/clean/bin/python -c 'import pp4' 2>&1 | tail -1 | tee -a "$OUT/wheels.txt"
env -u PYTHONPATH /tmp/clean/bin/python -c 'import time; t=time.perf_counter(); import exllamav3_ext, exllamav3_ext_facc, pp4_p2p; print(f"import of the three checked modules (torch included): {time.perf_counter()-t:.2f} s")' 2>&1 | tee -a "$OUT/wheels.txt"
env -u PYTHONPATH /tmp/clean/bin/python "$REPO/tests/gpu/exl3_gpu_check.py" --installed 2>&1 | tee "$OUT/gpu-installed.txt"
env -u PYTHONPATH /tmp/clean/bin/python -m pip check 2>&1 | grep -iE "exllamav3|pp4|torch|No broken" | tee -a "$OUT/wheels.txt"
