#!/usr/bin/env python3
"""What starting the reuse wrapper costs each compile edge, for pp4 trees side by side.

For each tree (this checkout, or `git archive REV` unpacked somewhere), the command a compile edge
of BUILD_DIR runs, `python -m pp4.reuse CONFIG --env ... -- COMPILER ARGS`, is started with that
tree on PYTHONPATH and the marker the prepass leaves for a restored object in place, so that the
process only starts, loads its modules and the build's config, claims the object and ends: the
start-up every compile edge pays before any work. Trees alternate, RUNS rounds; the median wall
time of each is reported, with the pp4 modules the process imported (python -X importtime) and
their lines.

    python bench/wrapper_startup.py BUILD_DIR [--tree NAME=PATH]... [--runs 20] [--json OUT]

Run it from the folder configure ran in for BUILD_DIR. Without --tree: this checkout alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def edge_command(build: Path, action: dict) -> list[str]:
    env_args = [a for k, v in sorted(action["env"].items()) for a in ("--env", f"{k}={v}")]
    return [sys.executable, "-m", "pp4.reuse", str(build / "pp4.json"), *env_args, "--", *action["argv"]]


def claim_once(cmd: list[str], marker: Path, tree: Path, extra: list[str] = ()) -> tuple[float, str]:
    marker.write_text("bench\n")
    env = dict(os.environ, PYTHONPATH=str(tree))
    t0 = time.monotonic()
    proc = subprocess.run([cmd[0], *extra, *cmd[1:]], env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0 or marker.exists():
        raise SystemExit(f"the wrapper of {tree} did not claim the object: rc {proc.returncode}\n{proc.stderr[-2000:]}")
    return wall, proc.stderr


def pp4_modules(importtime: str, tree: Path) -> tuple[int, int]:
    """(pp4 modules imported, their lines) from python -X importtime's report."""
    names = set()
    for line in importtime.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name == "pp4" or name.startswith("pp4."):
                names.add(name)
    lines = 0
    for name in names:
        base = tree / Path(*name.split("."))
        path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if path.exists():
            lines += len(path.read_text().splitlines())
    return len(names), lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("build", type=Path)
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree) or {"this checkout": str(REPO)}
    trees = {name: Path(path).resolve() for name, path in trees.items()}
    build = args.build.resolve()
    action = json.loads((build / "actions.json").read_text())["actions"][0]
    if not Path(action["output"]).exists():
        raise SystemExit(f"{action['output']} is not built: build BUILD_DIR first (`ninja`)")
    marker = Path(action["output"] + ".pp4-reused")
    cmd = edge_command(build, action)
    walls: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.runs):
        for name, tree in trees.items():
            walls[name].append(claim_once(cmd, marker, tree)[0])
    result = {}
    for name, tree in trees.items():
        _, report = claim_once(cmd, marker, tree, ["-X", "importtime"])
        modules, lines = pp4_modules(report, tree)
        result[name] = {"tree": str(tree), "median_s": statistics.median(walls[name]), "runs": walls[name],
                        "pp4_modules": modules, "pp4_lines": lines}
        print(f"{name:24} start-up median {1000 * result[name]['median_s']:6.1f} ms of {args.runs}; "
              f"{modules} pp4 modules imported ({lines} lines)")
    if len(trees) > 1:
        first, *rest = trees
        for name in rest:
            print(f"{name} / {first}: {result[name]['median_s'] / result[first]['median_s']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
