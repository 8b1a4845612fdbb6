# Sourced by the bench/h200_*.sh scripts that run on the device machine: REPO (this checkout),
# OUT (what comes back; /tmp/out when unset), unbuffered Python, and device_wheels.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

# device_wheels NAME...: install the carried .whl/NAME-*.whl into /tmp/site, and set NINJA to the
# ninja binary of the ninja wheel among them. PYTHONPATH is the caller's to set (/tmp/site first).
device_wheels() {
  local wheels=() name
  for name in "$@"; do wheels+=("$REPO"/.whl/"$name"-*.whl); done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "${wheels[@]}" || return 1
  # pip --target puts the wheel's binary in /tmp/site/bin and leaves ninja.BIN_DIR empty, which
  # would name whatever ninja is on PATH.
  NINJA=/tmp/site/bin/ninja
  [ -x "$NINJA" ] || NINJA=$(PYTHONPATH=/tmp/site python3 -c 'import ninja,os;print(os.path.join(ninja.BIN_DIR,"ninja"))')
}
