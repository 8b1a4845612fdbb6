"""The state of paths now, and whether the (path, state) pairs a compile observed still hold.

The observer (pp4/execution/observe.py) says which paths a compile's processes asked about and
whether the kernel found something there. After the compile each such path gets its *state* now:

    <sha256>        a regular file, by content (read, stat'ed, run: every byte can matter)
    -               nothing there (a header looked for and not found, a program looked for on PATH)
    d               a folder
    ls:in-order:<sha256>  a folder whose entries were listed, by the names in the order the kernel
                    lists them (gcc takes the first valid precompiled header of a `x.h.gch/` folder)
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

What a finished compile observed is made in pp4/reuse/observations.py.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import stat

from pp4.execution.root import FIXED
from pp4.reuse import loadercache, nativecpu, twins
from pp4.reuse.actionkey import FileHasher

ABSENT, FOLDER, FILE, SPECIAL, NOFOLLOW, LINK, LISTING = "-", "d", "f", "s", "L", "@", "ls:"
# A listing is kept in the kernel's order (getdents: the newest first on tmpfs, the names' hash's on
# ext4), not sorted: gcc tries the files of a `x.h.gch/` folder in that order and takes the first
# valid one, and so may any program that takes the first match of a listing. It costs no reuse that
# was measured: real gcc and nvcc compiles and a g++ link list no folder pp4 keys (nvcc lists its
# temporary folder). `ls:<sha256>` (sorted names) was the earlier form: it never holds now.
IN_ORDER = LISTING + "in-order:"
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
ATTRIBUTES = (XATTR, XATTRS, NOFOLLOW + XATTR, NOFOLLOW + XATTRS)
ABSENT_ERRORS = (errno.ENOENT, errno.ENOTDIR)


class States:
    """The state of paths now, each worked out once per process (files hashed once, FileHasher)."""

    def __init__(self, hasher: FileHasher):
        self.hasher = hasher
        self._memo: dict[tuple[str, str], str] = {}
        # When a dict: every stat this object makes, by (path, followed), kept (the check before ninja
        # decides writes the next run's table of identities from them: pp4/reuse/quickcheck.py).
        self.stats: dict[tuple[str, bool], os.stat_result] | None = None

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
            return ABSENT if e.errno in ABSENT_ERRORS else "!" + errno.errorcode.get(e.errno, str(e.errno))
        if self.stats is not None:
            self.stats[(path, follow)] = st
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
                names = os.listdir(path)  # readdir: the kernel's order
                found = IN_ORDER + hashlib.sha256("\0".join(names).encode("utf-8", "surrogateescape")).hexdigest()
            except OSError as e:
                found = ABSENT if e.errno in ABSENT_ERRORS else "!" + errno.errorcode.get(e.errno, str(e.errno))
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
                said = ABSENT if e.errno in (errno.ENODATA, *ABSENT_ERRORS) else "!" + errno.errorcode.get(e.errno, str(e.errno))
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
    if s.startswith(IN_ORDER):
        return f"a folder listing {s[len(IN_ORDER):][:12]} in the kernel's order"
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
