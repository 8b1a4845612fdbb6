#!/usr/bin/env bash
# A no-op `ninja` of two pp4 trees side by side: tests/fixtures/debuginfo (one g++ unit) configured and
# built by each tree in a folder of its own, then `ninja` timed N times in each, alternating; medians.
#
#   N=30 bash bench/build/noop_pair.sh OLD_TREE [NEW_TREE]     (NEW_TREE: this checkout; e.g. OLD_TREE
#                                                               from `git worktree add /tmp/old d6293f1`)
set -eu
NEW=$(cd "${2:-$(dirname "$0")/../..}" && pwd); OLD=$(cd "${1:?usage: noop_pair.sh OLD_TREE [NEW_TREE]}" && pwd)
W=$(mktemp -d /tmp/pp4-noop.XXXXXX)
cp -r "$NEW/tests/fixtures/debuginfo" "$W/src"
PY=${PYTHON:-python3}; NINJA=${NINJA:-$(command -v ninja)}
for t in old new; do
  tree=$OLD; [ $t = new ] && tree=$NEW
  mkdir -p "$W/$t"
  (cd "$W/$t" && export PYTHONPATH=$tree PP4_CONFIG_DIR=$W/cfg-$t \
     && "$PY" "$tree/configure.py" --arch 9.0 --ext-spec "$W/src/plain.toml" --store "$W/store-$t" >/dev/null \
     && "$NINJA" >/dev/null && sleep 3 && "$NINJA" >/dev/null)
done
W=$W OLD=$OLD NEW=$NEW NINJA=$NINJA "$PY" - <<'PY'
import os, statistics, subprocess, time
w, n = os.environ["W"], int(os.environ.get("N", "30"))
times = {"old": [], "new": []}
for _ in range(n):
    for t in times:
        env = dict(os.environ, PYTHONPATH=os.environ["OLD" if t == "old" else "NEW"], PP4_CONFIG_DIR=f"{w}/cfg-{t}")
        t0 = time.perf_counter()
        out = subprocess.run([os.environ["NINJA"]], cwd=f"{w}/{t}", env=env, capture_output=True, text=True)
        times[t].append(time.perf_counter() - t0)
        assert "no work to do" in out.stdout, out.stdout + out.stderr
for t, v in times.items():
    print(f"{t}: median {statistics.median(v) * 1000:.1f} ms, min {min(v) * 1000:.1f} ms over {len(v)}")
PY
rm -rf "$W"
