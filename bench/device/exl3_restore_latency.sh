#!/usr/bin/env bash
# EXL3 restored from Redis over a slow link on the device machine, one call: a redis-server on a
# local port; checkout 1 (/tmp/l1) builds EXL3 stock cold and sends every object and the module to
# Redis directly; checkout 2 (/tmp/l2: another folder, its own empty local store) builds the same
# target through bench/common/delay_proxy.py, which holds every request back DELAY_MS (20) as a network
# round trip would: wall and CPU of its whole `ninja exl3` (bench/common/accounting.py), the round trips it
# made, what Redis holds (keys, bytes, keys per stored object), and each object and the module of
# checkout 2 against checkout 1's, byte for byte; then checkout 3 (/tmp/l3) from checkout 1's
# local store alone, timed the same way.
# Carried: .whl (ninja, redis, zstandard, cryptography, cffi, pycparser wheels: bench/device/fetch_wheels.sh;
# .whl/redis-server/: Debian's redis-server 7.0.15 and the libraries it links) and the machine's
# /usr/local/cuda through --cuda-home. EXT=p2p runs the same on P2P (a dry run where EXL3 is slow).
# Usage (device tool, carry .whl): bash bench/device/exl3_restore_latency.sh    (writes into $OUT)
set -uo pipefail
source "$(dirname "$0")/setup.sh"
device_wheels ninja redis || exit 1
export PYTHONPATH=/tmp/site:$REPO
EXT=${EXT:-exl3}
DELAY_MS=${DELAY_MS:-20}
RS=$REPO/.whl/redis-server
REDIS_SERVER=${REDIS_SERVER:-$RS/redis-server}
chmod +x "$RS"/* 2>/dev/null
rm -rf /tmp/l1 /tmp/l2 /tmp/l3 /tmp/redis /tmp/trips.txt  # a warm machine keeps an earlier session's
mkdir -p /tmp/redis
LD_LIBRARY_PATH=$RS "$REDIS_SERVER" --port 6399 --bind 127.0.0.1 --save '' --appendonly no --dir /tmp/redis \
  --daemonize yes --logfile /tmp/redis/log || { cat /tmp/redis/log; exit 1; }
sleep 0.5
python3 "$REPO/bench/common/delay_proxy.py" --to 6399 --port 6400 --delay-ms "$DELAY_MS" --count-file /tmp/trips.txt \
  > /tmp/proxy.log 2>&1 &
PROXY=$!
# Both stopped however the script ends: a server left running holds the session's output open.
trap 'kill $PROXY 2>/dev/null; pkill -f "redis-server 127.0.0.1:6399"' EXIT
sleep 1
{ nproc; nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null; LD_LIBRARY_PATH=$RS "$REDIS_SERVER" --version; } \
  | tee "$OUT/remote-latency.txt"
build() {  # build DIR URL [configure options]: configure and `ninja $EXT` there, timed (URL -: no remote tier)
  local dir=$1 url=$2; shift 2
  local remote=(--store "$dir/store" --remote-store "$url")
  [ "$url" = - ] && remote=()
  mkdir -p "$dir" && cd "$dir"
  python3 "$REPO/configure.py" --arch 9.0 --ext "$EXT" "${CUDA_HOME_ARGS[@]}" --wheel-dir "$REPO/.whl" -j 16 --nice 0 \
    "${remote[@]}" "$@" > configure.log 2>&1 || { tail -5 configure.log; exit 1; }
  $NINJA toolchain > /dev/null 2>&1
  local before; before=$(cat /tmp/trips.txt 2>/dev/null || echo 0)
  python3 "$REPO/bench/common/accounting.py" "$(basename "$dir") ninja $EXT" $NINJA -j 16 "$EXT" > ninja.log 2>> "$OUT/remote-latency.txt" \
    || { tail -20 ninja.log | tee -a "$OUT/remote-latency.txt"; exit 1; }
  echo "  round trips through the proxy: $(( $(cat /tmp/trips.txt 2>/dev/null || echo 0) - before ))" | tee -a "$OUT/remote-latency.txt"
  $NINJA build/certificate.json.gz > /dev/null 2>&1  # after the timing: what the comparison reads
  grep "missing objects restored" ninja.log | tee -a "$OUT/remote-latency.txt"
}
build /tmp/l1 redis://127.0.0.1:6399/0
build /tmp/l2 redis://127.0.0.1:6400/0 --remote-store-mode read
# checkout 3: a third folder from checkout 1's local store, no remote tier
build /tmp/l3 - --store /tmp/l1/store
python3 - <<'PY' 2>&1 | tee -a "$OUT/remote-latency.txt"
import gzip, json
a, b = (json.loads(gzip.decompress(open(f"/tmp/{d}/build/certificate.json.gz", "rb").read())) for d in ("l1", "l3"))
same = sum(x["object_sha256"] == y["object_sha256"] for x, y in zip(a["objects"], b["objects"]))
mods = sum(x["sha256"] == y["sha256"] for x, y in zip(a["modules"], b["modules"]))
print(f"checkout 3 (checkout 1's local store): {same} of {len(a['objects'])} objects and {mods} of {len(a['modules'])} modules equal")
PY
tail -2 /tmp/l3/ninja.log | tee -a "$OUT/remote-latency.txt"
python3 - <<'PY' 2>&1 | tee -a "$OUT/remote-latency.txt"
import gzip, hashlib, json, redis
from pathlib import Path
client = redis.Redis(port=6399)
keys = list(client.scan_iter(count=1000))
size = sum(client.strlen(k) for k in keys)
def made(root):
    doc = json.loads(gzip.decompress((root / "build/certificate.json.gz").read_bytes()))
    objs = {o["output"]: o for o in doc["objects"]}
    mods = {m["file"]: m for m in doc["modules"]}
    return objs, mods
o1, m1 = made(Path("/tmp/l1")); o2, m2 = made(Path("/tmp/l2"))
same = sum(hashlib.sha256((Path("/tmp/l2") / k).read_bytes()).hexdigest() == v["object_sha256"] == o2[k]["object_sha256"]
           for k, v in o1.items() if k in o2)
tiers = {}
for o in o2.values():
    tiers[o.get("tier") or o["status"]] = tiers.get(o.get("tier") or o["status"], 0) + 1
mods_same = sum(m1[k]["sha256"] == m2[k]["sha256"] for k in m1 if k in m2)
linked = [m.get("link_reuse") for m in m2.values()]
stored = len(o1) + len(m1)
print(f"checkout 2: {len(o2)} objects ({tiers}), {same} of {len(o1)} byte-identical to checkout 1's; modules identical "
      f"{mods_same} of {len(m1)}, restored: {[l.get('tier') if l else None for l in linked]}")
print(f"Redis: {len(keys)} keys, {size / 1e6:.1f} MB for {stored} stored objects and modules "
      f"({len(keys) / stored:.2f} keys each)")
store = Path("/tmp/l1/store")
parts = {d: sum(p.lstat().st_blocks * 512 for p in (store / d).rglob("*") if p.is_file())
         for d in ("objects", "setpacks", "actions", "manifests")}
content = sum(o["object_size"] for o in o1.values()) + sum((Path("/tmp/l1") / k).stat().st_size for k in m1)
print(f"checkout 1's local store: {sum(parts.values()) / 1e6:.1f} MB on disk ({', '.join(f'{k} {v / 1e6:.1f}' for k, v in parts.items())}) "
      f"for {content / 1e6:.1f} MB of objects and modules")
PY
