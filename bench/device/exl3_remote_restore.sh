#!/usr/bin/env bash
# The remote tier on the H200 machine, one call: a redis-server on a local port; checkout 1
# (/tmp/w1) builds EXL3 stock cold and sends every object to Redis; checkout 2 (/tmp/w2: other
# folders, its own empty local store and pp4 cache) builds the same target with
# --remote-store-mode read, restoring every object from Redis. Then each object and the module of
# checkout 2 is compared byte for byte with checkout 1's real compile.
# Carried in .whl/: the ninja and redis-py wheels, the exllamav3 wheel (sources), and
# .whl/redis-server/ (Debian's redis-server 7.0.15 with the libraries it links). Uses the machine's
# /usr/local/cuda (nvcc 13.0) through --cuda-home.
# Usage (device tool): bash bench/device/exl3_remote_restore.sh    (writes into $OUT)
set -uo pipefail
source "$(dirname "$0")/setup.sh"
device_wheels ninja redis || exit 1
export PYTHONPATH=/tmp/site:$REPO
RS=$REPO/.whl/redis-server
chmod +x "$RS"/redis-server "$RS"/redis-cli
mkdir -p /tmp/redis
LD_LIBRARY_PATH=$RS "$RS"/redis-server --port 6399 --bind 127.0.0.1 --save '' --appendonly no --dir /tmp/redis \
  --daemonize yes --logfile /tmp/redis/log || { cat /tmp/redis/log; exit 1; }
sleep 0.5
LD_LIBRARY_PATH=$RS "$RS"/redis-cli -p 6399 ping || { cat /tmp/redis/log; exit 1; }
{ nproc; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  /usr/local/cuda/bin/nvcc --version | tail -1; g++ --version | head -1
  LD_LIBRARY_PATH=$RS "$RS"/redis-server --version
  python3 -c 'import torch,sys;print("torch", torch.__version__, torch.version.cuda, sys.version.split()[0])'; } 2>&1 | tee "$OUT/machine.txt"
URL=redis://127.0.0.1:6399/0
for i in 1 2; do
  mode=(); [ $i = 2 ] && mode=(--configure-arg=--remote-store-mode=read)
  python3 "$REPO/bench/build/exl3_build.py" --work /tmp/w$i "${CUDA_HOME_ARGS[@]}" --wheel-dir "$REPO/.whl" -j 16 \
    --configure-arg=--remote-store=$URL "${mode[@]}" --phases pp4-cold --json "$OUT/checkout$i.json" 2>&1 | tail -3
  cp /tmp/w$i/bench.log "$OUT/bench$i.log" 2>/dev/null
done
LD_LIBRARY_PATH=$RS "$RS"/redis-cli -p 6399 info memory | grep -E "used_memory_human|maxmemory_human" | tee "$OUT/redis.txt"
LD_LIBRARY_PATH=$RS "$RS"/redis-cli -p 6399 dbsize | tee -a "$OUT/redis.txt"
cd /tmp/w2/pp4 && python3 - <<'EOF' 2>&1 | tee "$OUT/compare.txt"
# Every object and the module restored in checkout 2 against checkout 1's real compile, byte for byte.
import hashlib, json
from pathlib import Path
def digests(root):
    actions = json.loads((root / "build/actions.json").read_text())["actions"]
    objs = {a["source"].split("exllamav3_ext/")[-1]: hashlib.sha256((root / a["output"]).read_bytes()).hexdigest()
            for a in actions if a["target"] == "exl3"}
    so = next((root / "build/exl3").glob("exllamav3_ext*.so"))
    return objs, hashlib.sha256(so.read_bytes()).hexdigest()
o1, m1 = digests(Path("/tmp/w1/pp4"))
o2, m2 = digests(Path("/tmp/w2/pp4"))
same = sum(o1[k] == o2.get(k) for k in o1)
print(f"objects identical to checkout 1's compile: {same} of {len(o1)}; module identical: {m1 == m2}")
print("differing:", sorted(k for k in o1 if o1[k] != o2.get(k)))
from pp4.reuse.events import Events
known = Events("/tmp/w2/pp4/build/.pp4")
tiers = {}
for a in json.loads(Path("/tmp/w2/pp4/build/actions.json").read_text())["actions"]:
    if a["target"] == "exl3":
        ev = known.get(a["output"])
        key = f"{ev.status}/{ev.tier}" if ev else "no event"
        tiers[key] = tiers.get(key, 0) + 1
print("checkout 2 objects by status/tier:", tiers)
print("checkout 2 refused.log:", (Path("/tmp/w2/pp4/build/.pp4/remote/refused.log").read_text()
      if Path("/tmp/w2/pp4/build/.pp4/remote/refused.log").exists() else "none"))
EOF
# Restored objects against real compiles in checkout 2: the audit compiles some again from their
# stored commands and compares them byte for byte (up to nvcc's pid digits).
cd /tmp/w2/pp4 && "$NINJA" build/certificate.json.gz >/dev/null 2>&1
timeout 150 python3 -m pp4.certify.audit build/certificate.json.gz --recompile 4 --objects 2>&1 | tail -8 | tee "$OUT/audit.txt"
