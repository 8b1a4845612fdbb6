#!/usr/bin/env python3
"""What a build's compiles read under /proc, /sys and /dev, and whether pp4 leaves each out.

Each compile of BUILD_DIR (its actions.json) runs again under pp4-observe, where it is (not in the
fixed root: the files read there are the same), into a scratch object; with --link, a shared link
of those objects too. Every path under /proc, /sys or /dev that a process of it opened, read as a
link or ran is listed with the calls and whether pp4's rule (pp4/execution/observe.py) leaves it
out ("neutral") or makes the compile unstorable. Run it on each kind of machine a store is shared
by (a GPU host above all): a file every compile reads that the rule does not leave out makes every
compile there unstorable.

    python bench/build/proc_reads.py BUILD_DIR [--limit N] [--link]

Run it from the folder configure ran in for BUILD_DIR.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pp4.execution import observe  # noqa: E402

UNDER = ("/proc", "/sys", "/dev")


def reads(log: str) -> list[tuple[str, str]]:
    """(call, path) of every path under /proc, /sys or /dev in a pp4-observe log."""
    found = []
    for line in Path(log).read_text(errors="surrogateescape").splitlines():
        fields = line.split("\t")
        for path in fields[4:]:
            if path.startswith(UNDER):
                found.append((fields[1], path))
    return found


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("build", type=Path)
    ap.add_argument("--limit", type=int, help="only the first N compiles")
    ap.add_argument("--link", action="store_true", help="also link the objects into a shared library, observed")
    args = ap.parse_args()
    if observe.unavailable():
        raise SystemExit(f"pp4-observe cannot run here: {observe.unavailable()}")
    actions = json.loads((args.build / "actions.json").read_text())["actions"][:args.limit]
    seen: dict[tuple[str, str], int] = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="proc-reads-") as scratch:
        objects = []
        for i, action in enumerate(actions):
            log, out = os.path.join(scratch, f"log{i}"), os.path.join(scratch, f"o{i}.o")
            # Only its outputs go elsewhere, as the audit's recompiles do (pp4/certify/audit.py).
            argv = list(action["argv"])
            argv[argv.index("-o") + 1] = out
            argv[argv.index("-MF") + 1] = out + ".d"
            proc = subprocess.run(observe.command(log) + argv, env=action["env"], capture_output=True, text=True)
            print(f"{action['output']}: rc {proc.returncode}", file=sys.stderr)
            objects.append(out)
            seen.update(reads(log))
        if args.link and actions:
            log = os.path.join(scratch, "log-link")
            subprocess.run(observe.command(log) + ["g++", "-shared", *objects, "-o", os.path.join(scratch, "m.so")],
                           env=actions[0]["env"], capture_output=True)
            seen.update(reads(log))
    trace = observe.parse("".join(f"1\t{call}\t0\t\t{path}\n" for call, path in seen))
    for (call, path), n in sorted(seen.items(), key=lambda kv: kv[0][1]):
        verdict = "unstorable" if path in trace.machine else ("through /proc: unstorable" if path in trace.through_proc
                                                               else "neutral")
        print(f"{n:5}  {call:12} {path:50} {verdict}")
    print(f"{len(actions)} compiles{' and a link' if args.link else ''}: {len(seen)} distinct reads there, "
          f"{len(trace.machine) + len(trace.through_proc)} that make a compile unstorable")
    return 0


if __name__ == "__main__":
    sys.exit(main())
