#!/usr/bin/env python3
"""What starting the reuse wrapper costs each compile edge, for pp4 trees side by side.

For each tree (this checkout, or `git archive REV` unpacked somewhere), RUNS compile edges of
BUILD_DIR's first compile run under a real ninja (-j 1), each as that tree's build.ninja runs it:
`python -m pp4.reuse CONFIG --env ... -- COMPILER ARGS`, or, where the tree has the compile server
(pp4/reuse/client.py), `python -S -I client.py ...` handing the edge to the server of the ninja run.
Each edge finds the marker the prepass leaves for a restored object, so it only starts, loads its
modules and the build's config, claims the object and ends: the start-up every compile edge pays
before any work. Per-edge times come from ninja's log (ms); the first edge of a served run, which
starts the server and runs itself, is shown apart. Trees alternate over ROUNDS ninja runs; also
shown: the pp4 modules a direct start imports (python -X importtime) and their lines.

    python bench/build/wrapper_startup.py BUILD_DIR [--tree NAME=PATH]... [--runs 20] [--rounds 3] [--json OUT]

Run it from the folder configure ran in for BUILD_DIR. Without --tree: this checkout, served and
direct (PP4_NO_SERVER=1).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NINJA = shutil.which("ninja") or str(Path(sys.executable).parent / "ninja")


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


def ninja_edges(cmd: list[str], marker: Path, tree: Path, runs: int, served: bool) -> list[float]:
    """Seconds of each of RUNS claiming edges run one after another by a real ninja."""
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="startup-") as folder:
        q = shlex.quote
        lines = ["rule claim",
                 f"  command = cd {q(cwd)} && echo bench > {q(str(marker))} && $cmd && test ! -e {q(str(marker))} "
                 f"&& touch {q(folder)}/$out", ""]
        env = f"env PYTHONPATH={q(str(tree))}" + ("" if served else " PP4_NO_SERVER=1")
        for i in range(runs):
            lines += [f"build e{i}: claim" + (f" | e{i - 1}" if i else ""), f"  cmd = {env} {shlex.join(cmd)}"]
        Path(folder, "build.ninja").write_text("\n".join(lines) + "\n")
        ran = subprocess.run([NINJA, "-j1", f"e{runs - 1}"], cwd=folder, capture_output=True, text=True)
        if ran.returncode != 0:
            raise SystemExit(f"the edges failed:\n{ran.stdout[-3000:]}{ran.stderr[-2000:]}")
        log = [ln.split("\t") for ln in Path(folder, ".ninja_log").read_text().splitlines()[1:]]
        by_edge = {f[3]: (int(f[1]) - int(f[0])) / 1000 for f in log}
        return [by_edge[f"e{i}"] for i in range(runs)]


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
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    trees = {name: Path(path).resolve() for name, path in (t.split("=", 1) for t in args.tree)}
    ways = [(name, tree, (tree / "pp4" / "reuse" / "client.py").exists()) for name, tree in trees.items()]
    if not ways:
        ways = [("this checkout, served", REPO, True), ("this checkout, direct", REPO, False)]
    build = args.build.resolve()
    action = json.loads((build / "actions.json").read_text())["actions"][0]
    if not Path(action["output"]).exists():
        raise SystemExit(f"{action['output']} is not built: build BUILD_DIR first (`ninja`)")
    marker = Path(action["output"] + ".pp4-reused")
    direct = edge_command(build, action)
    edges: dict[str, list[float]] = {name: [] for name, _, _ in ways}
    firsts: dict[str, list[float]] = {name: [] for name, _, _ in ways}
    for _ in range(args.rounds):
        for name, tree, served in ways:
            cmd = [direct[0], "-S", "-I", str(tree / "pp4" / "reuse" / "client.py"), *direct[3:]] if served else direct
            times = ninja_edges(cmd, marker, tree, args.runs, served)
            firsts[name].append(times[0])
            edges[name] += times[1:] if served else times
    result = {}
    for name, tree, served in ways:
        _, report = claim_once(direct, marker, tree, ["-X", "importtime"])
        modules, lines = pp4_modules(report, tree)
        result[name] = {"tree": str(tree), "served": served, "median_s": statistics.median(edges[name]),
                        "edges_s": edges[name], "first_edge_s": firsts[name] if served else None,
                        "pp4_modules": modules, "pp4_lines": lines}
        first = f"; a run's first edge (starts the server) {1000 * statistics.median(firsts[name]):.0f} ms" if served else ""
        print(f"{name:28} start-up per edge, median {1000 * result[name]['median_s']:6.1f} ms of {len(edges[name])}"
              f"{first}; a direct start imports {modules} pp4 modules ({lines} lines)")
    first_name, *rest = result
    for name in rest:
        print(f"{first_name} / {name}: {result[first_name]['median_s'] / result[name]['median_s']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
