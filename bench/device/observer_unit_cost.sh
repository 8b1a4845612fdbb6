#!/usr/bin/env bash
# Named EXL3 units compiled on the device machine plainly and as pp4 compiles them (in the fixed
# root, under pp4-observe), alternating, one compile at a time (bench/build/observe_overhead.py): the
# observer's cost on a compile with the machine otherwise idle, and the kernel's speculation
# mitigations (a seccomp filter can turn some on for the whole compile).
# Usage (device tool, carry .whl): bash bench/device/observer_unit_cost.sh UNIT,UNIT [ROUNDS]
set -uo pipefail
source "$(dirname "$0")/setup.sh"
device_wheels ninja || exit 1
{ uname -r; grep -r . /sys/devices/system/cpu/vulnerabilities/; cat /proc/cmdline; } 2>&1 | tee "$OUT/machine.txt"
mkdir -p /tmp/ou && cd /tmp/ou
PYTHONPATH=/tmp/site:$REPO python3 "$REPO/configure.py" --arch 9.0 --ext exl3 "${CUDA_HOME_ARGS[@]}" \
  --wheel-dir "$REPO/.whl" --no-reuse -j 16 > configure.log 2>&1 || { tail -5 configure.log; exit 1; }
$NINJA toolchain >/dev/null 2>&1
PYTHONPATH=/tmp/site:$REPO python3 "$REPO/bench/build/observe_overhead.py" build --match "$1" --rounds "${2:-1}" \
  --ways plain,observed --json "$OUT/units.json" 2>&1 | tee "$OUT/units.txt"
