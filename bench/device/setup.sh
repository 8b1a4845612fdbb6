# Sourced by the bench/device/*.sh scripts that run on the device machine (bench/device/session.sh once): REPO (this checkout),
# OUT (what comes back; /tmp/out when unset), unbuffered Python, and device_wheels.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

# device_wheels NAME...: install the carried .whl/NAME-*.whl, and pp4's own dependencies the image
# lacks (cryptography, cffi, pycparser, zstandard: bench/device/fetch_wheels.sh fetches them), into /tmp/site, and set
# NINJA to the ninja binary of the ninja wheel among them. PYTHONPATH is the caller's to set
# (/tmp/site first).
device_wheels() {
  # bench/device/session.sh installed every carried wheel once: nothing to do.
  if [ "${PP4_DEVICE_READY:-}" = 1 ] && [ -x "${NINJA:-}" ]; then return 0; fi
  local wheels=() name
  for name in "$@" cryptography cffi pycparser zstandard; do wheels+=("$REPO"/.whl/"$name"-*.whl); done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "${wheels[@]}" || return 1
  # pip --target puts the wheel's binary in /tmp/site/bin and leaves ninja.BIN_DIR empty, which
  # would name whatever ninja is on PATH.
  NINJA=/tmp/site/bin/ninja
  [ -x "$NINJA" ] || NINJA=$(PYTHONPATH=/tmp/site python3 -c 'import ninja,os;print(os.path.join(ninja.BIN_DIR,"ninja"))')
}

# The toolkit the bench scripts compile with: the device machine's own /usr/local/cuda (nvcc 13.0,
# matching its torch) unless BENCH_CUDA names another folder; BENCH_CUDA=pinned uses pp4's pinned
# wheels (a dry run of a script on a machine without /usr/local/cuda).
CUDA_HOME_ARGS=(--cuda-home "${BENCH_CUDA:-/usr/local/cuda}")
[ "${BENCH_CUDA:-}" = pinned ] && CUDA_HOME_ARGS=()

# build_exl3_decode [DIR [TREE [JOBS]]]: configure and build exl3-decode (5 units) in DIR (/tmp/wd;
# W is set to it) from the pp4 checkout TREE (this one), on JOBS jobs (16), with the toolkit above;
# the log in DIR/build.log and $OUT/build-NAME.log. The caller has run device_wheels ninja.
build_exl3_decode() {
  W=${1:-/tmp/wd}; local tree=${2:-$REPO} jobs=${3:-16} log="$OUT/build-$(basename "${1:-/tmp/wd}").log"
  mkdir -p "$W"
  local t0=$SECONDS
  (cd "$W" && PYTHONPATH=/tmp/site:$tree python3 "$tree/configure.py" --arch 9.0 --ext exl3-decode -j "$jobs" --nice 0 \
     --store "$W/store" "${CUDA_HOME_ARGS[@]}" && "$NINJA" exl3-decode) > "$log" 2>&1
  local rc=$?
  echo "build $W: rc $rc, $((SECONDS - t0)) s" | tee -a "$log"
  return $rc
}

# bench_script TREE PATH: PATH (e.g. bench/build/exl3_build.py) in the pp4 tree TREE, or where a tree
# made before bench/ was split by purpose (issue 56) kept it: bench/NAME.
bench_script() {
  if [ -f "$1/$2" ]; then echo "$1/$2"; else echo "$1/bench/$(basename "$2")"; fi
}
