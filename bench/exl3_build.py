#!/usr/bin/env python3
"""Build-time benchmark: pp4 against torch.utils.cpp_extension.load on exllamav3's full sources.

Each phase runs in its own process group and is timed on the wall clock, with the CPU time of its
children (user + system) beside it. Phases run in the order given, in one run on one machine, so
their ratios compare like with like:

    torch-cold    torch.utils.cpp_extension.load of exllamav3_ext, empty build directory
    pp4-cold      python configure.py && ninja exl3 (empty build directory and empty store)
    pp4-noop      ninja exl3, nothing changed
    pp4-facc      ninja exl3-facc after exl3 (reuse of stock objects); then, untimed, the certificate
                  (which builds p2p too) for the reuse counts
    pp4-audit     ninja certify (audit of all three modules)
    pp4-noop-all  ninja, everything built
    pp4-all-cold  python configure.py && ninja: p2p, stock and facc at once, empty store
    pp4-restore   rm -rf the build directory, configure, ninja (everything) with the warm store

    python bench/exl3_build.py --work DIR --cuda-home /usr/local/cuda --arch 9.0 -j 16 \
        --phases torch-cold,pp4-cold,pp4-noop,pp4-facc,pp4-audit,pp4-noop-all,pp4-restore --json OUT.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def timed(cmd: list[str], cwd: Path, env: dict, log: Path) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); see {log}")
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}


TORCH_JIT = """
import os, sys, json, time
sys.path.insert(0, {repo!r})
import torch.utils.cpp_extension as ce
from pathlib import Path
from pp4 import exl3
root = Path({root!r})
srcs = [str(root / s) for s in exl3.select_sources(root)]
t0 = time.monotonic()
ce.load(name="exllamav3_ext", sources=srcs, extra_include_paths=[str(root)],
        extra_cflags=list(exl3.CXX_FLAGS), extra_cuda_cflags=list(exl3.cuda_flags(Path({nvcc!r}))),
        build_directory={build!r}, verbose=False)
print(json.dumps({{"load_s": time.monotonic() - t0, "units": len(srcs)}}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--cuda-home", type=Path)
    ap.add_argument("--wheel-dir", type=Path)
    ap.add_argument("--arch", default="9.0")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--phases", default="pp4-cold,pp4-noop,pp4-facc,pp4-audit,pp4-restore")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = args.work.absolute()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "bench.log"
    env = dict(os.environ, PP4_CACHE_DIR=str(work / "cache"), MAX_JOBS=str(args.jobs),
               TORCH_CUDA_ARCH_LIST=args.arch, PYTHONPATH=str(REPO))
    if args.cuda_home:
        env["CUDA_HOME"] = str(args.cuda_home)
    configure = [sys.executable, str(REPO / "configure.py"), "--arch", args.arch, "--ext", "p2p", "--ext", "exl3", "--ext", "exl3-facc",
                 "-j", str(args.jobs), "--nice", "0", "--store", str(work / "store")]
    if args.cuda_home:
        configure += ["--cuda-home", str(args.cuda_home)]
    if args.wheel_dir:
        configure += ["--wheel-dir", str(args.wheel_dir.absolute())]
    from ninja import BIN_DIR

    ninja = [str(Path(BIN_DIR) / "ninja")]
    build_root = work / "pp4"
    results: dict[str, dict] = {}
    for phase in args.phases.split(","):
        print(f"== {phase}", flush=True)
        if phase == "torch-cold":
            src = work / "torch-src"
            from pp4 import exl3
            root = exl3.fetch_sources(work / "cache", src, args.wheel_dir)
            nvcc = (args.cuda_home / "bin" / "nvcc") if args.cuda_home else Path("nvcc")
            build = work / "torch-build"
            shutil.rmtree(build, ignore_errors=True)
            build.mkdir()
            code = TORCH_JIT.format(repo=str(REPO), root=str(root), nvcc=str(nvcc), build=str(build))
            results[phase] = timed([sys.executable, "-c", code], work, env, log)
            ninja_log = build / ".ninja_log"
            if ninja_log.exists():
                shutil.copy(ninja_log, work / "torch-ninja_log.txt")
        elif phase == "pp4-cold":
            shutil.rmtree(build_root, ignore_errors=True)
            shutil.rmtree(work / "store", ignore_errors=True)
            build_root.mkdir()
            results["pp4-configure"] = timed(configure, build_root, env, log)
            results[phase] = timed(ninja + ["exl3"], build_root, env, log)
            shutil.copy(build_root / "build" / ".ninja_log", work / "pp4-ninja_log.txt")
        elif phase == "pp4-all-cold":
            shutil.rmtree(build_root, ignore_errors=True)
            shutil.rmtree(work / "store", ignore_errors=True)
            build_root.mkdir()
            results["pp4-configure"] = timed(configure, build_root, env, log)
            results[phase] = timed(ninja, build_root, env, log)
            results["reuse"] = reuse_counts(build_root, env, ninja)
            shutil.copy(build_root / "build" / ".ninja_log", work / "pp4-ninja_log.txt")
        elif phase == "pp4-noop":
            results[phase] = timed(ninja + ["exl3"], build_root, env, log)
        elif phase == "pp4-noop-all":
            results[phase] = timed(ninja, build_root, env, log)
        elif phase == "pp4-facc":
            results[phase] = timed(ninja + ["exl3-facc"], build_root, env, log)
            results["facc-reuse"] = reuse_counts(build_root, env, ninja)
        elif phase == "pp4-audit":
            results[phase] = timed(ninja + ["certify"], build_root, env, log)
        elif phase == "pp4-restore":
            shutil.rmtree(build_root / "build")
            (build_root / "build.ninja").unlink()
            results["pp4-configure-again"] = timed(configure, build_root, env, log)
            results[phase] = timed(ninja, build_root, env, log)
            results["restore-reuse"] = reuse_counts(build_root, env, ninja)
        else:
            raise SystemExit(f"unknown phase {phase}")
        print(json.dumps(results), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    print("\nphase            wall s    cpu s")
    for k, v in results.items():
        if "wall_s" in v:
            print(f"{k:16} {v['wall_s']:8.1f} {v['cpu_s']:8.1f}")
    return 0


def reuse_counts(build_root: Path, env: dict, ninja: list[str]) -> dict:
    """Reused/compiled per variant, from the certificate that `ninja exl3-facc` does not write by itself."""
    subprocess.run(ninja + ["build/certificate.json.gz"], cwd=build_root, env=env, capture_output=True)
    doc = json.loads(gzip.decompress((build_root / "build" / "certificate.json.gz").read_bytes()))
    out: dict[str, dict] = {}
    for o in doc["objects"]:
        out.setdefault(o["target"], {"reused": 0, "compiled": 0})[o["status"]] += 1
    return out


if __name__ == "__main__":
    sys.exit(main())
