"""What a finished compile or link observed: its trace (pp4/execution/observe.py) turned into
(path, state) pairs, each path's state now (pp4/reuse/pathstates.py), or why it must not be
stored; the places an object names; what the fixed root hid from a compile; and an observation
set cut into one part per folder."""

from __future__ import annotations

import os
import stat

from pp4.execution import observe
from pp4.execution.root import FIXED
from pp4.reuse import loadercache, nativecpu, timemacros, twins
from pp4.reuse.pathstates import (ABSENT, ASKED, AT, ATTRIBUTES, CWD, LISTING, NOFOLLOW, SPECIAL, States,
                                  is_file)

# Written within this long before a compile started, a file's ctime cannot tell a change during the
# compile from one just before it (the kernel stamps times from a clock that ticks every few ms).
CTIME_MARGIN_S = 0.05


def from_run(ran, outputs: set[str], states: States, settled: set[str] = frozenset()) -> tuple[list[list[str]], str | None]:
    """The observation set of a finished compile (pp4.execution.run.Ran), and why it must not be
    stored, if it must not: the observer could not run or could not read a call, the compile made a
    call pp4 cannot observe (a socket, another process's memory, the machine's name, a call the
    observer's table does not know), read a file under /proc, /sys or /dev that describes the
    machine or the run, asked the CPU or GPU in a way no compiler's dry run answers, wrote somewhere
    other than its outputs and temporary folder, or something it read changed while it ran.
    outputs: the paths it was asked to write, as it saw them; settled: paths whose change during it
    is not asked about (a link's objects, written by this build just before)."""
    trace = ran.trace
    if trace is None:
        return [], f"it was not observed: {ran.trace_problem}"
    if trace.opaque:
        return [], f"the observer could not read {len(trace.opaque)} of its calls (first: {trace.opaque[0][:160]})"
    if trace.unstorable:
        return [], observe.why_unstorable(trace.unstorable[0]) + (
            f" (and {len(trace.unstorable) - 1} more such calls)" if len(trace.unstorable) > 1 else "")
    if trace.machine:
        return [], f"it read {trace.machine[0][:160]}, which describes this machine or this run, an input pp4 does not key"
    if trace.through_proc:
        return [], (f"it read {trace.through_proc[0][:160]}, a file reached through /proc that pp4 cannot key "
                    "(name the file by its own path)")
    cpu, gpu, problem = nativecpu.drivers(trace)
    if problem:
        return [], problem
    produced = set(trace.writes)
    for path in sorted(produced):
        if path in outputs or ran.real(path) is None:
            continue
        return [], f"it wrote {ran.real(path)}, which is neither its output nor its temporary folder"
    pairs: dict[tuple[str, str], str] = {}
    reads = dict(trace.reads)
    for program in trace.executed:
        real = ran.real(program)
        for interp in observe.interpreters(real) if real else []:
            reads.setdefault((interp, True), "ok")
    # Folders that are there in every run: the root's mount points, whatever their real folders
    # are, and the folders of the outputs, which pp4 makes before a compile starts.
    given = {fixed for fixed, _ in ran.root.mounts} if ran.root is not None else set()
    for out in outputs:
        folder = os.path.dirname(out)
        while folder not in given and folder not in ("/", ""):
            given.add(folder)
            folder = os.path.dirname(folder)
    for (path, follow), result in reads.items():
        if os.path.normpath(path) in produced or os.path.normpath(path) in given:
            continue
        real = ran.real(path)
        if real is None:
            continue
        state = states.state(real, follow)
        bare = state[1:] if state.startswith(NOFOLLOW) else state
        if (result == "ok") != (bare != ABSENT) and result in ("ok", "ENOENT", "ENOTDIR"):
            return [], f"{real} appeared or vanished while it was compiled"
        if bare == SPECIAL and result == "ok":
            return [], (f"it reached {real}, a named pipe, socket or device, whose bytes another process or the "
                        "kernel gives: an input no file's content shows")
        pairs[(path, "f" if follow else "l")] = state
    for (path, follow, name), _ in trace.xattrs.items():
        real = ran.real(path)
        if real is not None:
            pairs[(path, ("x:" if follow else "lx:") + (name if name is not None else "\0"))] = \
                states.xattr(real, name, follow)
    for folder in trace.listed:
        real = ran.real(folder)
        if real is not None and os.path.normpath(folder) not in produced:
            pairs[(folder, LISTING)] = states.listing(real)
    _loader_cache(ran, pairs)
    for driver, flags in cpu.items():
        real = ran.real(driver)
        if real is not None:
            pairs[(driver, nativecpu.PREFIX)] = states.native(real, flags)
    for nvcc, flags in gpu.items():
        real = ran.real(nvcc)
        if real is not None:
            pairs[(nvcc, nativecpu.GPU_PREFIX)] = states.native(real, flags, gpu=True)
    twins.observe(ran, pairs, is_file)
    changed = changed_during(ran, [(p, s) for (p, _), s in pairs.items() if p not in settled])
    if changed:
        return [], f"{changed} changed while it was compiled"
    return sorted([p, s] for (p, _), s in pairs.items()), None


def pins(ran, obj: str) -> list[list[str]]:
    """The places an object names. In the fixed root nothing of this machine: what it names of its
    source root is relative to that root, and the root's other folders are its fixed paths
    (pp4/execution/run.py: debug_prefix_maps), so a `-g` object is the same wherever the checkout and
    the build folder sit. Without the root, an object that names the working folder (debug
    information, a coverage file's path) is keyed on it (`at:<folder>` on "@cwd")."""
    if ran.root is not None:
        return []
    try:
        data = open(obj, "rb").read()
    except OSError:
        return []
    here = os.getcwd()
    return [[CWD, AT + here]] if os.fsencode(here) in data else []


def hidden_by_root(ran, outputs: set[str]) -> list[tuple[str, str]]:
    """What a compile in the fixed root looked for and did not find there, though this machine has
    it at the real path: a symbolic link or a `..` that leads above a folder the root mounts alone
    (an include folder that links to ../vendor). Outside the root the compiler would have read it,
    so the compile must run outside. [(the path on this machine, the mounted folder it left)]"""
    if ran.root is None or ran.trace is None:
        return []
    found = set()
    produced = ran.trace.writes | {os.path.normpath(o) for o in outputs}
    for (path, _), result in ran.trace.reads.items():
        if result not in ("ENOENT", "ENOTDIR") or not path.startswith(FIXED + "/") or os.path.normpath(path) in produced:
            continue
        real = ran.real(path)
        if real is not None and os.path.exists(real):
            top = path[len(FIXED) + 1:].split("/", 1)[0]
            found.add((os.path.normpath(os.path.realpath(real)), ran.real(f"{FIXED}/{top}") or ""))
    return sorted(found)


# What gcc's compilers proper are started with when the object will write files at run time under
# the folder it was compiled in (coverage and profile counts: the .gcda path is the working folder
# and the object's name, which no prefix map changes in gcc 12).
_COMPILERS_PROPER = ("cc1", "cc1plus", "cc1obj", "cc1objplus", "lto1")
_RUN_TIME_PATHS = ("-fprofile-arcs", "-ftest-coverage", "-fprofile-generate", "-fprofile-dir", "-fprofile-instr-generate")
# What nvcc's cicc is started with when the device code carries line information (-lineinfo, -G):
# the sources' paths, and their modification times and sizes (PTX's .file directives).
_DEVICE_LINES = ("-generate-line-info", "-g", "--debug_mode")


def writes_beside_itself(ran) -> str | None:
    """Why an object compiled in the fixed root would not work outside it, as its compiler was
    started (None: nothing): coverage or profile instrumentation, whose counts go to a path of the
    compile's own folder, or device line information, which names the sources by their paths."""
    for e in ran.trace.execs if ran.trace is not None else ():
        base = os.path.basename(e.program)
        if base in _COMPILERS_PROPER and any(a == f or a.startswith(f + "=") for a in e.argv for f in _RUN_TIME_PATHS):
            return "it is instrumented for coverage or profiling, and writes its counts beside the object at run time"
        if base == "cicc" and any(a in _DEVICE_LINES for a in e.argv):
            return "its device code carries line information (nvcc -lineinfo or -G), which names its sources' paths"
    return None


def device_line_times(ran) -> str | None:
    """Why a compile cannot be stored: its device line information holds its sources' modification
    times (nvcc -lineinfo, -G: PTX's .file directives), which no key covers."""
    for e in ran.trace.execs if ran.trace is not None else ():
        if os.path.basename(e.program) == "cicc" and any(a in _DEVICE_LINES for a in e.argv):
            return ("its device line information holds its sources' modification times (nvcc -lineinfo or -G), "
                    "which no key covers: this unit is compiled every time")
    return None


def time_macros(ran, pairs, hasher) -> list[tuple[str, str]]:
    """(name, where) for each time macro a finished compile (pp4.execution.run.Ran) could expand
    (pp4/reuse/timemacros.py): named by a file it read (pairs: its observations; hasher: the
    FileHasher that hashed them), by a command line one of its programs was started with, or
    reported by gcc's -Wdate-time."""
    out: list[tuple[str, str]] = []
    for path, state in pairs:
        if not is_file(state):
            continue
        names = hasher.time_macros(state[:64])
        real = ran.real(path) or path
        if names is None:  # not hashed by this hasher: read it now
            try:
                with open(real, "rb") as f:
                    names = timemacros.scan(f.read())
            except OSError:
                names = ",".join(timemacros.NAMES)  # unreadable now: cannot be cleared
        out += [(n, real) for n in names.split(",") if n]
    commands = [("its command", ran.command)]
    if ran.trace is not None:
        commands += [(f"the command line of {os.path.basename(e.program)}", e.argv) for e in ran.trace.execs]
    for where, argv in commands:
        names = timemacros.scan("\n".join(argv).encode("utf-8", "surrogateescape"))
        out += [(n, where) for n in names.split(",") if n]
    out += [(n, "gcc's -Wdate-time warning") for n in ran.time_macros]
    return out


def _loader_cache(ran, pairs: dict) -> None:
    """The loader's cache keyed by what it resolves for this compile (pp4/reuse/loadercache.py)."""
    key = (loadercache.CACHE, "f")
    real = ran.real(loadercache.CACHE)
    if key not in pairs or real is None:
        return
    table = loadercache.entries(real)
    if table is None:
        return
    seen = {r for r in (ran.real(p) for p, _ in pairs) if r is not None}
    found = loadercache.state(real, loadercache.names_for(seen, table))
    if found is not None:
        pairs[key] = found


def by_folder(pairs: list[list[str]]) -> list[list[list[str]]]:
    """An observation set cut into one part per folder: units that include the same headers observe
    the same things in most folders, so most parts are stored, read and checked once for a build."""
    parts: dict[str, list[list[str]]] = {}
    for path, state in pairs:
        parts.setdefault(os.path.dirname(path), []).append([path, state])
    return [parts[k] for k in sorted(parts)]


def changed_during(ran, pairs) -> str | None:
    """The first path whose inode changed (ctime) since the compile started."""
    since = ran.started - CTIME_MARGIN_S
    for path, state in pairs:
        real = ran.real(path)
        if real is None or state in (ABSENT, NOFOLLOW + ABSENT) or state.startswith(ASKED):
            continue
        try:
            st = os.lstat(real) if state.startswith(NOFOLLOW) else os.stat(real)
        except OSError:
            if state.startswith(ATTRIBUTES):
                continue  # an attribute of a file that is not there: its absence is observed as such
            return real
        if st.st_ctime >= since and not stat.S_ISDIR(st.st_mode):
            return real
    return None
