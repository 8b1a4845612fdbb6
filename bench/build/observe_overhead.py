#!/usr/bin/env python3
"""What the fixed root and the observer cost a compile: real units of a configured build, each
compiled three ways, alternating, in one run: plainly (the compiler started by subprocess under
the build's limits, as pp4 ran it before the root), as pp4 runs it now (in the fixed root, under
pp4-observe), and in the root under strace with a seccomp filter (the observer pp4 used before,
when strace is installed). CPU is the compile's whole process tree (RUSAGE_CHILDREN), the
observer's included.

    python bench/build/observe_overhead.py BUILD_DIR [--units N] [--match UNIT,UNIT] [--rounds R] [--json OUT]

BUILD_DIR is a configured build folder (its actions.json and pp4.json); run it from the folder
configure ran in. Also times the launch alone: /bin/true started plainly and in the root, 50 times
(--units 0: only that).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pp4.execution.limits import apply, command_for  # noqa: E402
from pp4.execution.root import Root  # noqa: E402
from pp4.execution.run import date_time_flags, run  # noqa: E402
from pp4.toolchain.compilerenv import process_env  # noqa: E402
from pp4.toolchain.limits import Limits  # noqa: E402


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def plain(argv: list[str], env: dict, limits: Limits, tmp: Path) -> tuple[float, float]:
    tmp.mkdir(parents=True, exist_ok=True)
    c0, t0 = children_cpu(), time.monotonic()
    proc = subprocess.run(command_for(limits, argv), env=process_env(env, tmp), preexec_fn=lambda: apply(limits),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert proc.returncode == 0, argv
    return time.monotonic() - t0, children_cpu() - c0


def rooted(argv: list[str], env: dict, limits: Limits, runs: Path, root: Root) -> tuple[float, float, int]:
    c0, t0 = children_cpu(), time.monotonic()
    ran = run(argv, env, limits, runs, root)
    assert ran.returncode == 0 and ran.trace is not None and ran.root is not None, ran.stderr[-2000:]
    return time.monotonic() - t0, children_cpu() - c0, len(ran.trace.reads)


STRACE = ["strace", "-f", "--seccomp-bpf", "-qq", "-y", "-s", "65535", "-e", "signal=none", "-e",
          "trace=%file,getdents64,getdents,fchdir,clone,clone3,fork,vfork", "-o", "/dev/null", "--"]


def unobserved(argv: list[str], env: dict, limits: Limits, runs: Path, root: Root) -> tuple[float, float]:
    c0, t0 = children_cpu(), time.monotonic()
    ran = run([*argv, *date_time_flags(argv)], env, limits, runs, root, observed=False, compile=False)
    assert ran.returncode == 0 and ran.root is not None, ran.stderr[-2000:]
    return time.monotonic() - t0, children_cpu() - c0


def straced(argv: list[str], env: dict, limits: Limits, runs: Path, root: Root) -> tuple[float, float]:
    c0, t0 = children_cpu(), time.monotonic()
    ran = run([shutil.which("strace"), *STRACE[1:], *argv, *date_time_flags(argv)], env, limits, runs, root,
              observed=False, compile=False)
    assert ran.returncode == 0 and ran.root is not None, ran.stderr[-2000:]
    return time.monotonic() - t0, children_cpu() - c0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("build", type=Path)
    ap.add_argument("--units", type=int, default=3)
    ap.add_argument("--match", default="", help="units whose source path ends so, comma-separated")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--ways", default="plain,root,observed,strace",
                    help="which of plain, root (in the root, not observed), observed, strace; comma-separated")
    args = ap.parse_args()
    config = json.loads((args.build / "pp4.json").read_text())
    limits = Limits.from_dict({**config["limits"], "nice": 0})
    reuse = config["reuse"]
    wanted = args.match.split(",")
    ways = set(args.ways.split(","))
    actions = [a for a in json.loads((args.build / "actions.json").read_text())["actions"]
               if any(a["source"].endswith(w) for w in wanted)]
    actions = actions[:args.units]
    roots = sorted(reuse["roots"], key=len, reverse=True)
    scratch = Path(tempfile.mkdtemp(prefix="overhead-", dir=args.build))
    rows = []
    for a in actions:
        source_root = next((r for r in roots if os.path.abspath(a["source"]).startswith(r + "/")), None)
        root = Root.make(os.getcwd(), reuse.get("relocation") or {}, source_root, str(args.build))
        Path(a["output"]).parent.mkdir(parents=True, exist_ok=True)
        for _ in range(args.rounds):
            pw, pc = plain(list(a["argv"]), a["env"], limits, scratch / "tmp")
            uw, uc = (unobserved(list(a["argv"]), a["env"], limits, scratch / "runs", root) if "root" in ways
                      else (None, None))
            rw, rc, n = rooted(list(a["argv"]), a["env"], limits, scratch / "runs", root)
            sw, sc = (straced(list(a["argv"]), a["env"], limits, scratch / "runs", root)
                      if "strace" in ways and shutil.which("strace") else (None, None))
            rows.append({"unit": a["source"].rsplit("/", 1)[-1], "plain_wall": pw, "plain_cpu": pc,
                         "unobserved_wall": uw, "unobserved_cpu": uc,
                         "root_wall": rw, "root_cpu": rc, "strace_wall": sw, "strace_cpu": sc, "paths": n})
            r = rows[-1]
            print(f"{r['unit']:40} plain {pc:7.2f} CPU-s"
                  + (f" | root {uc:7.2f} ({uc / pc:.3f}x)" if uc else "")
                  + f" | root+pp4-observe {rc:7.2f} CPU-s ({rc / pc:.3f}x)"
                  + (f" | root+strace {sc:7.2f} CPU-s ({sc / pc:.3f}x)" if sc else "") + f", {n} paths", flush=True)
    plain_cpu, root_cpu = sum(r["plain_cpu"] for r in rows), sum(r["root_cpu"] for r in rows)
    if rows:  # --units 0 times the launch alone
        print(f"total: plain {plain_cpu:.2f} CPU-s, root+pp4-observe {root_cpu:.2f} CPU-s: {root_cpu / plain_cpu:.4f}x")
    if rows and all(r["unobserved_cpu"] for r in rows):
        print(f"total: root (not observed) {sum(r['unobserved_cpu'] for r in rows):.2f} CPU-s: "
              f"{sum(r['unobserved_cpu'] for r in rows) / plain_cpu:.4f}x")
    if rows and all(r["strace_cpu"] for r in rows):
        strace_cpu = sum(r["strace_cpu"] for r in rows)
        print(f"total: root+strace {strace_cpu:.2f} CPU-s: {strace_cpu / plain_cpu:.4f}x")
    launches = {}
    true_root = Root.make(str(scratch), {})
    for name, fn in (("plain", lambda: plain(["/bin/true"], {"PATH": "/usr/bin:/bin"}, Limits(), scratch / "tmp")),
                     ("root", lambda: run(["/bin/true"], {"PATH": "/usr/bin:/bin"}, Limits(), scratch / "runs",
                                          true_root, observed=False, compile=False)),
                     ("root+observed", lambda: run(["/bin/true"], {"PATH": "/usr/bin:/bin"}, Limits(), scratch / "runs",
                                                   true_root, compile=False))):
        times = []
        for _ in range(50):
            t0 = time.monotonic()
            fn()
            times.append(time.monotonic() - t0)
        launches[name] = statistics.median(times)
        print(f"launch of /bin/true, {name}: median {1000 * launches[name]:.1f} ms of 50")
    if args.json:
        args.json.write_text(json.dumps({"units": rows, "launch_median_s": launches}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
