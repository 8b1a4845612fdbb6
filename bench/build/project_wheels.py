#!/usr/bin/env python3
"""A setup.py project's own wheel made two ways, side by side: `pip wheel --no-build-isolation
--no-deps` (the project's setup.py under torch's BuildExtension) and pp4 (`configure.py --setup-py`,
then `ninja wheel`, which builds the modules and the wheel: pp4/wheel/project.py). Per project it measures each build's wall and CPU
time (children's user + system seconds), then compares the two wheels and what they do:

  - the wheel file names;
  - the file lists (pp4 adds two files to the .dist-info: pp4-certificate.json.gz and
    pp4-build-record.json);
  - every file that is not a compiled module, byte for byte, except RECORD and METADATA;
  - METADATA, apart from the one line pp4 adds (`Requires-Dist: torch==<the build's torch>`);
  - each wheel's RECORD against the wheel's own files;
  - the compiled modules, by import path (a.b._C, whatever the file's suffix);
  - installed (`pip install --no-deps --target`) into two folders: in fresh Pythons (PYTHONPATH=
    that folder, run from outside the project) every compiled module is loaded, and CPU ops of the
    project run on the same inputs; their outputs must be equal exactly (torch.equal).

There is no GPU on the machine this was written for: the checks call CPU ops only (the CUDA
modules are built and loaded, not run). Both builds use pp4's pinned nvcc (CUDA_HOME, and first on
PATH), the same architecture (TORCH_CUDA_ARCH_LIST / --arch) and the same jobs (MAX_JOBS / -j).
pp4 builds with an empty store of its own, so nothing is reused. The order alternates per project:
pp4 first for the first project, pip first for the next, and so on.

    export PP4_CACHE_DIR=/work/main/.pp4-cache        # where pp4's pinned toolchain is
    python bench/build/project_wheels.py --sdists DIR --work DIR --out docs/results/project-wheels-DATE \\
        [-j 2] [--arch 9.0] [--only NAME ...] [--first pip]

The sdists are pinned by sha256 (PROJECTS) and fetched from PyPI into --sdists when missing. --out
gets project-wheels.json (every figure) and project-wheels.md (the table); --work gets the
unpacked sources, builds, wheels, installs and one log per step.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.machinery
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: pp4, and bench.common for the helpers
from bench.build import projects  # noqa: E402  (sha256, unpack, timed, ninja)
from bench.common import accounting  # noqa: E402  (the compile server's CPU counted)

REPO = Path(__file__).resolve().parents[2]

# name: (version, sdist file, sha256). Chosen small: a few compile units each, minutes on 2 cores.
PROJECTS = {
    # two modules: isotonic_cpu (C++) and isotonic_cuda (declared only where `nvcc` is on PATH)
    "torchsort": ("0.1.10", "torchsort-0.1.10.tar.gz",
                  "416a7dd2ab88332b27e98318d7fb2e0243b9fb6f1fffcf77760d63103d70dd04"),
    # six torch op libraries (_basis/_weighting/_version, each _cpu and _cuda); BuildExtension
    # .with_options(no_python_abi_suffix=True, use_ninja=False)
    "torch-spline-conv": ("1.2.2", "torch_spline_conv-1.2.2.tar.gz",
                          "ed45a81da29f774665dbdd4709d7e534cdf16d2e7006dbd06957f35bd09661b2"),
    # one top-level module (torch_lfilter_cpp) declared as a plain setuptools Extension with torch's
    # include and library paths, built by BuildExtension; C++ only
    "torch-lfilter": ("0.0.3", "torch_lfilter-0.0.3.tar.gz",
                      "aa613725b73e7b6e7efd63c30580a906d7bb23206b5d045b8452ab770f7a50df"),
}

# Candidates tried and left out: their own setup.py does not build under pip with this torch.
REJECTED = {
    "chamferdist 1.0.3 (sha256 ac9d3a723329d230bcdd5ee8a01f13632ebae31b2ae221116579637ed57a4567)":
        "its setup.py passes -std=c++17 for cxx; torch 2.14's headers need C++20 (`#error C++20 or later "
        "compatible compiler is required to use PyTorch`): pip wheel and pp4's ninja both fail the same way",
    "torch-bessel 0.0.10": "its setup.py passes -std=c++17 too (left out on reading it, not built)",
}

PP4_EXTRA = {"pp4-certificate.json.gz", "pp4-build-record.json"}  # in the .dist-info

# ------------------------------------------------------------------------ the CPU op checks
#
# Each runs in a fresh Python with PYTHONPATH = one install folder; OUT is the file to write.
# `outputs` (name -> tensor) is saved with torch.save and compared between the two installs;
# `loaded_from` names a file of the project it imported, to show which folder it came from.

OPS = {
    "torchsort": r'''
import torch, torchsort
g = torch.Generator().manual_seed(0)
x = torch.randn(6, 50, generator=g, dtype=torch.float64, requires_grad=True)
y = torch.randn(4, 33, generator=g, dtype=torch.float32)
outputs = {}
for reg in ("l2", "kl"):
    for strength in (0.1, 1.0):
        outputs[f"soft_sort_{reg}_{strength}"] = torchsort.soft_sort(y, regularization=reg, regularization_strength=strength)
        outputs[f"soft_rank_{reg}_{strength}"] = torchsort.soft_rank(y, regularization=reg, regularization_strength=strength)
r = torchsort.soft_rank(x, regularization_strength=0.5)
(r * torch.arange(50, dtype=torch.float64)).sum().backward()  # the isotonic backward ops
outputs["soft_rank_fp64"] = r.detach()
outputs["soft_rank_fp64_grad"] = x.grad
loaded_from = torchsort.ops.__file__
''',
    "torch-spline-conv": r'''
import torch, torch_spline_conv
from torch_spline_conv import spline_basis, spline_conv, spline_weighting
g = torch.Generator().manual_seed(0)
N, E, c_in, c_out = 60, 400, 4, 3
x = torch.randn(N, c_in, generator=g, dtype=torch.float64)
edge_index = torch.randint(0, N, (2, E), generator=g)
pseudo = torch.rand(E, 2, generator=g, dtype=torch.float64)
kernel_size = torch.tensor([5, 5])
is_open_spline = torch.tensor([1, 0], dtype=torch.uint8)
weight = torch.randn(25, c_in, c_out, generator=g, dtype=torch.float64)
root = torch.randn(c_in, c_out, generator=g, dtype=torch.float64)
bias = torch.randn(c_out, generator=g, dtype=torch.float64)
outputs = {}
for degree in (1, 2, 3):
    basis, index = spline_basis(pseudo, kernel_size, is_open_spline, degree)
    outputs[f"basis_{degree}"], outputs[f"weight_index_{degree}"] = basis, index
    outputs[f"weighting_{degree}"] = spline_weighting(x[edge_index[1]], weight, basis, index)
    outputs[f"conv_{degree}"] = spline_conv(x, edge_index, pseudo, weight, kernel_size, is_open_spline, degree,
                                            True, root, bias)
outputs["cuda_version"] = torch.tensor(torch.ops.torch_spline_conv.cuda_version())
loaded_from = torch_spline_conv.__file__
''',
    "torch-lfilter": r'''
import torch, torch_lfilter
# torch_lfilter falls back to Python, with a warning, where its C++ module does not import
assert torch_lfilter._lfilter_cpu_forward is not None, "torch_lfilter_cpp did not import"
g = torch.Generator().manual_seed(0)
b = torch.tensor([0.2, 0.3, 0.1, -0.05], dtype=torch.float64)
a = torch.tensor([1.0, -0.5, 0.25, 0.1], dtype=torch.float64)
x = torch.randn(500, 8, generator=g, dtype=torch.float64, requires_grad=True)
y = torch_lfilter.lfilter(b, a, x)
(y * torch.linspace(0, 1, 500, dtype=torch.float64)[:, None]).sum().backward()  # _lfilter_cpu_backward
outputs = {"lfilter": y.detach(), "lfilter_grad": x.grad}
loaded_from = torch_lfilter.__file__
''',
}

OP_EPILOGUE = r'''
import json, sys
torch.save({k: v.detach().cpu() for k, v in outputs.items()}, OUT)
json.dump({"loaded_from": loaded_from}, open(OUT + ".json", "w"))
'''

# Loads one compiled module by its file, in a fresh Python, without importing its package (whose
# __init__ may load a sibling that registers the same torch ops): as a Python module where it is
# one (PyInit_NAME), else as a torch op library (TORCH_LIBRARY / RegisterOperators, no PyInit).
LOAD_MODULE = r'''
import importlib.util, json, sys
import torch
name, path = sys.argv[1], sys.argv[2]
try:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    how = f"imported as a Python module ({len([a for a in dir(module) if not a.startswith('_')])} names)"
except ImportError as e:
    if "module export function" not in str(e):
        raise
    torch.ops.load_library(path)
    how = "no PyInit: loaded with torch.ops.load_library"
print(json.dumps({"module": name, "how": how}))
'''


# ------------------------------------------------------------------------ the bench

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--sdists", type=Path, required=True, help="the pinned sdists (fetched here when missing)")
    ap.add_argument("--work", type=Path, required=True, help="scratch: sources, builds, wheels, installs, logs")
    ap.add_argument("--out", type=Path, required=True, help="where project-wheels.json and .md go")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="MAX_JOBS for pip, -j for pp4 (default: 2)")
    ap.add_argument("--arch", default="9.0", help="TORCH_CUDA_ARCH_LIST for pip, --arch for pp4 (default: 9.0)")
    ap.add_argument("--cuda-home", type=Path, help="the CUDA toolkit both builds use (default: pp4's pinned "
                    "toolchain, $PP4_CACHE_DIR/toolchains/cuda-<torch's CUDA>-*/)")
    ap.add_argument("--only", action="append", default=[], choices=sorted(PROJECTS))
    ap.add_argument("--first", choices=("pp4", "pip"), default="pp4", help="which builds first for the first "
                    "project (then they alternate)")
    ap.add_argument("--pairs", type=int, default=1, help="timed pairs per project, the order swapped each time; "
                    "the table gives the median ratio and the range (default: 1)")
    args = ap.parse_args()

    if args.pairs < 1:
        ap.error("--pairs: at least 1")
    args.work = args.work.resolve()
    accounting.become_subreaper()  # the builds' compile servers, reaped in projects.timed and counted
    args.out.mkdir(parents=True, exist_ok=True)
    cuda_home = args.cuda_home or pinned_toolchain()
    env = build_env(cuda_home, args.jobs, args.arch)
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine(cuda_home),
               "jobs": args.jobs, "arch": args.arch, "cuda_home": str(cuda_home), "rejected": REJECTED,
               "projects": []}
    names = args.only or list(PROJECTS)
    for i, name in enumerate(names):
        sdist = fetch(name, args.sdists)
        pp4_first = (i % 2 == 0) == (args.first == "pp4")
        results["projects"].append(run_project(name, sdist, args.work / name, env, args, pp4_first))
        write(results, args.out)  # after each project, so a late failure keeps the earlier ones
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write(results, args.out)
    print((args.out / "project-wheels.md").read_text())
    return 0


def pinned_toolchain() -> Path:
    """pp4's provisioned toolchain for torch's CUDA release: the cache's cuda-X.Y-*/ with bin/nvcc."""
    import torch
    cache = Path(os.environ.get("PP4_CACHE_DIR") or Path.home() / ".cache" / "pp4")
    found = sorted(Path(p).parent.parent for p in
                   glob.glob(str(cache / "toolchains" / f"cuda-{torch.version.cuda}-*" / "bin" / "nvcc")))
    if len(found) != 1:
        raise SystemExit(f"expected one pp4 toolchain for CUDA {torch.version.cuda} under {cache}/toolchains, "
                         f"found {[str(f) for f in found]}: run configure.py once, or pass --cuda-home")
    return found[0]


def build_env(cuda_home: Path, jobs: int, arch: str) -> dict:
    """The environment of both builds. nvcc first on PATH too: torchsort's setup.py declares its
    CUDA module only where `nvcc` runs."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(MAX_JOBS=str(jobs), TORCH_CUDA_ARCH_LIST=arch, FORCE_CUDA="1", CUDA_HOME=str(cuda_home),
               PATH=f"{cuda_home / 'bin'}{os.pathsep}{env.get('PATH', '')}", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def machine(cuda_home: Path) -> dict:
    import setuptools
    import torch
    nvcc = subprocess.run([str(cuda_home / "bin" / "nvcc"), "--version"], capture_output=True, text=True).stdout
    pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True).stdout.split()
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "setuptools": setuptools.__version__, "pip": pip[1] if len(pip) > 1 else None,
            "nvcc": nvcc.strip().splitlines()[-1] if nvcc else None,
            "pp4_at_start": pp4_state()}


def pp4_state() -> str:
    """pp4's commit, and a digest of its uncommitted changes to tracked files (the checkout may change
    while the bench runs: each project records the state its pp4 build started from)."""
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    diff = subprocess.run(["git", "-C", str(REPO), "diff", "HEAD"], capture_output=True).stdout
    return head + (f"+diff:{hashlib.sha256(diff).hexdigest()[:12]}" if diff else "")


def fetch(name: str, dest: Path) -> Path:
    """The pinned sdist, from PyPI through pip when it is not in dest yet; its sha256 checked."""
    version, filename, digest = PROJECTS[name]
    path = dest / filename
    if not path.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "--no-build-isolation", "-q", "-d", str(dest), f"{name}=={version}"], check=True)
    got = projects.sha256(path)
    if got != digest:
        raise SystemExit(f"{path}: sha256 {got}, pinned {digest}")
    return path


def run_project(name: str, sdist: Path, pdir: Path, env: dict, args, pp4_first: bool) -> dict:
    """The first pair builds, compares and runs both wheels; each further pair (--pairs) only times
    both builds again, from fresh sources and folders, the order swapped each time."""
    version = PROJECTS[name][0]
    result = {"project": name, "version": version, "sdist": sdist.name, "sha256": PROJECTS[name][2],
              "order": "pp4 first" if pp4_first else "pip first", "pairs": []}
    for k in range(args.pairs):
        first = pp4_first if k % 2 == 0 else not pp4_first
        print(f"\n===== {name} {version}, pair {k + 1} of {args.pairs} ({'pp4' if first else 'pip'} first)", flush=True)
        pair = timed_pair(sdist, pdir if k == 0 else pdir / f"pair-{k + 1}", env, args, first)
        if k == 0:
            result.update({key: pair[key] for key in ("pip", "pp4", "pp4_state", "failures") if key in pair})
        if "failures" in pair or not (pair.get("pip", {}).get("wheel") and pair.get("pp4", {}).get("wheel")):
            result.setdefault("failures", pair.get("failures", ["a build made no wheel"]))
            return result
        result["pairs"].append({"order": "pp4 first" if first else "pip first", "pp4_state": pair["pp4_state"],
                                "pip": {k2: pair["pip"][k2] for k2 in ("wall_s", "cpu_s")},
                                "pp4": {s: pair["pp4"][s] for s in ("configure", "ninja_wheel", "total")},
                                "ratio_wall": round(pair["pp4"]["total"]["wall_s"] / pair["pip"]["wall_s"], 3),
                                "ratio_cpu": round(pair["pp4"]["total"]["cpu_s"] / pair["pip"]["cpu_s"], 3)})
    for what in ("wall", "cpu"):
        ratios = sorted(p[f"ratio_{what}"] for p in result["pairs"])
        result[f"ratio_{what}_pp4_over_pip"] = round(statistics.median(ratios), 3)
        result[f"ratio_{what}_range"] = [ratios[0], ratios[-1]]
    pip_whl, pp4_whl = Path(result["pip"]["wheel"]), Path(result["pp4"]["wheel"])
    result["compare"] = compare_wheels(pip_whl, pp4_whl)
    try:
        result["run"] = compare_installed(name, pip_whl, pp4_whl, pdir, env, pdir / "logs")
    except SystemExit as e:  # an install that failed
        result["run"] = {"ops_equal": False, "modules_all_loaded": False, "error": str(e)}
    print(json.dumps({k: result[k] for k in ("compare", "run")}, indent=1)[:6000], flush=True)
    return result


def timed_pair(sdist: Path, pdir: Path, env: dict, args, pp4_first: bool) -> dict:
    """Both builds of one project, each from its own freshly unpacked sources, in the order given."""
    logs = pdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    pip_src = projects.unpack(sdist, pdir / "src-pip")
    pp4_src = projects.unpack(sdist, pdir / "src-pp4")
    pair: dict = {}

    def pip_build():
        pair["pip"] = pip_wheel(pip_src, pdir / "pip-dist", env, logs)

    def pp4_build():
        pair["pp4_state"] = pp4_state()
        pair["pp4"] = pp4_wheel(pp4_src, pdir / "pp4", env, args.jobs, args.arch, logs)

    for step in (pp4_build, pip_build) if pp4_first else (pip_build, pp4_build):
        try:
            step()
        except SystemExit as e:  # projects.timed's failure: the command, its log's tail
            pair.setdefault("failures", []).append(str(e))
            print(f"FAILED: {str(e)[:2000]}", flush=True)
    return pair


def pip_wheel(src: Path, dist: Path, env: dict, logs: Path) -> dict:
    """`pip wheel --no-build-isolation --no-deps -w dist src`, timed."""
    dist.mkdir(parents=True, exist_ok=True)
    t = projects.timed([sys.executable, "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps",
                        "-w", str(dist), str(src)], src.parent, env, logs / "pip-wheel.txt")
    return dict(t, wheel=str(one_wheel(dist)))


def pp4_wheel(src: Path, bdir: Path, env: dict, jobs: int, arch: str, logs: Path) -> dict:
    """configure.py --setup-py and ninja wheel (the modules and the wheel, as pip wheel makes both) in a
    fresh folder with a fresh store: each timed."""
    bdir.mkdir(parents=True)
    ninja = projects.ninja()
    steps = {
        "configure": [sys.executable, str(REPO / "configure.py"), "--setup-py", str(src), "--arch", arch,
                      "-j", str(jobs), "--store", str(bdir.parent / "pp4-store")],
        "ninja_wheel": [ninja, "wheel"],
    }
    out = {name: projects.timed(cmd, bdir, env, logs / f"pp4-{name}.txt") for name, cmd in steps.items()}
    out["total"] = {k: round(sum(out[s][k] for s in steps), 1) for k in ("wall_s", "cpu_s")}
    out["units"] = len(json.loads((bdir / "build" / "actions.json").read_text())["actions"])
    configure_log = (logs / "pp4-configure.txt").read_text()
    out["configure_notices"] = [ln for ln in configure_log.splitlines() if "not followed" in ln or "drop" in ln]
    out["wheel"] = str(one_wheel(bdir / "dist"))
    return out


def one_wheel(dist: Path) -> Path:
    wheels = sorted(dist.glob("*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"{dist}: expected one wheel, found {[w.name for w in wheels]}")
    return wheels[0]


# ------------------------------------------------------------------------ the wheels compared

def compare_wheels(pip_whl: Path, pp4_whl: Path) -> dict:
    a, b = read_wheel(pip_whl), read_wheel(pp4_whl)
    dist_info = next(n.split("/")[0] for n in a if n.split("/")[0].endswith(".dist-info"))
    extra = {f"{dist_info}/{f}" for f in PP4_EXTRA}
    out = {"pip_wheel": pip_whl.name, "pp4_wheel": pp4_whl.name, "same_wheel_name": pip_whl.name == pp4_whl.name,
           "pp4_extra_files_present": sorted(extra & set(b)) == sorted(extra)}
    pp4_files = set(b) - extra
    out["same_file_list"] = set(a) == pp4_files
    out["only_pip"], out["only_pp4"] = sorted(set(a) - pp4_files), sorted(pp4_files - set(a))

    modules_a, modules_b = compiled_modules(a), compiled_modules(b)
    out["modules"] = {m: {"pip": modules_a.get(m), "pp4": modules_b.get(m)} for m in sorted({*modules_a, *modules_b})}
    out["same_module_import_paths"] = set(modules_a) == set(modules_b)
    out["same_file_list_but_module_file_names"] = (
        out["same_module_import_paths"] and set(a) - set(modules_a.values()) == pp4_files - set(modules_b.values()))
    out["modules_byte_equal"] = {m: a[p["pip"]] == b[p["pp4"]] for m, p in out["modules"].items()
                                 if p["pip"] and p["pp4"]}

    modes_a, modes_b = wheel_modes(pip_whl), wheel_modes(pp4_whl)
    out["modes_differing"] = {n: {"pip": oct(modes_a[n]), "pp4": oct(modes_b[n])}
                              for n in sorted(set(modes_a) & set(modes_b)) if modes_a[n] != modes_b[n]}
    # a compiled module by import path: its file names may differ (no_python_abi_suffix)
    out["module_modes_differing"] = {m: {"pip": oct(modes_a[p["pip"]]), "pp4": oct(modes_b[p["pp4"]])}
                                     for m, p in out["modules"].items()
                                     if p["pip"] and p["pp4"] and modes_a[p["pip"]] != modes_b[p["pp4"]]}

    record, metadata = f"{dist_info}/RECORD", f"{dist_info}/METADATA"
    skip = {record, metadata, *modules_a.values(), *modules_b.values()}
    out["other_files_differing"] = sorted(n for n in set(a) & pp4_files - skip if a[n] != b[n])
    out["other_files_byte_equal"] = not out["other_files_differing"] and not (set(a) ^ pp4_files) - skip
    out["metadata"] = compare_metadata(a.get(metadata, b""), b.get(metadata, b""))
    out["record_consistent"] = {"pip": record_problems(a, record), "pp4": record_problems(b, record)}
    return out


def read_wheel(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist() if not i.is_dir()}


def wheel_modes(path: Path) -> dict[str, int]:
    """Each file's permission bits as the zip stores them (what pip sets on install)."""
    with zipfile.ZipFile(path) as z:
        return {i.filename: (i.external_attr >> 16) & 0o777 for i in z.infolist() if not i.is_dir()}


def compiled_modules(files: dict) -> dict[str, str]:
    """import path (a.b._C) -> file in the wheel, for each compiled module."""
    modules = {}
    for name in files:
        for suffix in sorted(importlib.machinery.EXTENSION_SUFFIXES, key=len, reverse=True):
            if name.endswith(suffix):
                modules[name[: -len(suffix)].replace("/", ".")] = name
                break
    return modules


def compare_metadata(pip_meta: bytes, pp4_meta: bytes) -> dict:
    a, b = pip_meta.decode().splitlines(), pp4_meta.decode().splitlines()
    added = [ln for ln in b if ln.startswith("Requires-Dist: torch==")]
    rest = list(b)
    for ln in added[:1]:
        rest.remove(ln)
    return {"pp4_torch_pin": added, "equal_apart_from_the_pin": len(added) == 1 and rest == a,
            "diff": [f"- {ln}" for ln in a if ln not in rest] + [f"+ {ln}" for ln in rest if ln not in a]}


def record_problems(files: dict, record: str) -> list[str]:
    """What the wheel's RECORD gets wrong about its files (empty: every file listed, every hash right)."""
    import base64
    problems, listed = [], set()
    for line in files[record].decode().splitlines():
        path, digest, _size = line.rsplit(",", 2)
        listed.add(path)
        if path == record:
            continue
        if path not in files:
            problems.append(f"{path}: listed, not in the wheel")
        elif digest != "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(files[path]).digest()).rstrip(b"=").decode():
            problems.append(f"{path}: hash differs")
    problems += [f"{p}: in the wheel, not listed" for p in sorted(set(files) - listed)]
    return problems


# ------------------------------------------------------------------------ the wheels installed and run

def compare_installed(name: str, pip_whl: Path, pp4_whl: Path, pdir: Path, env: dict, logs: Path) -> dict:
    """Each wheel into its own folder; every module loaded and the CPU ops run from each, compared."""
    import torch
    run_dir = pdir / "run"  # outside the unpacked sources, so nothing imports from them
    run_dir.mkdir(exist_ok=True)
    out = {}
    saved = {}
    for who, whl in (("pip", pip_whl), ("pp4", pp4_whl)):
        target = pdir / f"installed-{who}"
        projects.timed([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--target", str(target),
                        str(whl)], run_dir, env, logs / f"install-{who}.txt")
        penv = dict(env, PYTHONPATH=str(target))
        loads = {}
        for module, path in sorted(compiled_modules({str(p.relative_to(target)): None
                                                     for p in target.rglob("*") if p.is_file()}).items()):
            proc = subprocess.run([sys.executable, "-c", LOAD_MODULE, module, str(target / path)], cwd=run_dir,
                                  env=penv, capture_output=True, text=True)
            loads[module] = (json.loads(proc.stdout.splitlines()[-1])["how"] if proc.returncode == 0
                             else f"FAILED: {proc.stderr.strip()[-1500:]}")
        op_file = run_dir / f"ops-{who}.pt"
        proc = subprocess.run([sys.executable, "-c", f"OUT = {str(op_file)!r}\n" + OPS[name] + OP_EPILOGUE],
                              cwd=run_dir, env=penv, capture_output=True, text=True)
        (logs / f"ops-{who}.txt").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            ops = {"ok": False, "error": proc.stderr.strip()[-2000:]}
        else:
            where = json.loads(Path(str(op_file) + ".json").read_text())["loaded_from"]
            ops = {"ok": True, "loaded_from": where, "from_this_install": where.startswith(str(target) + os.sep)}
            saved[who] = torch.load(op_file)
        out[who] = {"modules_loaded": loads, "ops": ops}
    out["modules_all_loaded"] = all(not h.startswith("FAILED") for w in ("pip", "pp4")
                                    for h in out[w]["modules_loaded"].values())
    if len(saved) == 2:
        a, b = saved["pip"], saved["pp4"]
        same = {k: k in b and a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a}
        out["outputs"] = sorted(a)
        out["outputs_differing"] = sorted(k for k, v in same.items() if not v) + sorted(set(b) - set(a))
        out["ops_equal"] = not out["outputs_differing"] and all(out[w]["ops"]["from_this_install"] for w in ("pip", "pp4"))
    else:
        out["ops_equal"] = False
    return out


# ------------------------------------------------------------------------ the report

def write(results: dict, out: Path) -> None:
    (out / "project-wheels.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "project-wheels.md").write_text(table(results))


def table(results: dict) -> str:
    yes = lambda v: "yes" if v else "**no**"  # noqa: E731
    m = results["machine"]
    lines = [f"pip wheel vs pp4's project wheel, {m['cpus']} CPUs, no GPU, -j {results['jobs']} / MAX_JOBS="
             f"{results['jobs']}, arch {results['arch']}, torch {m['torch']}, {m['nvcc']}, setuptools "
             f"{m['setuptools']}, pip {m['pip']}; pp4 {m['pp4_at_start']} at the start. "
             "Wall and CPU in seconds, the median of the timed pairs (each pair from fresh sources, the order "
             "swapped from pair to pair); pp4's is configure + ninja wheel, cold (an empty store). The ratios: "
             "the median of the pairs' ratios (their range).", "",
             "| project | version | units | pairs | pip wall / CPU | pp4 wall / CPU | pp4/pip wall | pp4/pip CPU "
             "| same wheel name | same file list | ops equal |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for r in results["projects"]:
        if "compare" not in r:
            lines.append(f"| {r['project']} | {r['version']} | | | | | | | | | failed |")
            notes += [f"- {r['project']}: {f.splitlines()[0][:300]}" for f in r.get("failures", [])]
            continue
        c, run, pp4 = r["compare"], r["run"], r["pp4"]
        same_list = yes(c["same_file_list"])
        if not c["same_file_list"] and c["same_file_list_but_module_file_names"]:
            same_list = "**no**: module file names differ (same import paths)"
        pairs = r["pairs"]
        med = lambda who, what: round(statistics.median(  # noqa: E731
            (p[who]["total"] if who == "pp4" else p[who])[what] for p in pairs), 1)
        ratio = lambda what: (f"{r[f'ratio_{what}_pp4_over_pip']}" + (  # noqa: E731
            f" ({r[f'ratio_{what}_range'][0]}-{r[f'ratio_{what}_range'][1]})" if len(pairs) > 1 else ""))
        lines.append(f"| {r['project']} | {r['version']} | {pp4['units']} | {len(pairs)} "
                     f"| {med('pip', 'wall_s')} / {med('pip', 'cpu_s')} | {med('pp4', 'wall_s')} / {med('pp4', 'cpu_s')} "
                     f"| {ratio('wall')} | {ratio('cpu')} | {yes(c['same_wheel_name'])} | {same_list} "
                     f"| {yes(run['ops_equal'])} |")
        if len(pairs) > 1:
            notes.append(f"- {r['project']}, each pair (pip, then pp4 as configure + ninja wheel; wall / CPU s): " + "; ".join(
                f"{p['order']}: {p['pip']['wall_s']} / {p['pip']['cpu_s']} against {p['pp4']['configure']['wall_s']} + "
                f"{p['pp4']['ninja_wheel']['wall_s']} = {p['pp4']['total']['wall_s']} / {p['pp4']['total']['cpu_s']} "
                f"({p['ratio_wall']}x wall)" for p in pairs))
        notes.append(f"- {r['project']} ({r['order']}; pp4 at {r['pp4_state']}): pp4 configure {pp4['configure']['wall_s']} s, "
                     f"ninja wheel {pp4['ninja_wheel']['wall_s']} s. Other files "
                     f"byte-equal: {yes(c['other_files_byte_equal'])}"
                     + (f" (differ: {', '.join(c['other_files_differing'])})" if c["other_files_differing"] else "")
                     + f"; METADATA equal apart from `{'; '.join(c['metadata']['pp4_torch_pin'])}`: "
                     f"{yes(c['metadata']['equal_apart_from_the_pin'])}; modules at the same import paths: "
                     f"{yes(c['same_module_import_paths'])}; every module loads from both installs: "
                     f"{yes(run['modules_all_loaded'])}; CPU outputs compared: {', '.join(run.get('outputs', []))}.")
        if c["only_pip"] or c["only_pp4"]:
            notes.append(f"  - only in pip's wheel: {', '.join(c['only_pip']) or '-'}; only in pp4's: "
                         f"{', '.join(c['only_pp4']) or '-'}")
        if c["module_modes_differing"]:
            notes.append("  - compiled modules' file modes in the wheel differ: " + "; ".join(
                f"{m} pip {v['pip']}, pp4 {v['pp4']}" for m, v in c["module_modes_differing"].items()))
        other_modes = {n: v for n, v in c["modes_differing"].items() if n not in {p["pip"] for p in c["modules"].values()}}
        if other_modes:
            notes.append("  - other files' modes differ: " + "; ".join(
                f"{n} pip {v['pip']}, pp4 {v['pp4']}" for n, v in other_modes.items()))
        if c["metadata"]["diff"]:
            notes.append(f"  - METADATA differs beyond the pin: {c['metadata']['diff']}")
        for who in ("pip", "pp4"):
            if c["record_consistent"][who]:
                notes.append(f"  - {who}'s RECORD: {'; '.join(c['record_consistent'][who][:5])}")
        for n in pp4.get("configure_notices", []):
            notes.append(f"  - pp4 configure said: {n.strip()[:400]}")
    notes += [f"- left out: {k}: {v}" for k, v in results.get("rejected", {}).items()]
    return "\n".join(lines + ["", *notes, ""])


if __name__ == "__main__":
    sys.exit(main())
