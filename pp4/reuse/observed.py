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
import re
import stat

from pp4.execution.observe import CHANNELS
from pp4.execution.root import FIXED
from pp4.reuse import loadercache, nativecpu
from pp4.reuse.actionkey import FileHasher

ABSENT, FOLDER, FILE, SPECIAL, NOFOLLOW, LINK, LISTING = "-", "d", "f", "s", "L", "@", "ls:"
# After a regular file's sha256: this process may execute it. A compiler driver runs the first
# program of its search folders it may execute (access X_OK), so a file that stops being executable
# changes what runs, with the same bytes.
EXECUTABLE = "+x"
# Files of the same bytes that one compile read: which of them have the same modification time (in
# seconds). gcc's `#pragma once` takes two such files for one when their times agree as well, and
# includes the second only when they differ. The state names the group's other members.
TWINS = "twins:"
_ONCE = re.compile(rb'^[ \t]*#[ \t]*(?:pragma[ \t]+once|import)\b|_Pragma[ \t]*\([ \t]*"once"', re.M)
# Where the project's own files are in the fixed root: the working folder, the sources, the build.
PROJECT_PLACES = tuple(f"{FIXED}/{place}/" for place in ("work", "src", "build"))
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
            sha = self.hasher.sha256(path)
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

    def now(self, path: str, recorded: str, to_real=None) -> str:
        """The state of a path now, of the kind a recorded state is (to_real: where the recorded
        paths a state names are on this machine)."""
        if recorded.startswith(TWINS):
            others = recorded[len(TWINS):].split("|", 1)[0].split("\0")
            reals = [to_real(o) if to_real else o for o in others]
            return twins_state(others, [path, *reals]) if None not in reals else recorded
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


def twins_state(others: list[str], reals: list[str]) -> str:
    """The twins state of a group: the other members as recorded, then for each member (this one
    first) the class of its modification time, numbered by first appearance ('0,0,1')."""
    classes: dict[object, int] = {}
    labels = []
    for real in reals:
        try:
            when: object = int(os.stat(real).st_mtime)
        except OSError as e:
            when = f"!{e.errno}"
        labels.append(str(classes.setdefault(when, len(classes))))
    return TWINS + "\0".join(others) + "|" + ",".join(labels)


def _twins(ran, pairs: dict) -> None:
    """One twins observation per group of the project's files with the same bytes, once-only
    (`#pragma once`), that the compile read. Files of torch, the toolchain and the system are left
    out: their times are when they were installed on each machine, which would split a shared store
    for nothing they are edited for (torch's own headers hold such twins)."""
    groups: dict[str, list[str]] = {}
    for (path, kind), state in pairs.items():
        if kind == "f" and is_file(state) and (ran.root is None or path.startswith(PROJECT_PLACES)):
            groups.setdefault(state[:64], []).append(path)
    for members in groups.values():
        if len(members) < 2:
            continue
        members.sort()
        reals = [ran.real(m) for m in members]
        if None not in reals and _once_only(reals[0]):
            pairs[(members[0], TWINS)] = twins_state(members[1:], reals)


def _once_only(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return _ONCE.search(f.read()) is not None
    except OSError:
        return True  # what cannot be read now is keyed: the lookup compares its time class too


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
        others, _, classes = state[len(TWINS):].rpartition("|")
        return f"{len(others.split(chr(0))) + 1} files of the same bytes with modification times {classes}"
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


def from_run(ran, outputs: set[str], states: States) -> tuple[list[list[str]], str | None]:
    """The observation set of a finished compile (pp4.execution.run.Ran), and why it must not be
    stored, if it must not: the observer could not run or could not read a call, the compile
    talked to another process (a socket, shared memory, ...), asked which machine it runs on or
    read a file under /proc, /sys or /dev that describes it or the run,
    wrote somewhere other than its outputs and temporary folder, or something it read changed
    while it ran.
    outputs: the paths it was asked to write, as it saw them."""
    trace = ran.trace
    if trace is None:
        return [], f"it was not observed: {ran.trace_problem}"
    if trace.opaque:
        return [], f"the observer could not read {len(trace.opaque)} of its calls (first: {trace.opaque[0][:160]})"
    if trace.sockets:
        return [], (f"it reached another process through a socket ({trace.sockets[0][:160]}): what that "
                    "process answered is an input no file shows")
    if trace.channels:
        call = trace.channels[0]
        return [], f"it read {CHANNELS[call]} ({call}), an input that no file's content or presence shows"
    if trace.machine:
        asked = trace.machine[0]
        if asked == "uname":
            return [], ("it asked the kernel which machine it runs on (uname: the host name and kernel release), "
                        "an input pp4 does not key")
        return [], f"it read {asked[:160]}, which describes this machine or this run, an input pp4 does not key"
    if trace.through_proc:
        return [], (f"it read {trace.through_proc[0][:160]}, a file reached through /proc that pp4 cannot key "
                    "(name the file by its own path)")
    produced = set(trace.writes)
    for path in sorted(produced):
        if path in outputs or ran.real(path) is None:
            continue
        return [], f"it wrote {ran.real(path)}, which is neither its output nor its temporary folder"
    pairs: dict[tuple[str, str], str] = {}
    reads = dict(trace.reads)
    from pp4.execution.observe import interpreters

    for program in trace.executed:
        real = ran.real(program)
        for interp in interpreters(real) if real else []:
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
    for folder in trace.listed:
        real = ran.real(folder)
        if real is not None and os.path.normpath(folder) not in produced:
            pairs[(folder, LISTING)] = states.listing(real)
    _loader_cache(ran, pairs)
    _native_cpu(ran, pairs, states)
    _twins(ran, pairs)
    changed = changed_during(ran, [(p, s) for (p, _), s in pairs.items()])
    if changed:
        return [], f"{changed} changed while it was compiled"
    return sorted([p, s] for (p, _), s in pairs.items()), None


def above_the_root(ran) -> list[tuple[str, str]]:
    """What a compile in the fixed root looked for through `..` above a folder the root mounts
    alone, and did not find there, though this machine has it: (the path on this machine, the
    mounted folder). Outside the root the compiler would have read it."""
    if ran.root is None or ran.trace is None:
        return []
    found = set()
    for (path, _), result in ran.trace.reads.items():
        if result != "ENOENT" or not path.startswith(FIXED + "/") or "/../" not in path + "/":
            continue
        real = ran.real(path)
        if real is not None and os.path.exists(real):
            top = path[len(FIXED) + 1:].split("/", 1)[0]
            found.add((os.path.normpath(real), ran.real(f"{FIXED}/{top}") or ""))
    return sorted(found)


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


def _native_cpu(ran, pairs: dict, states: States) -> None:
    """A command that asks for this machine's CPU (`-march=native`): keyed on what its host compiler
    makes of the CPU, which the compiler reads with an instruction, not a file."""
    flags = nativecpu.flags_in(ran.command)
    compiler = nativecpu.host_compiler(ran.command) if flags else None
    real = ran.real(compiler) if compiler else None
    if real is not None:
        pairs[(compiler, nativecpu.PREFIX)] = states.native(real, flags)
    # nvcc's -arch=native: the same for the GPU, which nvcc asks the driver about.
    gpu = nativecpu.gpu_flags_in(ran.command)
    nvcc = ran.real(ran.command[0]) if gpu else None
    if nvcc is not None:
        pairs[(ran.command[0], nativecpu.GPU_PREFIX)] = states.native(nvcc, gpu, gpu=True)


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
        if real is None or state in (ABSENT, NOFOLLOW + ABSENT):
            continue
        try:
            st = os.lstat(real) if state.startswith(NOFOLLOW) else os.stat(real)
        except OSError:
            return real
        if st.st_ctime >= since and not stat.S_ISDIR(st.st_mode):
            return real
    return None
