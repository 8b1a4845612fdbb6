"""What a compile observed, as a set of (path, state) pairs, and whether each still holds.

The observer (pp4/execution/observe.py) says which paths a compile's processes asked about and
whether the kernel found something there. After the compile each such path gets its *state* now:

    <sha256>        a regular file, by content (read, stat'ed, run: every byte can matter)
    -               nothing there (a header looked for and not found, a program looked for on PATH)
    d               a folder
    ls:<sha256>     a folder whose entries were listed, by the sorted names
    s               something else (a FIFO, a device)
    !<errno>        the kernel refused (EACCES, ELOOP, ...)
    ld:<sha256>:... the loader's cache, by what it resolves for the names the compile could look up
                    (pp4/reuse/loadercache.py), not by its bytes
    native:...      on the host compiler's path, for a command with `-march=native` or its kin: what
                    the compiler makes of this machine's CPU (pp4/reuse/nativecpu.py)

and a path reached without following its last link (lstat, readlink: what realpath() does, once
per folder of every header) gets `L` before its kind alone, `Lf` for a regular file (its content is
the business of the calls that read it), or `L@<target>` for a link. An observation set holds every pair; a stored object is reused only
when every pair holds now. Since a compile's result is a function of what its processes saw, a
compile run now would see the same and give the same object (docs/reuse.md says what is not seen).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import stat
import struct

from pp4.execution import observe
from pp4.execution.root import FIXED
from pp4.reuse import loadercache, nativecpu, twins
from pp4.reuse.actionkey import FileHasher

ABSENT, FOLDER, FILE, SPECIAL, NOFOLLOW, LINK, LISTING = "-", "d", "f", "s", "L", "@", "ls:"
# After a regular file's sha256: this process may execute it. A compiler driver runs the first
# program of its search folders it may execute (access X_OK), so a file that stops being executable
# changes what runs, with the same bytes.
EXECUTABLE = "+x"
TWINS = twins.PREFIX
# A path's extended attribute, by name (`xattr:<name>=<sha256 of its value>`, `-` when the file has
# none by that name), and the list of its attributes' names (`xattrs:<sha256>`); `L` before either
# when the call did not follow a final link.
XATTR, XATTRS = "xattr:", "xattrs:"
# A folder of this machine that a fixed path of the root stood for, or the working folder ("@cwd"
# where there is no root), when the object names it (debug information, a coverage file's path):
# `at:<folder>`. Such an object is not the same object in another folder.
AT, CWD = "at:", "@cwd"
# A folder of this machine that a fixed path stood for, relative to the working folder's, in an
# object with debug information (pp4/execution/run.py: debug_prefix_maps): `rel:<path>`.
REL = "rel:"
# States whose path's inode is not what they record (a folder's place, a compiler's answer, a
# group of files each observed on its own): changed_during leaves them to their own observations.
ASKED = (TWINS, AT, REL, nativecpu.PREFIX, nativecpu.GPU_PREFIX, loadercache.PREFIX)
_ATTRIBUTES = (XATTR, XATTRS, NOFOLLOW + XATTR, NOFOLLOW + XATTRS)
_ABSENT_ERRORS = (errno.ENOENT, errno.ENOTDIR)
# Written within this long before a compile started, a file's ctime cannot tell a change during the
# compile from one just before it (the kernel stamps times from a clock that ticks every few ms).
CTIME_MARGIN_S = 0.05


class States:
    """The state of paths now, each worked out once per process (files hashed once, FileHasher)."""

    def __init__(self, hasher: FileHasher):
        self.hasher = hasher
        self._memo: dict[tuple[str, str], str] = {}

    def state(self, path: str, follow: bool = True) -> str:
        key = (path, "f" if follow else "l")
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._state(path, follow)
        return found

    def _state(self, path: str, follow: bool) -> str:
        try:
            st = os.stat(path) if follow else os.lstat(path)
        except OSError as e:
            return ABSENT if e.errno in _ABSENT_ERRORS else "!" + errno.errorcode.get(e.errno, str(e.errno))
        prefix = "" if follow else NOFOLLOW
        if stat.S_ISLNK(st.st_mode):
            try:
                return prefix + LINK + os.readlink(path)
            except OSError as e:
                return prefix + "!" + errno.errorcode.get(e.errno, str(e.errno))
        if stat.S_ISDIR(st.st_mode):
            return prefix + FOLDER
        if stat.S_ISREG(st.st_mode):
            if not follow:
                return NOFOLLOW + FILE
            sha = self.hasher.sha256(path, st)
            if sha is None:
                return "!EACCES"
            return sha + EXECUTABLE if _may_execute(st) else sha
        return prefix + SPECIAL

    def listing(self, path: str) -> str:
        key = (path, LISTING)
        found = self._memo.get(key)
        if found is None:
            try:
                names = sorted(os.listdir(path))
                found = LISTING + hashlib.sha256("\0".join(names).encode("utf-8", "surrogateescape")).hexdigest()
            except OSError as e:
                found = ABSENT if e.errno in _ABSENT_ERRORS else "!" + errno.errorcode.get(e.errno, str(e.errno))
            self._memo[key] = found
        return found

    def native(self, compiler: str, flags: list[str], gpu: bool = False) -> str:
        key = (compiler, (nativecpu.GPU_PREFIX if gpu else nativecpu.PREFIX) + " ".join(flags))
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = (nativecpu.gpu_state if gpu else nativecpu.state)(compiler, flags)
        return found

    def xattr(self, path: str, name: str | None, follow: bool) -> str:
        """A path's extended attribute by name (None: the list of its names), as a state."""
        key = (path, ("x:" if follow else "lx:") + (name if name is not None else "\0"))
        found = self._memo.get(key)
        if found is None:
            prefix = "" if follow else NOFOLLOW
            try:
                if name is None:
                    names = sorted(os.listxattr(path, follow_symlinks=follow))
                    found = prefix + XATTRS + hashlib.sha256("\0".join(names).encode("utf-8", "surrogateescape")).hexdigest()
                else:
                    value = os.getxattr(path, name, follow_symlinks=follow)
                    found = f"{prefix}{XATTR}{name}={hashlib.sha256(value).hexdigest()}"
            except OSError as e:
                said = ABSENT if e.errno in (errno.ENODATA, *_ABSENT_ERRORS) else "!" + errno.errorcode.get(e.errno, str(e.errno))
                found = f"{prefix}{XATTRS}{said}" if name is None else f"{prefix}{XATTR}{name}={said}"
            self._memo[key] = found
        return found

    def now(self, path: str, recorded: str, to_real=None) -> str:
        """The state of a path now, of the kind a recorded state is (to_real: where the recorded
        paths a state names are on this machine)."""
        if ":" not in recorded and not recorded.startswith(NOFOLLOW):
            return self.state(path)  # a file's sha256, a folder, an absence: 95% of a lookup's; every other kind has a colon
        if recorded.startswith(TWINS):
            others = twins.others(recorded)
            reals = [to_real(o) if to_real else o for o in others]
            return twins.state(others, [path, *reals]) if None not in reals else recorded
        if recorded.startswith(AT):
            return AT + (os.getcwd() if path == CWD else path)
        if recorded.startswith(REL):
            work = to_real(f"{FIXED}/work") if to_real else None
            return REL + os.path.relpath(path, work) if work else recorded
        bare = recorded[1:] if recorded.startswith(NOFOLLOW) else recorded
        if bare.startswith(XATTRS):
            return self.xattr(path, None, bare is recorded)
        if bare.startswith(XATTR):
            return self.xattr(path, bare[len(XATTR):].rpartition("=")[0], bare is recorded)
        if recorded.startswith(nativecpu.GPU_PREFIX):
            return self.native(path, nativecpu.flags_of(recorded), gpu=True)
        if recorded.startswith(nativecpu.PREFIX):
            return self.native(path, nativecpu.flags_of(recorded))
        if recorded.startswith(LISTING):
            return self.listing(path)
        if recorded.startswith(loadercache.PREFIX):
            return loadercache.state(path, loadercache.names_in(recorded)) or self.state(path)
        if recorded.startswith(NOFOLLOW):
            return self.state(path, follow=False)
        return self.state(path)


@functools.lru_cache(maxsize=1)
def _user() -> tuple[int, frozenset[int]]:
    """This process's user and groups, asked once: a lookup checks thousands of files."""
    return os.geteuid(), frozenset({os.getegid(), *os.getgroups()})


def _may_execute(st: os.stat_result) -> bool:
    """What access(X_OK) answers this process for a regular file, from the stat it has."""
    uid, gids = _user()
    if uid == 0:
        return bool(st.st_mode & 0o111)
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid in gids:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def is_file(state: str) -> bool:
    """A regular file's state (its sha256, and whether it may be run): a dependency file lists it."""
    return len(state) == 64 or (len(state) == 64 + len(EXECUTABLE) and state.endswith(EXECUTABLE))


def holds(pairs, to_real, states: States) -> bool:
    """Whether every recorded (path, state) holds now; to_real maps a recorded path to this
    machine's (None: a path of the root's own, which is the same in every run)."""
    for path, recorded in pairs:
        real = to_real(path)
        if real is not None and states.now(real, recorded, to_real) != recorded:
            return False
    return True


def differences(pairs, to_real, states: States) -> list[str]:
    """What no longer holds, in words (the audit's explanations)."""
    out = []
    for path, recorded in pairs:
        real = to_real(path)
        if real is None:
            continue
        got = states.now(real, recorded, to_real)
        if got != recorded:
            out.append(f"{real}: {describe(recorded)} when compiled, {describe(got)} now")
    return out


def describe(state: str) -> str:
    if state.startswith(TWINS):
        return twins.describe(state)
    if state.startswith(AT):
        return f"named by the object as {state[len(AT):]}"
    if state.startswith(REL):
        return f"named by the object's debug information as {state[len(REL):]}"
    bare = state[1:] if state.startswith(NOFOLLOW) else state
    if bare.startswith(XATTRS):
        return f"extended attributes {bare[len(XATTRS):][:12]}"
    if bare.startswith(XATTR):
        name, _, value = bare[len(XATTR):].rpartition("=")
        return f"extended attribute {name} {'absent' if value == ABSENT else value[:12]}"
    if state.startswith(nativecpu.GPU_PREFIX):
        return f"this machine's GPUs as nvcc reads them for {' '.join(nativecpu.flags_of(state))} ({state[-64:][:12]})"
    if state.startswith(nativecpu.PREFIX):
        return f"this CPU as the compiler reads it for {' '.join(nativecpu.flags_of(state))} ({state[-64:][:12]})"
    if state.startswith(loadercache.PREFIX):
        return f"the loader's cache resolving {len(loadercache.names_in(state))} names to {state[3:15]}"
    s = state[1:] if state.startswith(NOFOLLOW) else state
    if s == ABSENT:
        return "absent"
    if s == FOLDER:
        return "a folder"
    if s.startswith(LISTING):
        return f"a folder listing {s[len(LISTING):][:12]}"
    if s.startswith(LINK):
        return f"a link to {s[1:]}"
    if s.startswith("!"):
        return f"refused ({s[1:]})"
    if s == SPECIAL:
        return "a special file"
    if s == FILE:
        return "a file"
    if s.endswith(EXECUTABLE):
        return f"sha256 {s[:12]}, executable"
    return f"sha256 {s[:12]}"


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
    """The places an object names. In the fixed root, an object with debug information names each
    of the root's folders relative to the working folder (pp4/execution/run.py maps them so, for a
    debugger run there): it is keyed on those relative places (`rel:<path>` on each fixed path),
    so two checkouts laid out alike share it and others do not. Without the root, an object that
    names the working folder (debug information, a coverage file's path) is keyed on it
    (`at:<folder>` on "@cwd")."""
    if ran.root is None:
        try:
            data = open(obj, "rb").read()
        except OSError:
            return []
        here = os.getcwd()
        return [[CWD, AT + here]] if os.fsencode(here) in data else []
    if not has_debug_info(obj):
        return []
    from pp4.execution.run import relative_places

    return sorted([fixed, REL + rel] for fixed, rel in relative_places(ran.root))


def has_debug_info(path: str) -> bool:
    """Whether an ELF object has DWARF sections (.debug_*, .zdebug_*): asked of the object itself,
    whatever flag or response file asked for it."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:
                return False
            shoff, = struct.unpack_from("<Q", head, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
            if not shoff or not shnum or shstrndx >= shnum:
                return False
            f.seek(shoff)
            table = f.read(shentsize * shnum)
            _, _, _, _, names_at, names_size = struct.unpack_from("<IIQQQQ", table, shstrndx * shentsize)
            f.seek(names_at)
            names = f.read(names_size)
        for i in range(shnum):
            start, = struct.unpack_from("<I", table, i * shentsize)
            name = names[start:names.find(b"\0", start)]
            if name.startswith((b".debug_", b".zdebug_")):
                return True
    except (OSError, struct.error, ValueError):
        return False
    return False


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
            if state.startswith(_ATTRIBUTES):
                continue  # an attribute of a file that is not there: its absence is observed as such
            return real
        if st.st_ctime >= since and not stat.S_ISDIR(st.st_mode):
            return real
    return None
