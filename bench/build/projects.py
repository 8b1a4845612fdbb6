#!/usr/bin/env python3
"""Public PyTorch extension projects built from their own setup.py two ways, side by side: pp4
(`configure.py --setup-py`, then ninja) and the project's setup.py under torch's BuildExtension
(`setup.py build_ext`, MAX_JOBS = the same jobs). Per project: units, wall and CPU time of each cold
build, the compile flags of each unit compared between the two, and on a GPU one op of each
project called from pp4's modules against a plain torch reference.

    python bench/build/projects.py --fetch DIR                       # the pinned sdists, from PyPI (it says how to
                                                               # make the one PyPI lacks)
    python bench/build/projects.py --sdists DIR --work DIR -j 16 [--cuda-home /usr/local/cuda] [--only NAME ...]

The sdists are pinned by sha256 and never committed. Both builds use the same nvcc (pp4's pinned
wheels, or --cuda-home for both) and the same architectures: the project's own list where its
setup.py writes one (passed to pp4 as --arch), else --arch (TORCH_CUDA_ARCH_LIST for setup.py).
The order alternates per project (pp4 first, then setup.py first), each build in a fresh folder
with an empty store.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the checkout: pp4, and bench.common for the helpers
from bench.common import accounting  # noqa: E402

PROJECTS = {
    "causal-conv1d": ("1.7.0", "causal_conv1d-1.7.0.tar.gz",
                      "3202758494eaa7b597ce1c282dfa188889506bfcb92cad3c407d26736bfcd32b"),
    "torch-scatter": ("2.1.2", "torch_scatter-2.1.2.tar.gz",
                      "69b3aa435f2424ac6a1bfb6ff702da6eb73b33ca0db38fb26989c74159258e47"),
    "torch-cluster": ("1.6.3", "torch_cluster-1.6.3.tar.gz",
                      "78d5a930a5bbd0d8788df8c6d66addd68d6dd292fe3edb401e3dacba26308152"),
    # PyPI has no sdist of 0.3.2: the tag's setup.py and package, as git 2.39 archives them.
    "exllamav2": ("0.3.2", "exllamav2-0.3.2.tar",
                  "db233bb7e812cbedeb5f9d4572d5f7de157342d62f0768ac36004917bc9583fc"),
}
# How to make the archives PyPI does not have, run in a clone of the project.
NOT_ON_PYPI = {
    "exllamav2": "git archive --prefix=exllamav2-0.3.2/ v0.3.2 setup.py exllamav2 MANIFEST.in LICENSE README.md "
                 "requirements.txt > exllamav2-0.3.2.tar  (in a clone of github.com/turboderp-org/exllamav2)",
}

# Runs setup.py build_ext under BuildExtension, keeping each extension's build.ninja (BuildExtension
# writes them all to one file, each over the last) before its ninja runs.
KEEP_NINJA = r'''
import os, runpy, shutil, sys
import torch.utils.cpp_extension as ce
keep, real, n = sys.argv[1], ce._run_ninja_build, [0]
def run(build_directory, verbose, error_prefix):
    n[0] += 1
    shutil.copy(os.path.join(build_directory, "build.ninja"), os.path.join(keep, f"{n[0]}.ninja"))
    if os.environ.get("PP4_BENCH_FLAGS_ONLY"):
        return None  # the flags are all we came for; the links that follow are made no-ops too
    return real(build_directory, verbose, error_prefix)
ce._run_ninja_build = run
if os.environ.get("PP4_BENCH_FLAGS_ONLY") or os.environ.get("PP4_BENCH_SETUP_NINJA"):
    # a project that turns ninja off: its flags through ninja's writer, or (--setup-ninja) its build at its best
    init = ce.BuildExtension.__init__
    def with_ninja(self, *args, **kwargs):
        kwargs["use_ninja"] = True
        init(self, *args, **kwargs)
    ce.BuildExtension.__init__ = with_ninja
if os.environ.get("PP4_BENCH_STRIP_GENCODE"):  # --archs-from-bench: torch's arch flags (TORCH_CUDA_ARCH_LIST) replace the project's
    sys.path.insert(0, os.environ["PP4_BENCH_STRIP_GENCODE"])  # pp4's checkout: its one scan for them
    from pp4.sources.extensions import without_architecture_flags
    cuda_extension = ce.CUDAExtension
    def CUDAExtension(*args, **kwargs):
        extra = kwargs.get("extra_compile_args")
        if isinstance(extra, dict) and "nvcc" in extra:
            kwargs["extra_compile_args"] = dict(extra, nvcc=list(without_architecture_flags(extra["nvcc"])[0]))
        return cuda_extension(*args, **kwargs)
    ce.CUDAExtension = CUDAExtension
sys.argv = ["setup.py"] + sys.argv[2:]
sys.path.insert(0, os.getcwd())
runpy.run_path("setup.py", run_name="__main__")
'''


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name, (version, filename, digest) in PROJECTS.items():
        path = dest / filename
        if not path.is_file() and name in NOT_ON_PYPI:
            print(f"{filename}: not on PyPI; make it with: {NOT_ON_PYPI[name]}")
            continue
        if not path.is_file():  # pip, so that the user's index and proxy settings apply
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            "--no-build-isolation", "-q", "-d", str(dest), f"{name}=={version}"], check=True)
        got = sha256(path)
        if got != digest:
            path.unlink()
            raise SystemExit(f"{filename}: sha256 {got}, pinned {digest}")
        print(f"{filename}: sha256 ok")


def unpack(sdist: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as t:
        t.extractall(dest, filter="data")
    (top,) = list(dest.iterdir())
    return top


def timed(cmd: list[str], cwd: Path, env: dict, log: Path) -> dict:
    print(f"[{time.strftime('%H:%M:%S')}] {shlex.join(cmd)[:160]} (in {cwd})", flush=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    accounting.reap_orphans()  # the compile server and its workers: their CPU is the build's
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} failed in {cwd}; see {log}:\n{log.read_text()[-3000:]}")
    print(f"[{time.strftime('%H:%M:%S')}] done in {wall:.1f} s", flush=True)
    return {"wall_s": round(wall, 1), "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1)}


def project_archs(src: Path, env: dict, default: list[str], cuda_args: list[str], scratch: Path) -> list[str]:
    """The architectures the project's setup.py asks for in its nvcc flags (pp4 drops them with a
    notice), as --arch values; else the default."""
    scratch.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, str(REPO / "configure.py"), "--setup-py", str(src), "--arch", default[0],
                           *cuda_args], cwd=scratch, env=env, capture_output=True, text=True)
    found = re.findall(r"compute_(\d+)(\d),code=sm_\1\2", proc.stdout)
    return sorted({f"{a}.{b}" for a, b in found}, key=lambda v: tuple(map(int, v.split(".")))) or default


def ninja_flags(text: str) -> dict:
    """{module: {"cxx": [...], "cuda": [...]}} from one BuildExtension build.ninja."""
    def var(name):
        m = re.search(rf"^{name} = (.*)$", text, re.M)
        return [a.strip("'") for a in shlex.split(m.group(1))] if m else None
    module = re.search(r"-DTORCH_EXTENSION_NAME=(\w+)", text).group(1)
    cflags, post = var("cflags") or [], var("post_cflags") or []
    cuda, cuda_post = var("cuda_cflags"), var("cuda_post_cflags")
    strip_c = lambda f: f[:-1] if f and f[-1] == "-c" else f  # noqa: E731
    return {module: {"cxx": strip_c(cflags) + post, "cuda": (strip_c(cuda) + cuda_post) if cuda is not None else None}}


def comparable(flags: list[str]) -> list[str]:
    """Flags without the ones pp4 states it sets itself: architectures and -ccbin."""
    from pp4.sources.extensions import without_architecture_flags
    from pp4.toolchain.compilers import ccbin_from_flags

    return ccbin_from_flags(list(without_architecture_flags(flags)[0]))[1]


def compare(theirs: dict, build: Path) -> list[str]:
    lines = []
    for plan_file in sorted(build.glob("*/plan.json")):
        plan = json.loads(plan_file.read_text())
        t = theirs.get(plan["module"])
        if t is None:
            lines.append(f"{plan['target']}: BuildExtension wrote no build.ninja for module {plan['module']}")
            continue
        for lang, ours in (("cxx", plan["cxx_flags"]), ("cuda", plan["cuda_flags"])):
            if lang == "cuda" and t["cuda"] is None:
                continue
            a, b = comparable(ours), comparable(t[lang])
            same = "identical" if a == b else f"DIFFER: pp4 only {[f for f in a if f not in b]}, BuildExtension only {[f for f in b if f not in a]}" + ("" if sorted(a) != sorted(b) else " (order)")
            lines.append(f"{plan['target']} {lang}: {same}")
    return lines


FAKE_LINKER = """#!/bin/sh
case " $* " in *" -o "*) exit 0;; esac
exec g++ "$@"
"""


def flags_only(name: str, sdist: Path, work: Path, cuda_home: Path | None, default_arch: list[str]) -> dict:
    """pp4's plan and BuildExtension's build.ninja for every unit, compared, without compiling."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    pdir = work / name
    src = unpack(sdist, pdir / "src")
    cuda_args = ["--cuda-home", str(cuda_home)] if cuda_home else []
    archs = project_archs(src, env, default_arch, cuda_args, pdir / "arch-probe")
    bdir = pdir / "pp4"
    bdir.mkdir()
    subprocess.run([sys.executable, str(REPO / "configure.py"), "--setup-py", str(src),
                    *sum((["--arch", a] for a in archs), []), *cuda_args], cwd=bdir, env=env, check=True,
                   capture_output=True)
    keep = pdir / "buildextension-ninja"
    keep.mkdir()
    linker = pdir / "bin" / "g++"
    linker.parent.mkdir()
    linker.write_text(FAKE_LINKER)
    linker.chmod(0o755)
    if cuda_home is None:
        from pp4.toolchain.locks import lock_for_cuda
        from pp4.toolchain.provision import provision
        from pp4.toolchain.torchenv import torch_cuda_version
        cuda_home = provision(lock_for_cuda(torch_cuda_version())).toolchain.prefix
    senv = dict(env, CUDA_HOME=str(cuda_home), TORCH_CUDA_ARCH_LIST=";".join(archs), FORCE_CUDA="1",
                PP4_BENCH_FLAGS_ONLY="1", CXX=str(linker))
    ssrc = unpack(sdist, pdir / "src-setup")
    subprocess.run([sys.executable, "-c", KEEP_NINJA, str(keep), "build_ext", "--build-temp", str(pdir / "temp"),
                    "--build-lib", str(pdir / "lib")], cwd=ssrc, env=senv, check=True, capture_output=True)
    theirs = {}
    for f in sorted(keep.glob("*.ninja")):
        text = f.read_text().replace(str(ssrc), str(src))  # the same tree, unpacked twice
        theirs.update(ninja_flags(text))
    # A relative -I is relative to setup.py's folder, where BuildExtension compiles; pp4 compiles in
    # its build folder and writes the same folder absolute (docs/specs.md lists this difference).
    for flags in theirs.values():
        for lang in ("cxx", "cuda"):
            if flags[lang] is not None:
                flags[lang] = [f"-I{src / f[2:]}" if f.startswith("-I") and len(f) > 2 and not f[2:].startswith("/")
                               else f for f in flags[lang]]
    return {"project": name, "archs": archs, "flags": compare(theirs, bdir / "build")}


# ------------------------------------------------------------------------ op checks (GPU)

def check_causal_conv1d(build: Path) -> str:
    import torch
    import torch.nn.functional as F

    from pp4.certify.loader import load_target
    m = load_target("causal_conv1d_cuda", build)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(2, 64, 128, device="cuda", generator=g)
    w = torch.randn(64, 4, device="cuda", generator=g)
    b = torch.randn(64, device="cuda", generator=g)
    out = torch.empty_like(x)
    m.causal_conv1d_fwd(x, w, b, None, None, out, None, True)
    ref = F.silu(F.conv1d(F.pad(x, (3, 0)), w.unsqueeze(1), b, groups=64))
    err = (out - ref).abs().max().item()
    return f"causal_conv1d_fwd (fp32, silu) vs torch conv1d+silu: max |diff| {err:.2e}" + (" ok" if err < 1e-4 else " FAIL")


def _load_ops(build: Path, target: str) -> None:
    import torch

    from pp4.certify.pin import check
    plan = json.loads((build / target / "plan.json").read_text())
    check(Path(plan["output_abs"]))
    torch.ops.load_library(plan["output_abs"])


def check_torch_scatter(build: Path) -> str:
    import torch
    _load_ops(build, "torch_scatter._scatter_cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    src = torch.randn(1000, 8, device="cuda", generator=g, dtype=torch.float64)
    index = torch.randint(0, 50, (1000,), device="cuda", generator=g)
    out = torch.ops.torch_scatter.scatter_sum(src, index, 0, None, 50)
    ref = torch.zeros(50, 8, device="cuda", dtype=torch.float64).index_add_(0, index, src)
    err = (out - ref).abs().max().item()
    return f"scatter_sum (fp64) vs index_add_: max |diff| {err:.2e}" + (" ok" if err < 1e-9 else " FAIL")


def check_torch_cluster(build: Path) -> str:
    import torch
    _load_ops(build, "torch_cluster._grid_cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    pos = torch.rand(500, 3, device="cuda", generator=g) * 10
    size = torch.tensor([1.5, 2.0, 2.5], device="cuda")
    out = torch.ops.torch_cluster.grid(pos, size, None, None)
    start, end = pos.min(0).values, pos.max(0).values
    voxels = ((end - start) / size).long() + 1
    stride = torch.cat([torch.ones(1, dtype=torch.long, device="cuda"), voxels.cumprod(0)[:-1]])
    ref = (((pos - start) / size).long() * stride).sum(1)
    same = torch.equal(out, ref)
    return f"grid (voxel ids of 500 points) vs torch arithmetic: {'identical ok' if same else 'FAIL'}"


def check_exllamav2(build: Path) -> str:
    import torch

    from pp4.certify.loader import load_target
    m = load_target("exllamav2_ext", build)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 4096, device="cuda", generator=g)
    w = (1 + 0.1 * torch.randn(4096, device="cuda", generator=g)).half()
    y = torch.empty_like(x)
    m.rms_norm(x, w, y, 1e-6)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    err = (y - ref).abs().max().item()
    return f"rms_norm (fp32 in and out, fp16 weight) vs torch: max |diff| {err:.2e}" + (" ok" if err < 1e-3 else " FAIL")


CHECKS = {"causal-conv1d": check_causal_conv1d, "torch-scatter": check_torch_scatter, "torch-cluster": check_torch_cluster,
          "exllamav2": check_exllamav2}


def run_project(name: str, sdist: Path, work: Path, jobs: int, cuda_home: Path | None, default_arch: list[str],
                pp4_first: bool, out: Path | None = None, pp4_only: bool = False, setup_ninja: bool = False,
                archs_from_bench: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    pdir = work / name
    src = unpack(sdist, pdir / "src-pp4")
    cuda_args = ["--cuda-home", str(cuda_home)] if cuda_home else []
    archs = default_arch if archs_from_bench else project_archs(src, env, default_arch, cuda_args, pdir / "arch-probe")
    result = {"project": name, "archs": archs}
    theirs: dict = {}

    def pp4_build():
        bdir = pdir / "pp4"
        bdir.mkdir()
        args = [sys.executable, str(REPO / "configure.py"), "--setup-py", str(src), *sum((["--arch", a] for a in archs), []),
                "-j", str(jobs), "--store", str(pdir / "pp4-store"), *cuda_args]
        conf = subprocess.run(args, cwd=bdir, env=env, capture_output=True, text=True)
        if conf.returncode != 0:
            raise SystemExit(f"configure failed for {name}:\n{conf.stdout}\n{conf.stderr}")
        (pdir / "pp4-configure.txt").write_text(conf.stdout + conf.stderr)
        result["units"] = len(json.loads((bdir / "build" / "actions.json").read_text())["actions"])
        result["cost_line"] = next((ln for ln in conf.stdout.splitlines() if "a cold build:" in ln), None)
        result["pp4"] = timed([ninja(), "-j", str(jobs)], bdir, env, pdir / "pp4-ninja.txt")

    def setup_build():
        ssrc = unpack(sdist, pdir / "src-setup")
        keep = pdir / "buildextension-ninja"
        keep.mkdir()
        senv = dict(env, MAX_JOBS=str(jobs), TORCH_CUDA_ARCH_LIST=";".join(archs), FORCE_CUDA="1")
        if setup_ninja:
            senv["PP4_BENCH_SETUP_NINJA"] = "1"
        if archs_from_bench:
            senv["PP4_BENCH_STRIP_GENCODE"] = str(REPO)
        result["archs_from"] = "--arch, for both (the project's list stripped)" if archs_from_bench else "the project"
        result["setup.py_mode"] = "use_ninja forced on" if setup_ninja else "as shipped"
        if cuda_home:
            senv["CUDA_HOME"] = str(cuda_home)
        else:
            from pp4.toolchain.locks import lock_for_cuda
            from pp4.toolchain.provision import provision
            from pp4.toolchain.torchenv import torch_cuda_version
            senv["CUDA_HOME"] = str(provision(lock_for_cuda(torch_cuda_version())).toolchain.prefix)
        result["setup.py"] = timed([sys.executable, "-c", KEEP_NINJA, str(keep), "build_ext", "--build-temp",
                                    str(pdir / "setup-temp"), "--build-lib", str(pdir / "setup-lib")], ssrc, senv,
                                   pdir / "setup-py.txt")
        for f in sorted(keep.glob("*.ninja")):
            theirs.update(ninja_flags(f.read_text()))

    steps = (pp4_build, setup_build) if pp4_first else (setup_build, pp4_build)
    for step in steps if not pp4_only else (pp4_build,):
        step()
        if out is not None:
            out.write_text(json.dumps(result, indent=1) + "\n")
    if not pp4_only:
        result["flags"] = compare(theirs, pdir / "pp4" / "build")
        result["order"] = "pp4 first" if pp4_first else "setup.py first"
        result["ratio_wall_pp4_over_setup"] = round(result["pp4"]["wall_s"] / result["setup.py"]["wall_s"], 3)
    try:
        import torch
        if torch.cuda.is_available():
            result["op_check"] = CHECKS[name](pdir / "pp4" / "build")
    except Exception as e:  # a failed check is a finding, reported, not a crash of the whole bench
        result["op_check"] = f"FAILED: {type(e).__name__}: {e}"
    return result


def ninja() -> str:
    from ninja import BIN_DIR
    binary = Path(BIN_DIR) / "ninja"
    # pip --target leaves the wheel's binary in TARGET/bin, not where BIN_DIR says.
    return str(binary) if binary.is_file() else shutil.which("ninja") or str(binary)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fetch", type=Path, metavar="DIR")
    ap.add_argument("--sdists", type=Path)
    ap.add_argument("--work", type=Path)
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--cuda-home", type=Path)
    ap.add_argument("--arch", action="append", default=[])
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--out", type=Path, help="also write the results as JSON here")
    ap.add_argument("--flags-only", action="store_true",
                    help="compare every unit's flags with BuildExtension's, compiling nothing")
    ap.add_argument("--pp4-only", action="store_true", help="only pp4's build (and the op check)")
    ap.add_argument("--setup-ninja", action="store_true",
                    help="build setup.py with BuildExtension's ninja on even where the project turns it off "
                         "(its parallel best, the strongest alternative; the default builds it as shipped)")
    ap.add_argument("--archs-from-bench", action="store_true",
                    help="both builds use --arch only: the project's own gencode list is stripped from its "
                         "setup.py's nvcc flags (a project that lists nine architectures takes minutes per unit)")
    ap.add_argument("--first", type=int, default=0, help="1: the first project builds setup.py first")
    args = ap.parse_args()
    accounting.become_subreaper()  # the builds' compile servers, reaped here and counted
    if args.fetch:
        fetch(args.fetch)
        return 0
    sys.path.insert(0, str(REPO))
    results = []
    for i, name in enumerate(args.only or PROJECTS):
        _, filename, digest = PROJECTS[name]
        sdist = args.sdists / filename
        if sha256(sdist) != digest:
            raise SystemExit(f"{sdist}: not the pinned sdist")
        if args.flags_only:
            r = flags_only(name, sdist, args.work, args.cuda_home, args.arch or ["9.0"])
            print("\n".join([f"{name} ({', '.join(r['archs'])}):", *(f"  {ln}" for ln in r["flags"])]), flush=True)
            results.append(r)
            continue
        partial = args.out.with_name(f"{args.out.stem}-{name}.json") if args.out else None
        r = run_project(name, sdist, args.work, args.jobs, args.cuda_home, args.arch or ["9.0"],
                        pp4_first=(i + args.first) % 2 == 0, out=partial, pp4_only=args.pp4_only,
                        setup_ninja=args.setup_ninja, archs_from_bench=args.archs_from_bench)
        results.append(r)
        print(json.dumps(r, indent=1), flush=True)
        if partial:
            partial.write_text(json.dumps(r, indent=1) + "\n")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    if args.pp4_only or args.flags_only:
        return 0
    print("\nproject          units  archs            pp4 wall/CPU s     setup.py wall/CPU s   pp4/setup.py wall")
    for r in results:
        print(f"{r['project']:16} {r['units']:5}  {','.join(r['archs']):16} {r['pp4']['wall_s']:7} / {r['pp4']['cpu_s']:<8} "
              f"{r['setup.py']['wall_s']:7} / {r['setup.py']['cpu_s']:<8}  {r['ratio_wall_pp4_over_setup']}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
