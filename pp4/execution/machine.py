"""When a compile, a link or any pp4 step fails because of the machine, one line that says so.

A full disk, a read-only or unwritable build folder, or memory that ran out are not the sources'
fault, and what the compiler said about them may be lost: with the build folder on a full
filesystem, gcc's "No space left on device" went to a file on that filesystem, and ninja showed
only `FAILED: ... ops.cpp.o` (issue 55). So the folders a step writes are checked before it runs
(a certain failure is refused with the line, the step never starts) and again after it failed, and
the line goes to the step's stderr, which ninja shows on the console, never to a file.

The line names what was measured (statvfs of the folder, its mount, its free bytes; the cgroup's
out-of-memory kill count; the compiler's own words) and what to do.
"""

from __future__ import annotations

import errno
import io
import os
import re
from pathlib import Path

import attrs

from pp4.sizes import human_bytes

PREFIX = "pp4: failed because of the machine, not the sources:"
# Free bytes below which a filesystem is full for a compile: its object, dependency file and
# temporary files are each more than this. Only consulted after a step failed (or at 0, before).
NEARLY_FULL = 1 << 20
# errnos that say the machine, not the build's inputs, stopped a step.
MACHINE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOMEM}
# What compilers, linkers and the C library print for the same causes (gcc/cc1plus, ld, nvcc's
# tools, Python): read from the step's stderr, which pp4 keeps in memory (pp4/execution/run.py).
_SAID = [
    ("space", re.compile(rb"No space left on device|Disk quota exceeded")),
    ("read-only", re.compile(rb"Read-only file system")),
    ("memory", re.compile(rb"Cannot allocate memory|out of memory|virtual memory exhausted|std::bad_alloc|"
                          rb"MemoryError|Killed signal terminated program")),
]


class MachineError(Exception):
    """A step that cannot succeed on this machine as it is; its message is the one line."""


@attrs.frozen
class Folder:
    """What statvfs and access() say about a folder a step writes into."""
    path: str  # the folder asked about (the nearest one that exists)
    mount: str  # the mount point it is on
    free: int  # bytes this user may still write there
    size: int  # the filesystem's size
    read_only: bool
    writable: bool  # access(W_OK) for this user


def nearest_existing(path: str | Path) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p) and p != os.path.dirname(p):
        p = os.path.dirname(p)
    return p


def mount_of(path: str) -> str:
    p = os.path.realpath(path)
    while not os.path.ismount(p):
        p = os.path.dirname(p)
    return p


def folder(path: str | Path) -> Folder:
    p = nearest_existing(path)
    st = os.statvfs(p)
    # root may use the blocks reserved for it, which f_bavail leaves out
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return Folder(p, mount_of(p), blocks * st.f_frsize, st.f_blocks * st.f_frsize,
                  bool(st.f_flag & os.ST_RDONLY), os.access(p, os.W_OK))


def _space(f: Folder, rerun: str = "ninja") -> str:
    return (f"the filesystem of {f.path} ({f.mount}) has {human_bytes(f.free)} free of {human_bytes(f.size)} "
            "(statvfs); free space there, or configure a build folder on another disk (--builddir), "
            f"then run {rerun} again")


def _read_only(f: Folder, rerun: str = "ninja") -> str:
    return (f"{f.path} is on a read-only filesystem ({f.mount}, statvfs); remount it read-write, or configure "
            f"a build folder you can write (--builddir), then run {rerun} again")


def _not_writable(f: Folder, rerun: str = "ninja") -> str:
    return (f"{f.path} is not writable by user {os.geteuid()} (permission denied); fix its owner or mode, or "
            f"configure a build folder you can write (--builddir), then run {rerun} again")


def before(folders: list[str | Path], rerun: str = "ninja") -> str | None:
    """A failure that is certain before a step runs: a folder it writes is read-only, not writable,
    or its filesystem has no byte free. None: nothing certain (it may still fail; see after()).
    The cause and what to do, without PREFIX (configure says it as its own error)."""
    for path in folders:
        f = folder(path)
        if f.read_only:
            return _read_only(f, rerun)
        if not f.writable:
            return _not_writable(f, rerun)
        if f.free == 0:
            return _space(f, rerun)
    return None


def oom_kills() -> int | None:
    """How many processes the kernel's out-of-memory killer has ended in this process's cgroup (v2
    memory.events), or None where that cannot be read."""
    try:
        line = next(ln for ln in Path("/proc/self/cgroup").read_text().splitlines() if ln.startswith("0::"))
        events = Path("/sys/fs/cgroup") / line[3:].lstrip("/") / "memory.events"
        for ln in events.read_text().splitlines():
            key, _, value = ln.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, StopIteration, ValueError):
        pass
    return None


def available_memory() -> int | None:
    try:
        for ln in Path("/proc/meminfo").read_text().splitlines():
            if ln.startswith("MemAvailable:"):
                return int(ln.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _memory(evidence: str, address_space: int | None, rerun: str = "ninja") -> str:
    avail = available_memory()
    now = f", {human_bytes(avail)} available now" if avail is not None else ""
    if address_space:  # its own limit, not the machine's memory, is what ran out: fewer jobs would not help
        fix = (f"each compiler may map {human_bytes(address_space)} (--max-memory): re-run configure with a larger "
               "--max-memory, or without it")
    else:
        fix = "run fewer compiles at once: re-run configure with a smaller -j"
    return f"{PREFIX} out of memory ({evidence}{now}); {fix}, then run {rerun} again"


def after(folders: list[str | Path], stderr: bytes = b"", oom_before: int | None = None,
          address_space: int | None = None) -> str | None:
    """Why a step that failed did, when the cause is the machine: its folders as they are now,
    the cgroup's out-of-memory kills since `oom_before`, and what the step itself said. None: no
    machine cause found (the step's own messages are the story)."""
    said = {what for what, pattern in _SAID if pattern.search(stderr)}
    states = [folder(p) for p in folders]
    for f in states:
        if f.read_only:
            return f"{PREFIX} {_read_only(f)}"
    for f in states:
        if not f.writable:
            return f"{PREFIX} {_not_writable(f)}"
    for f in states:
        if f.free < NEARLY_FULL:
            return f"{PREFIX} {_space(f)}"
    for what, words in (("read-only", "Read-only file system"), ("space", "No space left on device")):
        if what in said:  # somewhere other than the folders asked about: say what was measured there too
            room = "; ".join(f"{f.path}: {human_bytes(f.free)} free, {'read-only' if f.read_only else 'writable'}"
                             for f in states)
            return (f"{PREFIX} it said \"{words}\" about a filesystem other than its output folders ({room}); "
                    "check where it writes its temporary files (TMPDIR) and the disks it reads from")
    kills = oom_kills()
    if oom_before is not None and kills is not None and kills > oom_before:
        return _memory(f"the kernel's out-of-memory killer ended {kills - oom_before} process(es) of this cgroup "
                       "while it ran (memory.events)", address_space)
    if "memory" in said:
        words = next(ln for ln in stderr.splitlines() if _SAID[-1][1].search(ln))
        return _memory(f"it said: {words.decode(errors='replace').strip()[:160]}", address_space)
    return None


def from_oserror(e: OSError, rerun: str = "ninja") -> str | None:
    """The line for an OSError a pp4 step raised, when its errno is the machine's; None otherwise."""
    if e.errno not in MACHINE_ERRNOS:
        return None
    named = e.filename if isinstance(e.filename, (str, bytes, os.PathLike)) else _file_written(e)
    if named is not None:
        where = os.path.abspath(os.fsdecode(named))
        what = f"{e.strerror}: {where}"
    else:  # no file found: the working folder, where ninja runs every step
        what = f"{e.strerror}, writing under {os.getcwd()}"
    if e.errno == errno.ENOMEM:
        return _memory(what, None, rerun)
    f = folder(os.path.dirname(where) if named is not None else os.getcwd())
    if e.errno == errno.EROFS or f.read_only:
        return f"{PREFIX} {what}: {_read_only(f, rerun)}"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{PREFIX} {what}: {_space(f, rerun)}"
    fix = _not_writable(f, rerun) if not f.writable else f"fix the permissions of that path, then run {rerun} again"
    return f"{PREFIX} {what}: {fix}"


def _file_written(e: OSError) -> str | None:
    """The file a write, flush or close was writing when it failed: such an OSError names none,
    but the frame that wrote holds the open file (innermost first: the file, not its caller's)."""
    frames, tb = [], e.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            if not isinstance(value, io.IOBase):
                continue
            # name and mode stay readable after the `with` that failed closed the file
            name, mode = getattr(value, "name", None), getattr(value, "mode", "")
            if isinstance(name, (str, bytes)) and isinstance(mode, str) and set(mode) & set("wax+"):
                return os.fsdecode(name)
    return None


def written_folders(argv: list[str]) -> list[str]:
    """The folders of the files a compile or link command writes: -o and -MF."""
    out = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-o", "-MF")]  # as build.ninja writes them
    return list(dict.fromkeys(os.path.dirname(os.path.abspath(p)) for p in out))
