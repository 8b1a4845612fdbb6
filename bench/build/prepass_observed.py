#!/usr/bin/env python3
"""The reuse prepass at EXL3 scale with real observation sets, on a machine that cannot compile EXL3.

Each of N units is stored through this checkout's own Reuser as a compile stores it, with the
observation set a real compile of a torch-including unit made (TEMPLATE: a build folder's event of
such a unit, e.g. P2P's bindings.cpp: some 15,700 observations, 5,500 files) plus its own source and
eight project headers, and an object of random bytes; then the objects are deleted and the prepass
restores them all, 1 + ROUNDS times (the median of the warm runs is reported). Then the check every
ninja run makes before it decides in full (pp4/reuse/recheck.py), with every object there: each
one's observations against the machine, ROUNDS times; then the quick check that runs first on every
run (pp4/reuse/quickcheck.py: identities only, in a Python of its own), ROUNDS times.

    python bench/build/prepass_observed.py TEMPLATE_BUILD_DIR [--units 264] [--rounds 5] [--match bindings.cpp]

Run it from the folder configure ran in for TEMPLATE_BUILD_DIR (the template's /pp4/work).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pp4.execution.root import Root  # noqa: E402
from pp4.build import events
from pp4.reuse import inputsets, prepass, quickcheck, recheck  # noqa: E402
from pp4.store import hashed, packs, signing  # noqa: E402
from pp4.reuse import wrapper as reuse  # noqa: E402
from pp4.reuse.actionkey import parse_compile  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("template", type=Path)
    ap.add_argument("--units", type=int, default=264)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--match", default="bindings.cpp")
    ap.add_argument("--object-kib", type=int, default=512)
    args = ap.parse_args()
    if not signing.default_key_path().exists():  # the units are stored as a compile stores them: signed
        os.environ["PP4_CONFIG_DIR"] = tempfile.mkdtemp(prefix="prepass-config-")
        signing.new_key(name="bench")
    tconf = json.loads((args.template / "pp4.json").read_text())
    known = events.Events(tconf["reuse"]["state_dir"])
    action = next(a for a in json.loads((args.template / "actions.json").read_text())["actions"]
                  if a["source"].endswith(args.match))
    ev = known.get(action["output"])
    # What the template observed outside its own project (torch, the toolkit, the system): its own
    # sources and build folder are the template's, and the units here have their own.
    mapping = Root.from_mounts(ev.mounts) if ev.mounts else None
    own = tuple(str(Path(r).resolve()) + "/" for r in [*tconf["reuse"]["roots"], str(args.template.resolve())])
    template_sets = inputsets.SetChecker(None)
    template = [p for sid in ev.input_sets
                for p in template_sets.load(inputsets.directory(tconf["reuse"]["state_dir"]), ev.sets_pack, sid)
                if not ((mapping.real(p[0]) if mapping else p[0]) or "").startswith(own)]
    work = Path(tempfile.mkdtemp(prefix="prepass-observed-", dir=args.template))
    src, build = work / "src", work / "build"
    (src / "include").mkdir(parents=True)
    project = []
    for j in range(40):
        p = src / "include" / f"h{j}.cuh"
        p.write_text(f"#pragma once\n#define H{j} {j}\n")
        project.append(p)
    old = time.time() - 3600
    config = dict(tconf, reuse=dict(tconf["reuse"], roots=[str(src)], state_dir=str(build / ".pp4"),
                                    store=str(work / "store"), remote=None, executor=None),
                  limits=dict(tconf["limits"], tmpdir=str(build / "tmp")))
    build.mkdir()
    (build / "pp4.json").write_text(json.dumps(config))
    cfg = reuse.ReuseConfig.load(build / "pp4.json")
    reuser = reuse.Reuser(cfg)
    rnd = random.Random(7)
    actions = []
    for i in range(args.units):
        unit = src / f"unit{i}.cu"
        unit.write_text(f"// unit {i}\n")
        for p in [unit, *project]:
            os.utime(p, (old, old))
        out = build / "obj" / f"unit{i}.cu.o"
        argv = [action["argv"][0], "-c", str(unit), "-o", str(out), "-MD", "-MF", str(out) + ".d", "-I", str(src / "include"),
                *[a for a in action["argv"] if a.startswith("-isystem") or a.startswith("-D")]]
        act = reuser.action(parse_compile(argv), action["env"])
        own = [str(unit), *map(str, rnd.sample(project, 8))]
        pairs = list(template) + [[act.root.fixed(p) if act.root else p, reuser.states.state(p)] for p in own]
        out.parent.mkdir(exist_ok=True)
        out.write_bytes(rnd.randbytes(args.object_kib * 1024))
        stored = reuser.store_compile(act, pairs, None, 30.0)
        assert stored["action_key"], stored
        reuser.event(act, status="compiled", compile_duration_s=30.0, **stored)
        actions.append({"argv": argv, "output": str(out), "env": action["env"], "target": "bench"})  # no plan.json: no module
    reuser.hasher.save()
    actions_file = build / "actions.json"
    actions_file.write_text(json.dumps({"actions": actions}))
    runs = []
    for _ in range(1 + args.rounds):
        for a in actions:
            Path(a["output"]).unlink()
        cpu0, t0 = time.process_time(), time.monotonic()
        prepass.prepass(cfg, actions_file, build / ".pp4" / "prepass.stamp")
        runs.append((time.process_time() - cpu0, time.monotonic() - t0))
        missing = [a for a in actions if not Path(a["output"]).exists()]
        if missing:  # say why, from a lookup of the first: a bench that measures misses measures nothing
            probe = reuse.Reuser(cfg)
            probe.lookup(probe.action(parse_compile(missing[0]["argv"]), missing[0]["env"]))
            sys.exit(f"{len(missing)} of {len(actions)} units not restored; the first: {probe.missed}")
        for a in actions:
            Path(a["output"] + reuse.MARKER_SUFFIX).unlink(missing_ok=True)
    checks = []
    for _ in range(args.rounds):
        stamp = build / ".pp4" / "recheck.stamp"
        stamp.unlink(missing_ok=True)
        cpu0, t0 = time.process_time(), time.monotonic()
        recheck.recheck(cfg, actions_file, stamp)
        checks.append((time.process_time() - cpu0, time.monotonic() - t0))
        if any(not Path(a["output"]).exists() for a in actions):
            sys.exit("the check removed objects whose observations all hold")
    # The quick check every ninja run makes first (pp4/reuse/quickcheck.py), as build.ninja starts it:
    # a Python of its own that stats every path in the table the full check wrote, once its
    # identities are older than the slack (else no table is written).
    time.sleep(quickcheck.SLACK_S + 0.2)
    stamp = build / ".pp4" / "recheck.stamp"
    recheck.recheck(cfg, actions_file, stamp)
    table = Path(quickcheck.table_path(stamp))
    entries = table.read_bytes().count(b"\0") // 2 if table.exists() else 0
    quick = []
    for _ in range(args.rounds):
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-S", "-I", quickcheck.__file__, str(build / "pp4.json"),
                               str(actions_file), str(stamp)], capture_output=True, text=True)
        quick.append(time.monotonic() - t0)
        if proc.returncode != 0 or proc.stdout or proc.stderr or not entries:
            sys.exit(f"the quick check did not pass on its own table ({entries} entries): {proc.stdout}{proc.stderr}")
    warm = runs[1:]
    packed = list(hashed.named_files(inputsets.directory(work / "store")))
    sets = len({sid for p in packed for sid in packs.names(p.read_bytes())})
    size = sum(p.stat().st_size for p in packed)
    print(f"{args.units} units, {len(template)} observations each from {action['source']}, {sets} distinct sets "
          f"(packed, {size / 1e6:.1f} MB) in the store: prepass median {statistics.median(c for c, _ in warm):.3f} CPU-s, "
          f"{statistics.median(w for _, w in warm):.3f} s wall (cold {runs[0][0]:.3f} CPU-s); the check before ninja "
          f"decides, every object there: median {statistics.median(c for c, _ in checks):.3f} CPU-s, "
          f"{statistics.median(w for _, w in checks):.3f} s wall; the quick check every run makes first, "
          f"{entries} identities: median {statistics.median(quick):.3f} s wall, its own process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
