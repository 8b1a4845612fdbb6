#!/usr/bin/env python3
"""How long a cold EXL3 build would take on a cluster of N cores, from measured per-unit times.

    python bench/build/cluster_projection.py [--cores 16,64,256] [--overhead-s 1.5] [--table pp4/plan/durations/exl3-1.6.5.tsv]

Each unit's compile time is the H200 figure in pp4's durations table (16 cores busy, nvcc 13.0,
sm_90). Units are started longest first, as build.ninja orders them, each on the first core to
come free (ninja's pool, one compile per core); each compile pays --overhead-s for being sent to a
node and checked on return (measured on this machine's local cluster, bench/build/cluster_build.py).
The link of the 194 objects (a few seconds) and the prepass are left out. A projection, not a
measurement: a node's core may be slower or faster than the H200 machine's, and a cluster's network
and the build machine's own work (one waiting process per compile) are not modelled.
"""

from __future__ import annotations

import argparse
import heapq
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def makespan(durations: list[float], cores: int, overhead: float) -> float:
    free = [0.0] * cores
    heapq.heapify(free)
    end = 0.0
    for d in sorted(durations, reverse=True):
        start = heapq.heappop(free)
        finish = start + d + overhead
        end = max(end, finish)
        heapq.heappush(free, finish)
    return end


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", default="16,64,256")
    ap.add_argument("--overhead-s", type=float, default=1.8)
    ap.add_argument("--table", type=Path, default=REPO / "pp4" / "plan" / "durations" / "exl3-1.6.5.tsv")
    args = ap.parse_args()
    rows = [line.split("\t") for line in args.table.read_text().splitlines() if line and not line.startswith("#")]
    durations = [int(ms) / 1000 for _, ms in rows]
    longest = max(durations)
    total = sum(durations)
    print(f"{len(durations)} units, {total:,.0f} CPU-s in all, the longest {longest:.0f} s "
          f"({max(rows, key=lambda r: int(r[1]))[0]}); {args.overhead_s} s per compile for sending and checking")
    print("| cores | projected cold build | bound: longest unit | bound: CPU-s / cores |")
    print("|---|---|---|---|")
    for n in (int(c) for c in args.cores.split(",")):
        print(f"| {n} | {makespan(durations, n, args.overhead_s):.0f} s | {longest + args.overhead_s:.0f} s "
              f"| {total / n:.0f} s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
