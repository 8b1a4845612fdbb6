#!/usr/bin/env bash
# One device session: the setup once (the carried wheels into /tmp/site, ninja, PYTHONPATH: what
# setup.sh's device_wheels does), then each named measurement in turn, each into $OUT/NAME as it
# goes, packed into $OUT/NAME.tar.gz once it ends, in 15 MiB parts where larger (the device tool
# returns at most 8 files of 16 MiB, 2 folders down), with $OUT/session.txt saying what ran, its exit
# status and seconds.
#
#   bash bench/device/session.sh PURPOSE[:ARG,ARG...] ...     (device tool: carry .whl, and .carry where
#                                                             a purpose says so)
#   bash bench/device/session.sh --list                       the purposes and what each measures
#
# A PURPOSE is a script of bench/device by name (exl3_restore_latency, worker_decode_fused, ...), its
# arguments after a colon, comma-separated (exl3_cold_vs_old:1, compile_server_exl3:served), or
# `checks`: `pytest tests/gpu` (the GPU correctness checks; PP4_GPU_BUILD and PP4_GPU_CHECKPOINT name
# their inputs, tests/gpu/gpu_inputs.py). Fetch the wheels here first: bash bench/device/fetch_wheels.sh.
#
# SESSION_DRY=1: no wheels installed, this machine's ninja and Python (a check of the session off
# the device: `SESSION_DRY=1 OUT=/tmp/s bash bench/device/session.sh checks` skips every GPU test).
# SESSION_LIMIT (570): seconds for the whole session; no purpose starts with less than 60 s left,
# and each is given what is left as its own limit (LIMIT, TOTAL, BUDGET, DEADLINE: the names the
# scripts read) unless the caller set that variable.
set -u
START=$SECONDS
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = --list ] || [ $# = 0 ]; then
  echo "usage: bash bench/device/session.sh PURPOSE[:ARG,ARG...] ...   (bench/README.md has the table)"
  echo "  checks                       pytest tests/gpu: the GPU correctness checks"
  for f in "$HERE"/*.sh; do
    n=$(basename "$f" .sh)
    case $n in setup|session|fetch_wheels) continue;; esac
    printf '  %-28s %s\n' "$n" "$(sed -n 2p "$f" | sed 's/^# //' | cut -c1-100)"
  done
  exit 0
fi
for purpose in "$@"; do  # every name checked before the setup spends anything
  name=${purpose%%:*}
  [ "$name" = checks ] || [ -f "$HERE/$name.sh" ] && [ "$name" != setup ] && [ "$name" != session ] \
    || { echo "no purpose $name (bash bench/device/session.sh --list)"; exit 2; }
done
source "$HERE/setup.sh"
SESSION_OUT=$OUT
LIMIT_ALL=${SESSION_LIMIT:-570}

# The setup, once: every wheel carried in .whl (device_wheels' own four among them), one pip call.
setup_once() {
  local t0=$SECONDS
  if [ "${SESSION_DRY:-}" = 1 ]; then  # a dry run off the device: the Python and ninja already here
    NINJA=$(command -v ninja); echo "setup: dry run, ninja $NINJA"; return 0
  fi
  [ -d "$REPO/.whl" ] || { echo "no .whl/ in the checkout: run bash bench/device/fetch_wheels.sh here and carry .whl"; return 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$REPO"/.whl/*.whl || return 1
  NINJA=/tmp/site/bin/ninja
  [ -x "$NINJA" ] || { echo "no ninja wheel in .whl"; return 1; }
  { nproc; nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.sm --format=csv,noheader
    /usr/local/cuda/bin/nvcc --version | tail -1; g++ --version | head -1; uname -r
    python3 -c 'import torch,sys;print("torch", torch.__version__, torch.version.cuda, sys.version.split()[0])'
  } > "$SESSION_OUT/machine.txt" 2>&1
  echo "setup: $((SECONDS - t0)) s"  # the caller writes what this says into session.txt
}

run_purpose() {  # run_purpose NAME ARGS...: into $SESSION_OUT/NAME, with what is left as its limit
  local name=$1; shift
  local left=$((LIMIT_ALL - (SECONDS - START)))
  local dir=$SESSION_OUT/$name
  mkdir -p "$dir"
  if [ "$name" = checks ]; then
    (cd "$REPO" && OUT=$dir python3 -m pytest tests/gpu -rs -p no:cacheprovider --junitxml="$dir/checks.xml" "$@") \
      2>&1 | tee "$dir/checks.txt"
    return "${PIPESTATUS[0]}"
  fi
  local script=$HERE/$name.sh rc
  # Into a file, not through a pipe: a server a script leaves running would hold a pipe open, and
  # the session would wait for it until the device tool's limit.
  (export OUT=$dir LIMIT=${LIMIT:-$left} TOTAL=${TOTAL:-$left} BUDGET=${BUDGET:-$left} DEADLINE=${DEADLINE:-$((left - 90))}
   cd "$REPO" && timeout "$left" bash "$script" "$@") > "$dir/session.log" 2>&1
  rc=$?
  tail -40 "$dir/session.log"
  return $rc
}

# pack NAME: $SESSION_OUT/NAME into NAME.tar.gz, in parts of 15 MiB where it is larger (the device tool
# brings back no file over 16 MiB): `cat NAME.tar.gz.part-* | tar -xz` joins them.
pack() {
  local name=$1 archive=$SESSION_OUT/$1.tar.gz
  tar -czf "$archive" -C "$SESSION_OUT" "$name" || return 1
  rm -rf "${SESSION_OUT:?}/$name"
  if [ "$(stat -c %s "$archive")" -gt $((15 * 1024 * 1024)) ]; then
    split -b 15M -d "$archive" "$archive.part-" && rm -f "$archive"
    echo "$name: packed in $(ls "$archive".part-* | wc -l) parts (cat $name.tar.gz.part-* | tar -xz)" \
      | tee -a "$SESSION_OUT/session.txt"
  fi
}

setup_once 2>&1 | tee -a "$SESSION_OUT/session.txt"; [ "${PIPESTATUS[0]}" = 0 ] || exit 1
NINJA=/tmp/site/bin/ninja; [ "${SESSION_DRY:-}" = 1 ] && NINJA=$(command -v ninja)
export NINJA PP4_DEVICE_READY=1 PYTHONPATH=/tmp/site:$REPO
rc_all=0
for purpose in "$@"; do
  name=${purpose%%:*}; args=()
  [ "$purpose" != "$name" ] && IFS=, read -ra args <<< "${purpose#*:}"
  left=$((LIMIT_ALL - (SECONDS - START)))
  if [ "$left" -lt 60 ]; then
    echo "$purpose: not started, ${left} s left of SESSION_LIMIT=$LIMIT_ALL" | tee -a "$SESSION_OUT/session.txt"
    rc_all=1; continue
  fi
  t0=$SECONDS
  echo "=== $purpose (${left} s left)"
  run_purpose "$name" "${args[@]}"
  rc=$?
  [ "$rc" = 0 ] || rc_all=1
  echo "$purpose: rc $rc, $((SECONDS - t0)) s" | tee -a "$SESSION_OUT/session.txt"
  pack "$name"
done
exit $rc_all
