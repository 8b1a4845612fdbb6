#!/usr/bin/env bash
# The observer's /proc, /sys and /dev rule on a GPU host, one call: build P2P and exl3-decode with
# reuse (the build's summary names every compile the rule left unstored, and why), restore both in
# a second build folder from the same store (every object must come back), `ninja certify`, then
# bench/build/proc_reads.py on P2P's compiles and link: every path there they read, and the rule's verdict.
# Uses /usr/local/cuda through --cuda-home. Usage (device tool, carry .whl): bash bench/device/proc_reads_rule.sh
set -uo pipefail
source "$(dirname "$0")/setup.sh"
device_wheels ninja || exit 1
export PYTHONPATH=/tmp/site:$REPO
{ uname -a; nproc; ls /dev | tr '\n' ' '; echo; ls /proc/driver/nvidia 2>&1; } > "$OUT/machine.txt" 2>&1
W=/tmp/pr; rm -rf $W; mkdir -p $W/a $W/b && cd $W/a
for d in a b; do
  cd $W/$d
  t0=$SECONDS
  { python3 "$REPO/configure.py" --arch 9.0 --ext p2p --ext exl3-decode -j 16 --nice 0 --store $W/store \
      "${CUDA_HOME_ARGS[@]}" && "$NINJA" && "$NINJA" certify; } > "$OUT/build-$d.log" 2>&1
  echo "build $d: rc $?, $((SECONDS - t0)) s" | tee -a "$OUT/build-$d.log"
  grep -E "compiled|restored|not stored|certif" "$OUT/build-$d.log" | tail -6
done
python3 - <<'PY' 2>&1 | tee "$OUT/objects.txt"
import collections, gzip, json
for d in ("a", "b"):
    try:
        objects = json.load(gzip.open(f"/tmp/pr/{d}/build/certificate.json.gz"))["objects"]
    except OSError as e:
        print(d, "no certificate:", e); continue
    print(d, len(objects), "objects", dict(collections.Counter(o["status"] for o in objects)))
    for o in objects:
        if o.get("not_stored"):
            print("  ", d, o["output"], "NOT STORED:", o["not_stored"])
PY
cd $W/a && timeout 240 python3 "$REPO/bench/build/proc_reads.py" build --link 2>"$OUT/proc_reads.err" | tee "$OUT/proc_reads.txt"
