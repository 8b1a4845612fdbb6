"""The observer: every path a command and all its children opened, looked at, listed or ran.

A compile's inputs are whatever its processes asked the kernel about, not what a model of gcc or
nvcc says they read: nvcc's passes, the host compiler's cc1plus and as, a data file an `.incbin`
pulls in, a response file, a header looked for and not found, the shared libraries the loader
maps. The command runs under pp4-observe (observer.c, built here with the host C compiler on first
use): a seccomp filter that every process the command starts inherits hands each file system call
to it, which reads the paths, looks at what is there, and lets the call go on. Its log is parsed
into a `Trace`: for each path, how it was reached (following links or not) and whether something
was there; the folders listed; the paths written, created, renamed or removed; and what could not
be understood.

What is not seen: time (the compilers are asked about it instead: -Wdate-time, pp4/execution/run.py),
/proc, /sys and /dev (left out below: a compile that reads the CPU's features from /proc changes
with the machine, which no key here covers), and anything that reaches a file without a path (an fd
passed in from outside). docs/reuse.md says what that leaves open.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import attrs

from pp4.files import locked
from pp4.paths import cache_dir

SOURCE = Path(__file__).with_name("observer.c")
PRELOAD_SOURCE = Path(__file__).with_name("observer_realpath.c")
UNSEEN = ("/proc", "/sys", "/dev")
_UNSEEN_UNDER = tuple(u + "/" for u in UNSEEN)
# File systems mounted under /dev where anyone keeps ordinary files: seen like any other folder.
_FILES_UNDER_DEV = ("/dev/shm/", "/dev/mqueue/")
# Past a process's folder links (/proc/self/cwd/x.h, /proc/1/root/..., /dev/fd/7/x.h, or any `..`
# under /proc or /dev) a path reaches a real file that it does not name: not unseen, not trusted.
_THROUGH_PROC = re.compile(r"^/(?:proc/(?:self|thread-self|\d+)(?:/task/\d+)?/(?:cwd|root|fd/\d+|map_files/[^/]+)"
                           r"|dev/(?:fd/\d+|stdin|stdout|stderr))/.|^/(?:proc|dev)/(?:.*/)?\.\.(?:/|$)")
# What a command may read under /proc, /sys and /dev without being keyed on it: what nvcc, gcc, the
# linker and gcc's LTO driver read there (pp4-observe of real compiles and links: the program's own
# path, the kernel's overcommit setting, the CPUs online, the list of file systems libselinux
# checks, random bytes, the null device), a process's own folder links (what they name is seen
# where it is read), the standard streams (a compile's input is /dev/null), and the NVIDIA driver's
# files, which `-arch=native` reaches through the driver and which pp4 keys through nvcc's dry run
# instead (what a compile reads there on a GPU host was not checked: another file there makes its
# compiles unstorable, each event naming it, not stale). Every other
# file there describes the machine or the run (its CPU, kernel, mounts, load, uptime, cgroups,
# a process's status, a device's contents): a compile that reads one is not keyed on it, so it is
# never stored.
_NEUTRAL_FILES = re.compile(r"^/dev/(?:null|zero|full|random|urandom|stdin|stdout|stderr|nvidia[^/]*|nvidia-caps/.+)$"
                            r"|^/proc/(?:self|thread-self|\d+)(?:/task/\d+)?/(?:exe|cwd|root|fd|fd/\d+)$"
                            r"|^/proc/(?:sys/vm/overcommit_memory|filesystems)$|^/proc/driver/nvidia/"
                            r"|^/sys/devices/system/cpu/(?:online|possible|present)$|^/sys/module/nvidia")
# The calls that read what a file holds (or what a link names): a stat or an access of a file
# there says only that it exists.
_CONTENT_READS = {"open", "openat", "openat2", "readlink", "readlinkat", "execve", "execveat"}

# Calls that read a path, and whether they follow a final link (the log's 'n' flag can say not).
_READS = {"open": True, "openat": True, "openat2": True, "stat": True, "lstat": False, "newfstatat": True,
          "statx": True, "access": True, "faccessat": True, "faccessat2": True, "readlink": False,
          "readlinkat": False, "execve": True, "execveat": True, "statfs": True}
# Calls that change the file system.
_WRITES = {"creat", "unlink", "unlinkat", "rmdir", "mkdir", "mkdirat", "rename", "renameat", "renameat2", "link",
           "linkat", "symlink", "symlinkat", "chmod", "fchmodat", "chown", "lchown", "fchownat", "truncate",
           "utime", "utimes", "utimensat", "futimesat", "mknod", "mknodat", "setxattr", "lsetxattr",
           "removexattr", "lremovexattr"}
_LISTS = {"getdents", "getdents64"}
# The observer resolves each path against the caller's folder itself: a change of folder needs nothing.
_FREE = {"chdir", "fchdir"}
# Calls that reach another process through a socket, whose answers no path shows. A connect to a
# Unix socket with nothing at its path fails: an absence, observed like any other.
_SOCKETS = {"connect", "bind"}
# Calls that ask the kernel about the machine itself (its name, its kernel release): no path shows it.
_MACHINE = {"uname"}
# Inputs that neither a file's content nor its presence shows: other ways to another process or to
# what one left behind, and extended attributes (which nvcc, gcc and the linker do not read).
CHANNELS = {**dict.fromkeys(("getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr"),
                            "a file's extended attributes"),
            **dict.fromkeys(("shmget", "shmat", "shmctl"), "System V shared memory"),
            **dict.fromkeys(("msgget", "msgrcv", "msgctl"), "a System V message queue"),
            **dict.fromkeys(("semget", "semctl", "semop", "semtimedop"), "System V semaphores"),
            "mq_open": "a POSIX message queue",
            **dict.fromkeys(("process_vm_readv", "ptrace", "pidfd_getfd"), "another process's memory or descriptors"),
            **dict.fromkeys(("keyctl", "request_key"), "the kernel's key store")}
_ESCAPE = re.compile(r"\\(.)")
_ESCAPED = {"t": "\t", "n": "\n", "\\": "\\"}


@attrs.frozen
class Trace:
    """What one command's process tree asked about paths."""
    reads: dict  # (path, follows a final link) -> "ok" or the errno name of what was there
    listed: frozenset  # folders whose entries were read
    executed: frozenset  # programs run (their interpreters are read by the kernel, unseen)
    writes: frozenset  # paths created, written, renamed, removed (normalized)
    opaque: tuple  # lines that could not be understood: an observation that cannot be trusted
    through_proc: tuple = ()  # paths read through a process's folder link under /proc: not trusted either
    sockets: tuple = ()  # the addresses of sockets it connected or bound: another process's answers
    machine: tuple = ()  # what asked which machine it runs on (uname), or a file that describes it or the run
    channels: tuple = ()  # the calls that reached another process other than by socket (CHANNELS)


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    h = hashlib.sha256()
    for source in (SOURCE, PRELOAD_SOURCE):
        h.update(hashlib.sha256(source.read_bytes()).digest())
    return h.hexdigest()[:16]


def observer_path() -> Path:
    """Where this version of observer.c is built: named by its sources' hash (read once per
    process, not once per command)."""
    return cache_dir() / "observer" / _source_digest() / "pp4-observe"


def preload_path() -> Path:
    """observer_realpath.c built as a library, beside pp4-observe."""
    return observer_path().with_name("pp4-observe-realpath.so")


def build() -> Path:
    """pp4-observe and its preload, compiled now unless they already are; OSError or ObserverError
    saying why not."""
    target, preload = observer_path(), preload_path()
    if target.is_file() and os.access(target, os.X_OK):  # written after the preload: both are there
        return target
    cc = compiler()
    if cc is None:
        raise ObserverError("no C compiler (cc or gcc) is on PATH to build pp4-observe")
    with locked(target.parent):
        if target.is_file():
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            for source, out, flags in ((PRELOAD_SOURCE, preload, ["-shared", "-fPIC"]), (SOURCE, target, [])):
                built = Path(scratch) / out.name
                proc = subprocess.run([cc, "-O2", *flags, "-o", str(built), str(source), "-ldl"],
                                      capture_output=True, text=True)
                if proc.returncode != 0:
                    first = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[0]
                    raise ObserverError(f"{cc} cannot build {out.name} from {source}: {first}")
                os.replace(built, out)  # the preload first: pp4-observe's presence says both are built
    return target


class ObserverError(Exception):
    pass


@functools.lru_cache(maxsize=None)
def unavailable() -> str | None:
    """Why commands cannot be observed here, or None. Asked once per process: pp4-observe must
    build and see a program start (the kernel must allow seccomp user notifications: Linux 5.8 or
    later, and no container policy that forbids seccomp filters). PP4_NO_OBSERVER=1 turns it off
    (to see what a machine without it does)."""
    if os.environ.get("PP4_NO_OBSERVER"):
        return "PP4_NO_OBSERVER is set"
    try:
        build()
    except (OSError, ObserverError) as e:
        return str(e)
    true = shutil.which("true", path="/bin:/usr/bin") or "/bin/true"
    with tempfile.TemporaryDirectory() as scratch:
        log = os.path.join(scratch, "log")
        try:
            proc = subprocess.run([*command(log), true], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"pp4-observe cannot run ({e})"
        if proc.returncode != 0:
            why = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit status {proc.returncode}"
            return f"pp4-observe cannot observe here: {why}"
        try:
            seen = parse(Path(log).read_text(errors="surrogateescape"))
        except OSError as e:
            return f"pp4-observe wrote no log ({e})"
    if true not in seen.executed:
        return f"pp4-observe did not see {true} start"
    return None


def command(log: str) -> list[str]:
    """The prefix that runs a command under the observer, writing its log to `log`."""
    return [str(observer_path()), "--preload", str(preload_path()), log]


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: _ESCAPED.get(m.group(1), m.group(1)), field) if "\\" in field else field


def parse(log_text: str) -> Trace:
    """The trace of one observed command, from pp4-observe's log (observer.c says its format)."""
    reads: dict[tuple[str, bool], str] = {}
    listed, executed, writes, opaque, through_proc, sockets, machine, channels = set(), set(), set(), [], [], [], [], []
    for line in log_text.splitlines():
        fields = line.split("\t")
        if len(fields) < 5 or not fields[2].isdigit() or "?" in fields[3]:
            opaque.append(line)  # a path the observer could not read, or a line cut short
            continue
        name, err, flags = fields[1], int(fields[2]), fields[3]
        paths = [_unescape(f) for f in fields[4:]]
        if name in _FREE:
            continue
        if name in _MACHINE:
            machine.append(name)
            continue
        if name in CHANNELS:
            channels.append(name)
            continue
        if name in _SOCKETS:
            if name == "connect" and "s" not in flags and err != 0:
                if reads.get((paths[0], True)) != "ok":
                    reads[(paths[0], True)] = errno.errorcode.get(err, f"E{err}")
            else:
                sockets.append(f"{name} {paths[0]}" if paths and paths[0] else name)
            continue
        if name in _LISTS:
            if err == 0:
                listed.add(paths[0])
            continue
        if name in _WRITES:
            writes.update(os.path.normpath(p) for p in paths)
            continue
        if name not in _READS:
            opaque.append(line)  # chroot, mount, a handle, another ABI's call: nothing pp4 can judge
            continue
        path = paths[0]
        if "e" in flags and not path:
            continue  # a stat of an open file: its open was seen
        if "w" in flags:
            writes.add(os.path.normpath(path))
            continue
        unseen = re.sub("/+", "/", path) if "//" in path else path
        if (unseen in UNSEEN or unseen.startswith(_UNSEEN_UNDER)) and not unseen.startswith(_FILES_UNDER_DEV):
            if _THROUGH_PROC.match(unseen):
                through_proc.append(path)
            elif name in _CONTENT_READS and not _NEUTRAL_FILES.match(unseen):
                machine.append(path)
            continue
        follow = _READS[name] and "n" not in flags
        result = "ok" if err == 0 else errno.errorcode.get(err, f"E{err}")
        key = (path, follow)
        if reads.get(key) != "ok":  # a path found once was there: keep that answer
            reads[key] = result
        if name.startswith("execve") and err == 0:
            executed.add(path)
    return Trace(reads, frozenset(listed), frozenset(executed), frozenset(writes), tuple(opaque), tuple(through_proc),
                 tuple(sockets), tuple(machine), tuple(channels))


def interpreters(path: str) -> list[str]:
    """The files the kernel itself reads to start a program: an ELF's loader (PT_INTERP) or a
    script's `#!` interpreter. No system call names them, so the observer adds them."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
            if head.startswith(b"#!"):
                words = head[2:].split(b"\n", 1)[0].split()
                return [os.fsdecode(words[0])] if words else []
            if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only: pp4 runs on x86_64
                return []
            phoff, = struct.unpack_from("<Q", head, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            for i in range(phnum):
                ptype, _, offset, _, _, filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
                if ptype == 3:  # PT_INTERP
                    f.seek(offset)
                    return [os.fsdecode(f.read(filesz).rstrip(b"\0"))]
    except (OSError, struct.error, IndexError):
        return []
    return []
