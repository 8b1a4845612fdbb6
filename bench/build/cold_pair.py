#!/usr/bin/env python3
"""Builds of two pp4 trees, alternating: is a change's cost on a build that compiles everything (or,
with --warm, on one that restores everything) within what a user would notice?

    git worktree add /tmp/old REV
    python bench/build/cold_pair.py --old /tmp/old [--ext p2p] [--rounds 4] [--warm] [--work DIR]

Each round builds the target once with each tree (the order alternating between rounds), each time
in a fresh folder with the shared toolchain cache, and counts the whole `ninja`'s CPU, the compile
server and its workers included (bench/common/accounting.py). Cold: each build with an empty store
(PP4_STORE_DIR). --warm: each tree builds once cold into a store of its own (not counted), and every
round restores from it. Prints each build and the medians' ratio, this checkout against --old.
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(REPO))  # bench.common, from any folder
from bench.common import accounting  # noqa: E402


def build(tree: Path, ext: str, work: Path, store: Path | None = None) -> tuple[float, float]:
    """(wall, CPU) of `ninja EXT` configured by tree's configure.py in a fresh folder, with store
    (an empty one of the folder's own when None)."""
    folder = Path(tempfile.mkdtemp(prefix="cold-", dir=work))
    env = dict(os.environ, PYTHONPATH=str(tree), PP4_STORE_DIR=str(store or folder / "store"))
    ninja = str(Path(sys.executable).parent / "ninja")
    subprocess.run([sys.executable, str(tree / "configure.py"), "--arch", "9.0", "--ext", ext], cwd=folder, env=env,
                   check=True, capture_output=True)
    subprocess.run([ninja, "toolchain"], cwd=folder, env=env, check=True, capture_output=True)
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    done = subprocess.run([ninja, ext], cwd=folder, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    accounting.reap_orphans()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"ninja {ext} failed with {tree}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    shutil.rmtree(folder)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, required=True, help="another pp4 checkout (git worktree add DIR REV)")
    ap.add_argument("--ext", default="p2p")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--warm", action="store_true", help="every round restores from a store the tree filled once")
    args = ap.parse_args()
    if not (args.old / "configure.py").is_file():
        raise SystemExit(f"--old {args.old}: no configure.py there (make one with `git worktree add DIR REV`)")
    accounting.become_subreaper()
    trees = {"old": args.old.resolve(), "new": REPO}
    cpu: dict[str, list[float]] = {"old": [], "new": []}
    stores = {name: None for name in trees}
    if args.warm:
        for name, tree in trees.items():
            stores[name] = Path(tempfile.mkdtemp(prefix=f"store-{name}-", dir=args.work))
            build(tree, args.ext, args.work, stores[name])
    for r in range(args.rounds):
        for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
            wall, used = build(trees[name], args.ext, args.work, stores[name])
            cpu[name].append(used)
            print(f"round {r} {name}: {wall:.2f} s wall, {used:.3f} CPU-s", flush=True)
    old, new = statistics.median(cpu["old"]), statistics.median(cpu["new"])
    pairs = [n / o for o, n in zip(cpu["old"], cpu["new"])]
    print(f"medians: old {old:.3f}, new {new:.3f} CPU-s: new/old {new / old:.3f} "
          f"(pairs {min(pairs):.2f}x to {max(pairs):.2f}x)")
    for store in stores.values():
        if store is not None:
            shutil.rmtree(store)
    return 0


if __name__ == "__main__":
    sys.exit(main())
