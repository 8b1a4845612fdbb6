"""The observer: every path a command and all its children opened, looked at, listed or ran, every
program they started and with what, and every other call that could bring in what pp4 cannot key.

A compile's inputs are whatever its processes asked the kernel about, not what a model of gcc or
nvcc says they read: nvcc's passes, the host compiler's cc1plus and as, a data file an `.incbin`
pulls in, a response file, a header looked for and not found, the shared libraries the loader
maps. The command runs under pp4-observe (observer.c, built here with the host C compiler on first
use): a seccomp filter that every process the command starts inherits lets through the calls of
its table that learn nothing from outside (memory, signals, a process's own descriptors) and hands
every other call to it, which reads the paths, looks at what is there, and lets the call go on; a
call it cannot observe (a socket, another process's memory, the machine's name, a call its table
does not know) is logged as such, and the compile is never stored. Its log is parsed into a
`Trace`.

What is not seen: the clock, randomness, resource limits and the user's ids, which real compiles
read and whose answers change none of their objects (observer.c's UNKEYED class; docs/reuse.md
says why each is safe or not), the CPU's own answers to the `cpuid` instruction (pp4/reuse/
nativecpu.py keys what a compiler driver makes of them), /proc, /sys and /dev but the files named
below, and a file reached through a descriptor passed in from outside (a compile gets /dev/null and
files of its own as its standard streams: pp4/execution/run.py).
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
# path, the kernel's overcommit setting, the list of file systems libselinux checks, random bytes,
# the null device), a process's own folder links (what they name is seen where it is read), the
# standard streams (a compile's input is /dev/null), and the NVIDIA driver's files, which
# `-arch=native` reaches through the driver and which pp4 keys through nvcc's dry run instead.
# Every other file there describes the machine or the run (its CPU, kernel, mounts, load, uptime,
# cgroups, a process's status, a device's contents): a compile that reads one is not keyed on it,
# so it is never stored.
_NEUTRAL_FILES = re.compile(r"^/dev/(?:null|zero|full|random|urandom|stdin|stdout|stderr|nvidia[^/]*|nvidia-caps/.+)$"
                            r"|^/proc/(?:self|thread-self|\d+)(?:/task/\d+)?/(?:exe|cwd|root|fd|fd/\d+)$"
                            r"|^/proc/(?:sys/vm/overcommit_memory|filesystems)$|^/proc/driver/nvidia/"
                            r"|^/sys/module/nvidia|^/sys/fs/selinux$")
# Files under /sys that are keyed like any other file, by their bytes: the CPUs this machine has
# (glibc's sysconf(_SC_NPROCESSORS_ONLN) reads `online`). Real compiles do not read them; a tool
# that sizes its work by them is keyed on them (the CPU set a process may use is answered by
# pp4-observe, the same everywhere: observer.c).
_KEYED_UNDER_SYS = re.compile(r"^/sys/devices/system/cpu/(?:online|possible|present)$")
# What asks the GPU driver: nvcc's -arch=native does (pp4/reuse/nativecpu.py keys what nvcc makes
# of it); any other program that does is asking something pp4 cannot key.
_GPU_DRIVER = re.compile(r"^/dev/nvidia|^/proc/driver/nvidia")
# The calls that read what a file holds (or what a link names): a stat or an access of a file
# there says only that it exists.
_CONTENT_READS = {"open", "openat", "openat2", "readlink", "readlinkat", "execve", "execveat"}

# Calls that read a path, and whether they follow a final link (the log's 'n' flag can say not).
_READS = {"open": True, "openat": True, "openat2": True, "stat": True, "lstat": False, "newfstatat": True,
          "statx": True, "access": True, "faccessat": True, "faccessat2": True, "readlink": False,
          "readlinkat": False, "execve": True, "execveat": True}
# Calls that read a path's extended attributes (an attribute by name, or the list of names).
_XATTR_READS = {"getxattr", "lgetxattr", "fgetxattr", "getxattrat"}
_XATTR_LISTS = {"listxattr", "llistxattr", "flistxattr", "listxattrat"}
# Calls that change the file system (by path, or through a descriptor: fchmod and the like).
_WRITES = {"creat", "unlink", "unlinkat", "rmdir", "mkdir", "mkdirat", "rename", "renameat", "renameat2", "link",
           "linkat", "symlink", "symlinkat", "chmod", "fchmodat", "fchmodat2", "chown", "lchown", "fchownat",
           "truncate", "utime", "utimes", "utimensat", "futimesat", "mknod", "mknodat", "setxattr", "lsetxattr",
           "removexattr", "lremovexattr", "setxattrat", "removexattrat", "fchmod", "fchown", "fsetxattr",
           "fremovexattr"}
_LISTS = {"getdents", "getdents64"}
# A connect to a Unix socket with nothing at its path (pp4-observe reports every other connect as
# unstorable): an absence, observed like any other.
_CONNECTS = {"connect"}
# The observer resolves each path against the caller's folder itself: a change of folder needs nothing.
_FREE = {"chdir", "fchdir"}
_ESCAPE = re.compile(r"\\(.)")
_ESCAPED = {"t": "\t", "n": "\n", "\\": "\\"}


@attrs.frozen
class Exec:
    """A program a command started (after an execve that found it): what it was started with."""
    pid: int
    ppid: int
    program: str  # the path execve was given, as the process named it
    argv: tuple[str, ...]
    env: tuple[str, ...]  # NAME=VALUE

    def getenv(self, name: str) -> str | None:
        prefix = name + "="
        return next((e[len(prefix):] for e in self.env if e.startswith(prefix)), None)


@attrs.frozen
class Unstorable:
    """A system call pp4 cannot observe (observer.c's class UNSTORABLE, an unknown call, an ioctl
    or fcntl request that asks beyond the process): the compile is never stored."""
    call: str
    program: str
    detail: str = ""


@attrs.frozen
class Trace:
    """What one command's process tree asked about paths, and what else it asked the kernel."""
    reads: dict  # (path, follows a final link) -> "ok" or the errno name of what was there
    listed: frozenset  # folders whose entries were read
    executed: frozenset  # programs run (their interpreters are read by the kernel, unseen)
    writes: frozenset  # paths created, written, renamed, removed (normalized)
    opaque: tuple  # lines that could not be understood: an observation that cannot be trusted
    through_proc: tuple = ()  # paths read through a process's folder link under /proc: not trusted either
    machine: tuple = ()  # a file under /proc, /sys or /dev that describes the machine or the run
    unstorable: tuple = ()  # Unstorable calls, each call and program once
    execs: tuple = ()  # Exec: every program started, with its arguments and environment
    xattrs: dict = attrs.field(factory=dict)  # (path, follows, attribute name or None: the list) -> result
    gpu: tuple = ()  # pids that asked the GPU driver (opened or looked at /dev/nvidia*, /proc/driver/nvidia)

    def program_of(self, pid: int) -> str | None:
        """The program a process was running when it last started one (None: it never ran one here)."""
        found = None
        for e in self.execs:
            if e.pid == pid:
                found = e.program
        return found


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
    xattrs: dict[tuple[str, bool, str | None], str] = {}
    listed, executed, writes, opaque, through_proc, machine, gpu = set(), set(), set(), [], [], [], []
    unstorable: list[Unstorable] = []
    execs: list[Exec] = []
    last_exec: dict[str, str] = {}  # pid -> the program its last found execve named
    for line in log_text.splitlines():
        fields = line.split("\t")
        if len(fields) >= 5 and fields[1] == "+exec":
            if "?" in fields[3] or not fields[2].isdigit() or not fields[4].isdigit() or fields[0] not in last_exec:
                opaque.append(line[:400])  # arguments that could not be read: what it was told is unknown
                continue
            words = [_unescape(f) for f in fields[5:]]
            argc = int(fields[4])
            execs.append(Exec(int(fields[0]), int(fields[2]), last_exec[fields[0]], tuple(words[:argc]),
                              tuple(words[argc:])))
            continue
        if len(fields) < 5 or not fields[2].isdigit():
            opaque.append(line)  # a line cut short
            continue
        name, err, flags = fields[1], int(fields[2]), fields[3]
        if "!" in flags:
            unstorable.append(Unstorable(name, _unescape(fields[4]), _unescape(fields[5]) if len(fields) > 5 else ""))
            continue
        if "?" in flags:
            opaque.append(line)  # a path the observer could not read
            continue
        paths = [_unescape(f) for f in fields[4:]]
        if name in _FREE:
            continue
        if name in _LISTS:
            if err == 0:
                listed.add(paths[0])
            continue
        if name in _WRITES:
            writes.update(os.path.normpath(p) for p in paths)
            continue
        if name in _CONNECTS:
            if reads.get((paths[0], True)) != "ok":
                reads[(paths[0], True)] = errno.errorcode.get(err, f"E{err}")
            continue
        if name in _XATTR_READS or name in _XATTR_LISTS:
            if not paths[0]:
                opaque.append(line)
                continue
            attribute = paths[1] if name in _XATTR_READS and len(paths) > 1 else None
            xattrs.setdefault((paths[0], "n" not in flags, attribute), "ok" if err == 0 else errno.errorcode.get(err, f"E{err}"))
            continue
        if name not in _READS:
            opaque.append(line)  # a call this parser does not know: nothing pp4 can judge
            continue
        path = paths[0]
        if "e" in flags and not path:
            continue  # a stat of an open file: its open was seen
        if "w" in flags:
            writes.add(os.path.normpath(path))
            continue
        unseen = re.sub("/+", "/", path) if "//" in path else path
        if _GPU_DRIVER.match(unseen):
            gpu.append(int(fields[0]))
        if (unseen in UNSEEN or unseen.startswith(_UNSEEN_UNDER)) and not unseen.startswith(_FILES_UNDER_DEV) \
                and not _KEYED_UNDER_SYS.match(unseen):
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
            last_exec[fields[0]] = path
    return Trace(reads, frozenset(listed), frozenset(executed), frozenset(writes), tuple(opaque), tuple(through_proc),
                 tuple(machine), tuple(dict.fromkeys(unstorable)), tuple(execs), xattrs, tuple(dict.fromkeys(gpu)))


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


# What each call pp4-observe reports as unstorable brings in, for the reason a compile's event gives.
_BRINGS = [
    (("connect", "accept", "accept4", "bind", "listen", "sendto", "sendmsg", "sendmmsg"),
     "a socket reaches another process or the network, whose answers no file shows"),
    (("uname",), "it tells the machine's name and kernel release"),
    (("shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semctl",
      "semtimedop", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr"),
     "it reads what another process left (System V or POSIX IPC)"),
    (("process_vm_readv", "process_vm_writev", "ptrace", "pidfd_getfd", "kcmp", "process_madvise",
      "process_mrelease"), "it reaches another process's memory or descriptors"),
    (("keyctl", "add_key", "request_key"), "it reads the kernel's key store"),
    (("mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount",
      "fspick", "mount_setattr", "open_tree_attr", "setns", "unshare"),
     "after it a path can name other bytes than the ones pp4 checks"),
    (("io_uring_setup", "io_uring_enter", "io_uring_register", "io_setup", "io_submit", "io_getevents",
      "io_pgetevents", "io_cancel", "io_destroy"), "its requests read files without a call the observer sees"),
    (("statfs", "fstatfs", "ustat", "statmount", "listmount", "cachestat", "mincore", "file_getattr"),
     "it tells about a file system, the page cache or a file's attributes beyond its bytes"),
    (("inotify_add_watch", "fanotify_init", "fanotify_mark"), "it learns of other processes' changes to files"),
    (("name_to_handle_at", "open_by_handle_at"), "a file handle names a file without its path"),
]


def why_unstorable(u: Unstorable) -> str:
    """Why a compile that made this call is not stored, in words."""
    what = next((why for calls, why in _BRINGS if u.call in calls), None)
    if u.call in ("ioctl", "fcntl"):
        what = f"{u.detail}: a request that asks beyond the process's own descriptors"
    elif u.call == "foreign-abi":
        what = f"{u.detail}, which pp4-observe's table does not cover"
    elif u.call.startswith("syscall-"):
        what = "a system call pp4-observe's table does not know (a kernel newer than pp4?)"
    elif what is None:
        what = "pp4 cannot observe what it brings in"
    return f"it made the system call {u.call} ({u.program}): {what}"
