#!/usr/bin/env bash
# EXL3's two variants on the H200 machine, one call: stock built cold with this checkout (in the
# fixed root, observed; empty store), then the facc variant after it (how many of its objects the
# store shares with stock), then `ninja certify` (the audit of every module, compiling nothing),
# each timed by bench/build/exl3_build.py (phases pp4-cold, pp4-facc, pp4-audit) into $OUT.
# Uses the machine's /usr/local/cuda (nvcc 13.0) through --cuda-home; carry .whl (ninja, exllamav3).
# A cold build and the facc build do not fit one 10-minute call together: run it twice on the same
# (warm) machine; the second call skips what the first measured there (/tmp/wv keeps the state).
# Usage (device tool): bash bench/device/exl3_variants_shared.sh [DEADLINE_S]
set -uo pipefail
source "$(dirname "$0")/setup.sh"
device_wheels ninja || exit 1
export PYTHONPATH=/tmp/site:$REPO
{ nproc; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  /usr/local/cuda/bin/nvcc --version | tail -1; g++ --version | head -1
  python3 -c 'import torch,sys;print("torch", torch.__version__, torch.version.cuda, sys.version.split()[0])'; } 2>&1 \
  | tee "$OUT/machine.txt"
python3 "$REPO/bench/build/exl3_build.py" --work /tmp/wv "${CUDA_HOME_ARGS[@]}" --wheel-dir "$REPO/.whl" -j 16 --arch 9.0 \
  --deadline "${1:-570}" --phases pp4-cold,pp4-facc,pp4-audit --skip-done --json "$OUT/variants.json" 2>&1 | tail -30 | tee "$OUT/variants.txt"
cp /tmp/wv/table.md "$OUT/" 2>/dev/null
tar -czf "$OUT/logs.tar.gz" -C /tmp/wv logs 2>/dev/null
ls -la "$OUT"
