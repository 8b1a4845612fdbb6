#!/usr/bin/env python3
"""Compiles through a local Ray cluster against the same compiles run here, side by side.

    python bench/build/cluster_build.py [--work DIR] [--units 3] [--nodes 2] [--cpus-per-node 1] [--out FILE.json]

Two checkouts, each configured for P2P and EXL3 stock with its own empty store: one with
`--executor ray://...` against a cluster started here (Ray's cluster utilities: a head with no CPUs
for tasks and --nodes worker nodes), one without. Each builds P2P and --units short EXL3 units.
Reported: wall time, the CPU time of the build's own processes on this machine (ninja, the
wrappers, local compilers: not the nodes' compilers), where each object was compiled, the
compile time the nodes reported, and the per-compile overhead (a unit's wrapper time less its
compile time on the node). On one machine the nodes share its cores, so this measures what the
cluster costs, not what it gains.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pp4.build.events import Events  # noqa: E402
from bench.build.remote_restore import EXL3_UNITS, ninja, timed  # noqa: E402

def wrapper_rss_sampler(stop: threading.Event, peak: dict) -> None:
    """The largest resident size of one reuse wrapper (python -m pp4.reuse) seen, every 0.2 s."""
    while not stop.is_set():
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                if b"pp4.reuse" not in (p / "cmdline").read_bytes():
                    continue
                rss = next(int(line.split()[1]) for line in (p / "status").read_text().splitlines()
                           if line.startswith("VmRSS:"))
            except (OSError, StopIteration, ValueError):
                continue
            peak["kib"] = max(peak.get("kib", 0), rss)
        stop.wait(0.2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path)
    ap.add_argument("--units", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--cpus-per-node", type=int, default=1)
    ap.add_argument("--wheel-dir", type=Path, default=REPO / ".whl")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from ray.cluster_utils import Cluster

    work = args.work or Path(tempfile.mkdtemp(prefix="pp4-cluster-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    os.environ["PP4_NODE_DIR"] = str(work / "nodes")
    t0 = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(args.nodes):
        cluster.add_node(num_cpus=args.cpus_per_node)
    cluster.wait_for_nodes()
    result = {"machine": f"{os.cpu_count()} CPUs", "cluster": f"{args.nodes} nodes x {args.cpus_per_node} CPU, this machine",
              "cluster_start_s": round(time.monotonic() - t0, 2), "units": ["p2p (all)", *EXL3_UNITS[:args.units]],
              "steps": {}}
    try:
        jobs = args.nodes * args.cpus_per_node
        for name, extra in (("cluster", ["--executor", f"ray://{cluster.address}"]), ("local", [])):
            tree = work / name
            tree.mkdir()
            conf = timed([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext", "p2p", "--ext", "exl3",
                          "-j", str(jobs), "--wheel-dir", str(args.wheel_dir), "--store", str(work / f"store-{name}"),
                          *extra], tree)
            actions = json.loads((tree / "build" / "actions.json").read_text())["actions"]
            chosen = [a for a in actions if a["target"] == "p2p"]
            chosen += [a for u in EXL3_UNITS[:args.units] for a in actions
                       if a["target"] == "exl3" and a["source"].endswith("/" + u)]
            stop, peak = threading.Event(), {}
            sampler = threading.Thread(target=wrapper_rss_sampler, args=(stop, peak))
            sampler.start()
            try:
                step = timed([ninja(), "p2p", *(a["output"] for a in chosen if a["target"] == "exl3")], tree)
            finally:
                stop.set()
                sampler.join()
            known = Events(str(tree / "build" / ".pp4"))
            where, node_s = {}, 0.0
            for a in chosen:
                ev = known.get(a["output"])
                where[a["output"]] = (ev.executed_on if ev else None) or "here"
                node_s += (ev.compile_duration_s if ev else None) or 0
            result["steps"][name] = {"configure_s": conf["wall_s"], "ninja_wall_s": step["wall_s"],
                                     "ninja_cpu_s_here": step["cpu_s"], "compile_s_reported": round(node_s, 2),
                                     "wrapper_peak_rss_mib": round(peak.get("kib", 0) / 1024, 1),
                                     "compiled_on": where,
                                     "warnings": [ln for ln in step["output"].splitlines() if "warning: " in ln and "pp4" in ln]}
            print(f"{name}: ninja {step['wall_s']} s wall, {step['cpu_s']} CPU-s here; compiles {node_s:.1f} s "
                  f"as reported; on {sorted(set(where.values()))}", flush=True)
        c, loc = result["steps"]["cluster"], result["steps"]["local"]
        result["wall_ratio_cluster_over_local"] = round(c["ninja_wall_s"] / loc["ninja_wall_s"], 3)
    finally:
        cluster.shutdown()
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
