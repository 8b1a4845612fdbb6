#!/usr/bin/env python3
"""The reuse prepass at EXL3 scale on a machine that cannot compile EXL3: pp4 checkouts side by side.

An EXL3 rebuild restores 194 objects (264 with the facc objects the rule allows) whose units name
about 1,400 inputs each, nearly all the same torch headers, in a few dozen distinct combinations (the
H200 run counted 41). This bench builds that shape without a compiler: real header files from torch's
include tree as the shared inputs (NSETS overlapping sets of SHARED headers), a real source and
project headers per unit, and objects of random bytes (the prepass copies and hashes them; their
content does not change its cost). Each unit is stored through the checkout's own Reuser, exactly as
a compile would store it, then the objects are deleted and the checkout's prepass restores them all,
1 + ROUNDS times (the median of the warm runs is reported: on this shared machine single runs vary
by up to 40%).

    python bench/build/prepass_scale.py [--units 264] [--sets 41] [--shared 1400] [--rounds 5] [--against REV ...]
    python bench/build/prepass_scale.py --units 194 --variant 124 [--against REV ...]   (a variant's reuse checks)

--against REV runs the same units through pp4 at that git revision (a worktree under /tmp) in the
same run, so the figures compare like with like on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO))  # bench.common; appended: a child's PYTHONPATH names the pp4 it runs
from bench.common.checkouts import ReuseAPI, compile_section, pp4_modules, with_revisions  # noqa: E402


def child(work: Path, units: int, nsets: int, shared_n: int, object_kib: int, variant_mentions: int | None = None,
          rounds: int = 5, compile_doc: dict | None = None) -> dict:
    import torch  # noqa: F401 - only to find its headers; pp4 itself never imports it here

    m = pp4_modules()
    reuse, parse_compile = m.reuse, m.actionkey.parse_compile

    inc = Path(torch.__file__).parent / "include"
    api = inc / "torch" / "csrc" / "api" / "include"
    pool = sorted(str(p) for p in inc.rglob("*.h"))
    rnd = random.Random(7)
    rnd.shuffle(pool)
    base, spare = pool[:shared_n], pool[shared_n:]
    sets = []
    for k in range(nsets):  # overlapping sets: each swaps a few headers of the base for others
        s = list(base)
        for j in range(5):
            s[(k * 5 + j) % shared_n] = spare[(k * 5 + j) % len(spare)]
        sets.append(s)
    src = work / "src"
    (src / "include").mkdir(parents=True)
    project = []
    for j in range(40):
        p = src / "include" / f"h{j}.cuh"
        p.write_text(f"#pragma once\n#define H{j} {j}\n")
        project.append(str(p))
    # A header that names the module-name macro: units that include it cannot be shared by a variant.
    naming = src / "include" / "ext_name.h"
    naming.write_text("#pragma once\n#define EXT_NAME TORCH_EXTENSION_NAME\n")
    variant_src = work / "src-facc"
    build = work / "build"
    state = build / ".pp4"
    store = work / "store"
    config = {"limits": {"address_space": None, "cpus": None, "nice": 0, "nvcc_threads": 1, "tmpdir": str(build / "tmp")},
              "reuse": {"erasable": ["PYBIND11_STDLIB", "TORCH_EXTENSION_NAME"], "roots": [str(src), str(variant_src)],
                        "state_dir": str(state), "store": str(store),
                        "toolchain": {"bin/nvcc": "0" * 64}},
              "compile": compile_doc}
    build.mkdir()
    (build / "pp4.json").write_text(json.dumps(config))
    cfg = reuse.ReuseConfig.load(build / "pp4.json")
    env = compile_doc["env"]["cuda"]
    api = ReuseAPI(reuse, env)
    actions = []
    old = time.time() - 3600
    for p in project + [str(naming)]:
        os.utime(p, (old, old))
    reuser = reuse.Reuser(cfg)
    for i in range(units):
        unit = src / f"unit{i}.cu"
        unit.write_text(f"// unit {i}\n")
        os.utime(unit, (old, old))
        out, dep = build / "obj" / f"unit{i}.cu.o", build / "obj" / f"unit{i}.cu.o.d"
        out.parent.mkdir(exist_ok=True)
        argv = ["nvcc", "-c", str(unit), "-o", str(out), "-MD", "-MF", str(dep), "-I", str(src / "include"),
                "-isystem", str(inc), "-isystem", str(api), "-isystem", sysconfig.get_paths()["include"], "-O3", "--use_fast_math", "-std=c++17",
                "-DTORCH_EXTENSION_NAME=ext_stock", '-DPYBIND11_STDLIB="_ext_stock"']
        deps = [str(unit)] + rnd.sample(project, 8) + sets[i % nsets]
        if variant_mentions is not None and i < variant_mentions:
            deps.append(str(naming))
        dep.write_text(f"{out}: " + " \\\n  ".join(deps) + "\n")
        out.write_bytes(rnd.randbytes(object_kib * 1024))
        args = parse_compile(argv)
        stored = api.store_compile(reuser, args, time.time() + 10, 30.0)
        assert stored["action_key"], stored
        api.compiled_event(reuser, args, stored, 30.0)
        actions.append({"argv": argv, "output": str(out), "env": env})
    actions_file = build / "actions.json"
    actions_file.write_text(json.dumps({"actions": actions}))
    runs = []
    if variant_mentions is not None:
        return variant_runs(cfg, src, variant_src, actions, build, state, units, nsets, shared_n, object_kib,
                            variant_mentions, rounds)
    for _ in range(1 + rounds):  # the first is the cold one: page cache, store
        for a in actions:
            Path(a["output"]).unlink()
        stamp = state / "prepass.stamp"
        cpu0, t0 = time.process_time(), time.monotonic()
        reuse.prepass(cfg, actions_file, stamp)
        runs.append({"cpu_s": round(time.process_time() - cpu0, 3), "wall_s": round(time.monotonic() - t0, 3),
                     "restored": sum(Path(a["output"]).exists() for a in actions)})
        for a in actions:
            Path(a["output"] + reuse.MARKER_SUFFIX).unlink(missing_ok=True)
    return {"units": units, "sets": nsets, "shared_inputs": shared_n, "object_kib": object_kib, "runs": runs}


def variant_runs(cfg, src: Path, variant_src: Path, stock: list[dict], build: Path, state: Path, units: int,
                 nsets: int, shared_n: int, object_kib: int, mentions: int, rounds: int) -> dict:
    """The reuse checks of a variant build: the same units from a copy of the tree, another module
    name and pybind11 tag; the units whose inputs mention neither are restored, the others miss."""
    reuse = pp4_modules().reuse

    shutil.copytree(src, variant_src, copy_function=shutil.copy2)
    actions = []
    for a in stock:
        argv = [str(variant_src / Path(x).relative_to(src)) if x.startswith(str(src) + os.sep) else x
                for x in a["argv"]]
        argv = [x.replace("/obj/", "/obj-facc/").replace("ext_stock", "ext_facc") for x in argv]
        out = argv[argv.index("-o") + 1]
        Path(out).parent.mkdir(exist_ok=True)
        actions.append({"argv": argv, "output": out, "env": a["env"]})
    actions_file = build / "actions-facc.json"
    actions_file.write_text(json.dumps({"actions": actions}))
    runs = []
    for _ in range(1 + rounds):
        for a in actions:
            Path(a["output"]).unlink(missing_ok=True)
            Path(a["output"] + reuse.MARKER_SUFFIX).unlink(missing_ok=True)
        stamp = state / "prepass-facc.stamp"
        cpu0, t0 = time.process_time(), time.monotonic()
        reuse.prepass(cfg, actions_file, stamp)
        runs.append({"cpu_s": round(time.process_time() - cpu0, 3), "wall_s": round(time.monotonic() - t0, 3),
                     "restored": sum(Path(a["output"]).exists() for a in actions)})
    return {"units": units, "sets": nsets, "shared_inputs": shared_n, "object_kib": object_kib,
            "variant_mentions": mentions, "runs": runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--units", type=int, default=264)
    ap.add_argument("--sets", type=int, default=41)
    ap.add_argument("--shared", type=int, default=1400)
    ap.add_argument("--object-kib", type=int, default=500)
    ap.add_argument("--against", action="append", default=[], metavar="REV")
    ap.add_argument("--variant", type=int, metavar="MENTIONING",
                    help="time the reuse checks of a variant build instead: --units stock units stored, then the "
                         "same units as another variant; MENTIONING of them include a header naming the module "
                         "macro and must miss (EXL3: --units 194 --variant 124)")
    ap.add_argument("--rounds", type=int, default=5, help="warm runs per checkout after a cold one; the median is reported")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--compile-json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.units, args.sets, args.shared, args.object_kib, args.variant,
                               args.rounds, json.loads(args.compile_json))))
        return 0
    compile_json = json.dumps(compile_section())
    with with_revisions(args.against, "pp4-prepass-") as (tmp, checkouts):
        results = []
        for name, path in checkouts:
            work = tmp / f"work-{len(results)}"
            work.mkdir()
            extra = ["--variant", str(args.variant)] if args.variant is not None else []
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(work),
                                   "--units", str(args.units), "--sets", str(args.sets), "--shared", str(args.shared),
                                   "--object-kib", str(args.object_kib), "--rounds", str(args.rounds), *extra,
                                   "--compile-json", compile_json],
                                  env=dict(os.environ, PYTHONPATH=str(path)), capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{name}: {proc.stderr[-3000:]}")
            doc = json.loads(proc.stdout.strip().splitlines()[-1])
            results.append((name, doc))
        what = (f"reuse checks of a variant build: {args.units} lookups, {args.units - args.variant} of them "
                f"shareable" if args.variant is not None else f"prepass restoring {args.units} objects")
        print(f"{what} ({args.shared} shared inputs in {args.sets} sets, {args.object_kib} KiB each); median of "
              f"{args.rounds} warm runs:")

        def median(doc, key):
            return statistics.median(r[key] for r in doc["runs"][1:])

        first = median(results[0][1], "cpu_s")
        for name, doc in results:
            cpu = median(doc, "cpu_s")
            print(f"  {name:24} {cpu:7.3f} CPU-s {median(doc, 'wall_s'):7.3f} s wall, {doc['runs'][-1]['restored']} "
                  f"restored, {cpu / first:.2f}x HEAD's CPU (runs: {', '.join(str(r['cpu_s']) for r in doc['runs'][1:])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
