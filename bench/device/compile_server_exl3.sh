#!/usr/bin/env bash
# The compile server at EXL3 scale on the device machine: EXL3 stock built cold with 16 jobs, its
# compiles handed to the ninja run's compile server (WAY=served) or each edge running itself
# (WAY=direct, PP4_NO_SERVER=1), each in its own folder with its own store; bench/build/exl3_build.py
# times it (whole-build CPU, the server's included: bench/common/accounting.py), a sampler counts the
# compiles seen running under a server's worker, and every object's sha256 goes to $OUT, to be
# compared between the two calls (the fixed root makes objects independent of the folder).
# Uses /usr/local/cuda (nvcc 13.0) through --cuda-home. Usage (device tool, carry .whl):
#   bash bench/device/compile_server_exl3.sh served     then     bash bench/device/compile_server_exl3.sh direct
set -uo pipefail
source "$(dirname "$0")/setup.sh"
WAY=${1:?served or direct}
START=$SECONDS
device_wheels ninja || exit 1
CALL=1; [ "$WAY" = direct ] && { export PP4_NO_SERVER=1; CALL=2; }
W=/tmp/ws-$WAY; rm -rf $W
python3 - "$W" > "$OUT/sampled-$WAY.txt" 2>&1 <<'PY' &
import os, sys, time
from pathlib import Path
seen, served = set(), set()
def chain(pid):
    out = []
    while pid > 1:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            st = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        out.append(cmd)
        pid = int(st[st.rindex(")") + 2:].split()[1])
    return out
end = time.monotonic() + 580
while time.monotonic() < end and not Path(sys.argv[1], "done").exists():
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if Path(os.readlink(d / "exe")).name != "nvcc":
                    continue
            except OSError:
                continue
            c = chain(int(d.name))
            seen.add(d.name)
            if any("-m pp4.reuse.server " in x for x in c):
                served.add(d.name)
    time.sleep(0.5)
print(f"nvcc processes seen: {len(seen)}, run under a compile server's worker: {len(served)}")
PY
SAMPLER=$!
PYTHONPATH=/tmp/site:$REPO python3 "$REPO/bench/build/exl3_build.py" --work $W "${CUDA_HOME_ARGS[@]}" --wheel-dir "$REPO/.whl" \
  -j 16 --arch 9.0 --deadline $((575 - (SECONDS - START))) --phases pp4-cold --call "$CALL" --json "$OUT/build-$WAY.json" \
  2>&1 | tail -12 | tee "$OUT/build-$WAY.txt"
touch $W/done; wait $SAMPLER; cat "$OUT/sampled-$WAY.txt"
find $W -path '*/build/exl3/obj/*.o' -type f -print0 | sort -z | xargs -0 sha256sum | sed "s|$W/[^ ]*/build/|build/|" \
  > "$OUT/objects-$WAY.txt"
wc -l < "$OUT/objects-$WAY.txt"
