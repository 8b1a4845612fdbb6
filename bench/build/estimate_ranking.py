#!/usr/bin/env python3
"""How well pp4's compile-time estimate (pp4/plan/estimate.py) orders units, against source size:
Spearman's rank correlation of each with measured compile times.

    python bench/build/estimate_ranking.py --table pp4/plan/durations/exl3-1.6.5.tsv --root EXL3_EXT_DIR [--include DIR]
    python bench/build/estimate_ranking.py --build BUILD_DIR [BUILD_DIR ...]   (a pp4 build: its .ninja_log and actions.json)
    python bench/build/estimate_ranking.py --log NINJA_LOG --root PROJECT_DIR [--include DIR]   (a kept .ninja_log)
    ... --fit     also fit the estimate's coefficients to all the units given (an intercept per set)

Besides the ranks it prints each set's scale: the sum of the estimates over the sum of the measured
times (1.0: configure's cost line is right on the machine that timed them).

For a build, each object's time is its last compile in .ninja_log, and its include folders are the
-I folders of its command inside its project. Objects ninja only claimed (restored by the prepass) are left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pp4.plan.estimate import estimate_seconds, features, terms  # noqa: E402
from pp4.plan.modules import read_duration_table, read_ninja_log  # noqa: E402


def ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2
        i = j + 1
    return r


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else float("nan")


def from_table(table: Path, root: Path, includes: list[Path]) -> list[tuple[Path, list[Path], float]]:
    return [(root / rel, includes or [root], ms / 1000) for rel, ms in read_duration_table(table).items()
            if (root / rel).is_file()]


def from_build(build: Path) -> list[tuple[Path, list[Path], float]]:
    log = read_ninja_log(build / ".ninja_log")
    out = []
    for action in json.loads((build / "actions.json").read_text())["actions"]:
        ms = log.get(action["output"])
        if ms is None or ms < 50:  # not compiled here (claimed after the prepass restored it)
            continue
        argv = action["argv"]
        incs = [Path(a[2:]) for a in argv if a.startswith("-I") and len(a) > 2]
        incs += [Path(argv[i + 1]) for i, a in enumerate(argv[:-1]) if a == "-I"]
        # The project's own folders, as configure passes them: the command's others are torch's and
        # the toolkit's, which configure's estimate never walks.
        root = Path(json.loads((build / action["target"] / "plan.json").read_text())["root"])
        out.append((Path(action["source"]), [i for i in incs if i.is_relative_to(root)], ms / 1000))
    return out


def from_log(log: Path, root: Path, includes: list[Path]) -> list[tuple[Path, list[Path], float]]:
    """A pp4 build's .ninja_log kept without its build folder: objects build/<module>/obj/<source>.o."""
    out = []
    for output, ms in read_ninja_log(log).items():
        if "/obj/" not in output or ms < 50:
            continue
        source = root / output.split("/obj/", 1)[1].removesuffix(".o")
        if source.is_file():
            out.append((source, includes or [root], ms / 1000))
    return out


def fit(sets: list[list[tuple[Path, list[Path], float]]]) -> tuple[list[float], list[float]]:
    """Least squares of log(seconds) on the estimate's features, with one intercept per set of units
    (a project's flags and architecture count scale all its units alike; what orders them is the
    rest). Returns [A, B, C, ...] of pp4/plan/estimate.py, A the mean of the sets' intercepts (each
    project one vote: the estimate serves projects nothing has timed), and the sets' own intercepts."""
    import numpy as np
    rows, y = [], []
    for k, units in enumerate(sets):
        for p, incs, t in units:
            rows.append([float(j == k) for j in range(len(sets))] + terms(*features(p, tuple(incs)))[1:])
            y.append(np.log(t))
    coef, *_ = np.linalg.lstsq(np.array(rows), np.array(y), rcond=None)
    intercepts = [float(c) for c in coef[:len(sets)]]
    mean = sum(intercepts) / len(intercepts)
    return [round(c, 3) for c in [mean, *map(float, coef[len(sets):])]], [round(a, 3) for a in intercepts]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path)
    ap.add_argument("--root", type=Path, action="append", default=[])
    ap.add_argument("--include", type=Path, action="append", default=[])
    ap.add_argument("--build", type=Path, nargs="*", default=[])
    ap.add_argument("--log", type=Path, action="append", default=[],
                    help="a kept .ninja_log; its --root (and --include) pair by position: give one --root per --log")
    ap.add_argument("--fit", action="store_true")
    args = ap.parse_args()
    sets = []
    roots = list(args.root)
    if args.table:
        sets.append((f"{args.table.name}", from_table(args.table, roots.pop(0), args.include)))
    for log in args.log:
        root = roots.pop(0)
        sets.append((str(log), from_log(log, root, [i for i in args.include if i.is_relative_to(root)])))
    for b in args.build:
        sets.append((str(b), from_build(b)))
    for name, units in sets:
        times = [t for _, _, t in units]
        size = [float(p.stat().st_size) for p, _, _ in units]
        est = [estimate_seconds(p, tuple(incs)) for p, incs, _ in units]
        print(f"{name}: {len(units)} units, Spearman with measured times: estimate {spearman(est, times):.3f}, "
              f"source size {spearman(size, times):.3f}; scale (estimated/measured seconds) {sum(est) / sum(times):.2f}")
    if args.fit:
        coefficients, intercepts = fit([units for _, units in sets])
        print("fit over all", sum(len(u) for _, u in sets), "units, one intercept per set:", coefficients,
              "(A: the mean of the sets' own intercepts:", ", ".join(map(str, intercepts)) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
