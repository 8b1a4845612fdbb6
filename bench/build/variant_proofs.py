#!/usr/bin/env python3
"""Which units of a variant the name-macro proof (pp4/reuse/variants.py) shares, and what it costs:
run the proof for every compile of TARGET in a configured build folder, in parallel, as a compile
edge would run it (its fixed root, its limits), and tabulate proven units, refusals by reason, and
the proof's seconds against the unit's compile time as the build log has it.

    python bench/build/variant_proofs.py [--build build] [--target exl3-facc] [--jobs N] [--json FILE] [--lookup]

Run it from the folder configure ran in. It compiles nothing and writes nothing into the build.
Whether a proven unit is then shared also needs the other variant's stored entry to hold (a patched
file the unit reads makes it another unit). With --lookup, after the other variant is built into
the build's store, each unit goes through the compile edge's lookup of another variant's entries
instead (those that hold now, then the proof: pp4/reuse/wrapper.py), restoring nothing and leaving
out entries of its own command: how many of TARGET's units a build would share, and why each other
one would compile."""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pp4.reuse import variants  # noqa: E402
from pp4.reuse.actionkey import parse_compile  # noqa: E402
from pp4.build.config import ReuseConfig  # noqa: E402
from pp4.reuse.wrapper import Reuser  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--target", default="exl3-facc")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--json")
    ap.add_argument("--lookup", action="store_true", help="the edge's whole lookup against the build's store")
    args = ap.parse_args()
    cfg = ReuseConfig.load(Path(args.build) / "pp4.json")
    reuser = Reuser(cfg)
    actions = [a for a in json.loads((Path(args.build) / "actions.json").read_text())["actions"]
               if a["target"] == args.target]

    def prove(a: dict) -> dict:
        compile_args = parse_compile(a["argv"])
        t0 = time.monotonic()
        if args.lookup:  # a Reuser per unit, as each compile edge has its own
            edge = Reuser(cfg)
            action = edge.action(compile_args, a["env"])
            shared = edge.lookup_variant(action) is not None
            why = None if shared else (edge.shared_refused or "no stored entry of another variant holds")
        else:
            action = reuser.action(compile_args, a["env"])
            why = variants.unproven(list(compile_args.argv), compile_args.language, action.env, cfg.name_macros,
                                    reuser.limits, cfg.runs_dir(), action.root)
        return {"output": a["output"], "proven": why is None, "why": why, "seconds": round(time.monotonic() - t0, 2)}

    t0 = time.monotonic()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(prove, actions))
    wall = time.monotonic() - t0
    proven = [r for r in results if r["proven"]]
    reasons = collections.Counter(r["why"].split(": ")[0] for r in results if not r["proven"])
    seconds = sorted(r["seconds"] for r in results)
    what = "restored from another variant's compile, proven" if args.lookup else \
        f"proven not to read {', '.join(cfg.name_macros)}"
    print(f"{args.target}: {len(proven)} of {len(results)} units {what}; "
          f"{wall:.1f} s wall on {args.jobs} jobs; a proof {seconds[len(seconds) // 2]:.2f} s median, "
          f"{seconds[-1]:.2f} s the longest")
    for why, n in reasons.most_common():
        print(f"  {n:4d}  {why}")
    if args.json:
        Path(args.json).write_text(json.dumps({"target": args.target, "wall_s": round(wall, 2), "jobs": args.jobs,
                                               "units": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
