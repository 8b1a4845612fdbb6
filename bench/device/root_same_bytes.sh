#!/usr/bin/env bash
# The fixed root and the observer on the H200 machine, one short call: can this machine make the
# namespaces and build and run pp4-observe (with its gcc)?
# Then P2P built cold in two checkouts at different folders with separate stores, observed, in
# the root: every object's and the module's sha256 side by side. Uses /usr/local/cuda (nvcc 13.0)
# through --cuda-home. Usage (device tool, carry .whl): bash bench/device/root_same_bytes.sh
set -uo pipefail
source "$(dirname "$0")/setup.sh"
device_wheels ninja || exit 1
export PYTHONPATH=/tmp/site:$REPO
{ uname -a; nproc; id; python3 --version; cc --version | head -1
  python3 -c '
from pp4.execution import observe, root
print("observer:", observe.unavailable() or "works")
print("fixed root:", root.unavailable("/tmp/pp4-check") or "works")'; } 2>&1 | tee "$OUT/machine.txt"
for i in 1 2; do
  d=/tmp/checkout$i/deep$i; mkdir -p $d; cp -r "$REPO"/. $d/pp4; rm -rf $d/pp4/.whl $d/pp4/.carry
  # CPU of the whole build, its compile server's included (bench/common/accounting.py: it outlives ninja).
  ( cd $d/pp4 && python3 "$REPO/bench/common/accounting.py" "checkout $i" sh -c \
    "python3 configure.py --arch 9.0 --ext p2p --cuda-home /usr/local/cuda --store $d/store >/dev/null && $NINJA" ) 2>&1 | tail -4
done 2>&1 | tee "$OUT/p2p.txt"
python3 - <<'PY' 2>&1 | tee -a "$OUT/p2p.txt"
import glob, gzip, hashlib, json
for i in (1, 2):
    b = f"/tmp/checkout{i}/deep{i}/pp4/build"
    files = sorted(glob.glob(b + "/p2p/obj/*.o") + glob.glob(b + "/p2p/*.so"))
    print(i, [(f.split("/")[-1], hashlib.sha256(open(f, "rb").read()).hexdigest()[:16]) for f in files])
    for f in glob.glob(b + "/.pp4/events/*.json"):
        e = json.load(open(f)); print("  ", e["output"], e["status"], e.get("not_stored"), len(e.get("input_sets", [])), "sets")
PY
