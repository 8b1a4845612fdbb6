#!/usr/bin/env python3
"""The audit of a full EXL3 build (both variants and P2P) at its real scale, without a compiler.

The H200 audit (`ninja certify`) checked 390 objects, 3 modules and 7,058 input files, about 1 GB of
objects and modules hashed. This bench builds that shape on disk: real header files from torch's
include tree as the shared inputs (FAMILIES different bases of SHARED headers, each varied into
overlapping input sets, 41 in all), a project tree per variant whose headers are each unit's own
inputs (the facc tree is a copy of stock's, elsewhere, as in the real build), objects of random
bytes with sizes spread like compiled objects (log-normal, median --object-kib), and each module
a file as big as its objects together (random bytes too: the audit only hashes them). Every unit is
stored through pp4's own Reuser, exactly as a compile stores it, the certificate and build record are
written by pp4.certify.certificate, and pins by pp4.certify.pin. Then `python -m pp4.certify.audit` of each checkout runs on
the same files, alternately, ROUNDS times after one warm-up run; the CPU figure is the audit
process's own (user + system, Python start-up included), as `ninja certify` would spend it.

    python bench/build/audit_scale.py [--units 194] [--sets 41] [--families 4] [--shared 1400]
                                [--object-kib 700] [--rounds 3] [--against REV ...]

--against REV audits the same build with pp4 at that git revision (a worktree under /tmp): the
certificate format must be one both read (a revision before the compile environment was keyed reads
the newer certificate and ignores what it does not know: it audits less, at its own cost).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO))  # bench.common; appended: a child's PYTHONPATH names the pp4 it runs
from bench.common.checkouts import ReuseAPI, compile_section, pp4_modules, with_revisions  # noqa: E402


def make_build(work: Path, units: int, nsets: int, families: int, shared_n: int, object_kib: int,
               reused: int = 70) -> dict:
    import torch  # noqa: F401 - only to find its headers

    m = pp4_modules()
    certificate, pin, reuse, parse_compile = m.certificate, m.pin, m.reuse, m.actionkey.parse_compile

    inc = Path(torch.__file__).parent / "include"
    pool = sorted(str(p) for p in inc.rglob("*.h"))
    rnd = random.Random(11)
    rnd.shuffle(pool)
    sets = []
    for k in range(nsets):  # FAMILIES bases (C++ units and CUDA units include different headers)
        fam = k % families
        base = pool[fam * shared_n:(fam + 1) * shared_n]
        spare = pool[families * shared_n:]
        s = list(base)
        for j in range(5):  # and each set of a family swaps a few of its headers for others
            s[(k * 5 + j) % shared_n] = spare[(k * 5 + j) % len(spare)]
        sets.append(s)
    build = work / "build"
    state = build / ".pp4"
    store = work / "store"
    stock_root = work / "exllamav3"
    tree_headers = []
    for j in range(200):  # a project tree: headers of EXL3-like sizes
        p = stock_root / "include" / f"h{j}.cuh"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"#pragma once\n// header {j}\n" + "// " + "x" * 77 + "\n" * (20 + j % 300))
        tree_headers.append(p.relative_to(stock_root))
    for j in range(units):
        (stock_root / "src").mkdir(exist_ok=True)
        (stock_root / "src" / f"unit{j}.cu").write_text(f"// unit {j}\n" * 50)
    facc_root = work / "exllamav3-facc"
    shutil.copytree(stock_root, facc_root)
    for j in range(reused, units):  # the patched units; the first REUSED are shared with stock
        (facc_root / "src" / f"unit{j}.cu").write_text(f"// unit {j}, patched\n" * 50)
    p2p_root = work / "p2p"
    (p2p_root / "src").mkdir(parents=True)
    for j in range(2):
        (p2p_root / "src" / f"p2p{j}.cu").write_text(f"// p2p {j}\n")
    old = time.time() - 3600
    for root in (stock_root, facc_root, p2p_root):
        for p in root.rglob("*"):
            os.utime(p, (old, old))
    targets = [("exl3", stock_root, units), ("exl3-facc", facc_root, units), ("p2p", p2p_root, 2)]
    config = {"limits": {"address_space": None, "cpus": None, "nice": 0, "nvcc_threads": 1, "tmpdir": str(build / "tmp")},
              "reuse": {"erasable": ["PYBIND11_STDLIB", "TORCH_EXTENSION_NAME"],
                        "roots": [str(r) for _, r, _ in targets], "state_dir": str(state), "store": str(store),
                        "toolchain": {"bin/nvcc": "0" * 64}},
              "compile": compile_section()}
    build.mkdir()
    (build / "pp4.json").write_text(json.dumps(config))
    cfg = reuse.ReuseConfig.load(build / "pp4.json")
    reuser = reuse.Reuser(cfg)
    env = config["compile"]["env"]["cuda"]
    api = ReuseAPI(reuse, env)
    actions = []
    sizes = [max(50, min(12_000, int(rnd.lognormvariate(0, 0.9) * object_kib))) for _ in range(units)]
    total = n_reused = 0
    for target, root, n in targets:
        tdir = build / target
        (tdir / "obj").mkdir(parents=True)
        objs = []
        for i in range(n):
            unit = root / "src" / (f"unit{i}.cu" if target != "p2p" else f"p2p{i}.cu")
            out, dep = tdir / "obj" / f"{unit.name}.o", tdir / "obj" / f"{unit.name}.o.d"
            argv = ["nvcc", "-c", str(unit), "-o", str(out), "-MD", "-MF", str(dep), "-I", str(root / "include"),
                    "-isystem", str(inc), "-O3", f"-DTORCH_EXTENSION_NAME={target.replace('-', '_')}"]
            own = [str(root / h) for h in random.Random(i).sample(tree_headers, 30)] if target != "p2p" else []
            dep.write_text(f"{out}: " + " \\\n  ".join([str(unit)] + own + sets[i % nsets]) + "\n")
            kib = sizes[i] if target != "p2p" else 60
            total += kib * 1024
            args = parse_compile(argv)
            hit = api.lookup(reuser, args)
            if hit is not None:  # a facc unit its stock twin's object serves, as in the real build
                assert reuser.materialize(hit, args)
                n_reused += 1
                api.hit_event(reuser, args, hit, 0.01, via="prepass")
            else:
                out.write_bytes(rnd.randbytes(kib * 1024))
                stored = api.store_compile(reuser, args, time.time() + 10, 30.0)
                assert stored["action_key"], stored
                api.compiled_event(reuser, args, stored, 30.0)
            actions.append({"argv": argv, "output": str(out), "target": target, "source": str(unit), "env": env})
            objs.append(out)
        module = tdir / f"pp4_{target.replace('-', '_')}.so"
        with open(module, "wb") as f:  # a link is about as big as its objects together
            for o in objs:
                f.write(rnd.randbytes(o.stat().st_size))
        total += module.stat().st_size
        # the link's dependency file, as pp4's launcher writes it (a revision before it ignores it)
        Path(str(module) + ".d").write_text(f"{module}: " + " ".join(str(o) for o in objs) + "\n")
        plan = {"target": target, "objects": [str(o) for o in objs], "output_abs": str(module.absolute()),
                "output": str(module), "module": module.stem, "root": str(root), "provenance": {},
                "sources": [a["source"] for a in actions if a["target"] == target],
                "cuda_flags": ["-O3"], "cxx_flags": ["-O3"], "link_flags": [],
                "toolchain": {"prefix": str(work / "no-toolchain")}}
        (tdir / "plan.json").write_text(json.dumps(plan))
        pin.write(tdir / "plan.json", module, pin.pin_path_for(module))
    actions_file = build / "actions.json"
    actions_file.write_text(json.dumps({"actions": actions}))
    certificate.write(build / "pp4.json", actions_file, build / "certificate.json.gz")
    files = {p for s in sets for p in s} | {a["source"] for a in actions}
    files |= {str(r / h) for _, r, _ in targets[:2] for h in tree_headers}
    return {"objects": len(actions), "reused": n_reused,
            "modules": len(targets), "input_files": len(files),
            "bytes_objects_and_modules": total}


def audit_once(checkout: Path, work: Path) -> tuple[float, float, str]:
    """(CPU-s of the audit process, wall s, its summary line)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    # Compiled modules cached as an installed pp4's are (this machine sets PYTHONDONTWRITEBYTECODE,
    # which would add 60-90 ms of compiling pp4's sources to every run), outside the checkouts.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(checkout), PYTHONPYCACHEPREFIX=str(work.parent / f"pyc-{checkout.name}"))
    proc = subprocess.run([sys.executable, "-m", "pp4.certify.audit", "build/certificate.json.gz"], cwd=work,
                          env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"audit with {checkout} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    line = next((ln.strip() for ln in proc.stdout.splitlines() if "files hashed" in ln), "")
    return cpu, wall, line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--units", type=int, default=194, help="units per EXL3 variant")
    ap.add_argument("--sets", type=int, default=41)
    ap.add_argument("--families", type=int, default=4)
    ap.add_argument("--shared", type=int, default=1400)
    ap.add_argument("--object-kib", type=int, default=700, help="median object size")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", action="append", default=[], metavar="REV")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(make_build(args.child, args.units, args.sets, args.families, args.shared, args.object_kib)))
        return 0
    with with_revisions(args.against, "pp4-audit-") as (tmp, checkouts):
        work = tmp / "work"
        work.mkdir()
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(work),
                               "--units", str(args.units), "--sets", str(args.sets), "--families", str(args.families),
                               "--shared", str(args.shared), "--object-kib", str(args.object_kib)],
                              env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-3000:])
        shape = json.loads(proc.stdout.strip().splitlines()[-1])
        for _, path in checkouts:  # warm-up: page cache, .pyc files
            audit_once(path, work)
        runs: dict[str, list[tuple[float, float, str]]] = {name: [] for name, _ in checkouts}
        for _ in range(args.rounds):
            for name, path in checkouts:
                runs[name].append(audit_once(path, work))
        print(f"audit of {shape['objects']} objects ({shape['reused']} reused), {shape['modules']} modules, {shape['input_files']} input files, "
              f"{shape['bytes_objects_and_modules'] / 1e9:.2f} GB of objects and modules; median of {args.rounds} "
              f"warm runs, CPU of the audit process (start-up included):")
        first = statistics.median(c for c, _, _ in runs[checkouts[0][0]])
        for name, _ in checkouts:
            cpu = statistics.median(c for c, _, _ in runs[name])
            wall = statistics.median(w for _, w, _ in runs[name])
            print(f"  {name:24} {cpu:7.3f} CPU-s {wall:7.3f} s wall (runs: "
                  f"{', '.join(f'{c:.3f}' for c, _, _ in runs[name])}), {cpu / first:.2f}x HEAD's CPU")
            print(f"  {'':24} {runs[name][-1][2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
