"""The observer: every path a command and all its children opened, looked at, listed or ran.

A compile's inputs are whatever its processes asked the kernel about, not what a model of gcc or
nvcc says they read: nvcc's passes, the host compiler's cc1plus and as, a data file an `.incbin`
pulls in, a response file, a header looked for and not found, the shared libraries the loader
maps. The command runs under strace with a seccomp-bpf filter (`--seccomp-bpf -f`: only the traced
system calls stop the process, so a compile pays for its file system calls and nothing else) and
every process it starts is followed. The log is parsed into a `Trace`: for each path, how it was
reached (following links or not) and whether the kernel found something there; the folders listed;
the paths written, created, renamed or removed; and what could not be understood.

What is not seen: time (the compilers are asked about it instead: -Wdate-time, pp4/execution/run.py),
/proc, /sys and /dev (left out below: a compile that reads the CPU's features from /proc changes
with the machine, which no key here covers), and anything that reaches a file without a path (an fd
passed in from outside). docs/reuse.md says what that leaves open.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import struct
import subprocess

import attrs

# strace's class %file is every call that takes a path; the rest give the tree of processes, the
# working folder and the listings.
TRACED = "%file,getdents64,getdents,fchdir,clone,clone3,fork,vfork"
UNSEEN = ("/proc", "/sys", "/dev")

_LINE = re.compile(r"^(\d+) +(.*)$")
_CALL = re.compile(r"^([a-z0-9_]+)\((.*)\) += (-?\d+|\?|0x[0-9a-f]+)(?:<((?:[^>\\]|\\.)*)>)?(?: (E[A-Z0-9]+) .*)?$")
_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"(\.\.\.)?|(AT_FDCWD|-?\d+)<((?:[^>\\]|\\.)*)>')
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|[0-7]{1,3}|.)")
_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "v": "\v", "f": "\f", "\\": "\\", '"': '"', "'": "'", "<": "<", ">": ">"}

WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND", "O_TMPFILE")
# Calls whose only path arguments are read, and whether they follow a final link.
_READS = {"open": (0, True), "openat": (1, True), "openat2": (1, True), "stat": (0, True), "lstat": (0, False),
          "newfstatat": (1, True), "fstatat64": (1, True), "statx": (1, True), "access": (0, True),
          "faccessat": (1, True), "faccessat2": (1, True), "readlink": (0, False), "readlinkat": (1, False),
          "execve": (0, True), "statfs": (0, True), "getxattr": (0, True), "lgetxattr": (0, False),
          "listxattr": (0, True), "llistxattr": (0, False), "getcwd": (None, True)}
# Calls that change the file system: (indexes of path arguments, with the dirfd before each *at one).
_WRITES = {"creat": (0,), "unlink": (0,), "unlinkat": (1,), "rmdir": (0,), "mkdir": (0,), "mkdirat": (1,),
           "rename": (0, 1), "renameat": (1, 3), "renameat2": (1, 3), "link": (0, 1), "linkat": (1, 3),
           "symlink": (1,), "symlinkat": (2,), "chmod": (0,), "fchmodat": (1,), "chown": (0,), "lchown": (0,),
           "fchownat": (1,), "truncate": (0,), "utime": (0,), "utimes": (0,), "utimensat": (1,),
           "futimesat": (1,), "mknod": (0,), "mknodat": (1,), "setxattr": (0,), "lsetxattr": (0,),
           "removexattr": (0,), "lremovexattr": (0,)}
_FORKS = {"clone", "clone3", "fork", "vfork"}
_FREE = {"close", "chdir", "fchdir", "getdents64", "getdents", "chroot", "umount2", "swapoff"}


@attrs.frozen
class Trace:
    """What one command's process tree asked about paths."""
    reads: dict  # (path, follows a final link) -> "ok" or the errno name the kernel answered
    listed: frozenset  # folders whose entries were read
    executed: frozenset  # programs run (their interpreters are read by the kernel, unseen)
    writes: frozenset  # paths created, written, renamed, removed (normalized)
    opaque: tuple  # lines that could not be understood: an observation that cannot be trusted


def strace_path() -> str | None:
    return shutil.which("strace", path="/usr/bin:/bin:/usr/local/bin:" + os.environ.get("PATH", ""))


@functools.lru_cache(maxsize=None)
def unavailable() -> str | None:
    """Why commands cannot be observed here, or None. Asked once per process: strace must exist
    and be able to trace with a seccomp filter (ptrace can be forbidden by a container's policy).
    PP4_NO_OBSERVER=1 turns it off (to see what a machine without it does)."""
    if os.environ.get("PP4_NO_OBSERVER"):
        return "PP4_NO_OBSERVER is set"
    strace = strace_path()
    if strace is None:
        return "strace is not installed (Debian: apt-get install strace)"
    try:
        proc = subprocess.run([strace, "-f", "--seccomp-bpf", "-qq", "-e", "trace=%file", "-o", "/dev/null",
                               "/bin/true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"strace cannot run ({e})"
    if proc.returncode != 0:
        return f"strace cannot trace here: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
    return None


def command(log: str) -> list[str]:
    """The prefix that runs a command under the observer, writing its log to `log`."""
    return [strace_path() or "strace", "-f", "--seccomp-bpf", "-qq", "-y", "-s", "65535", "-e", "signal=none",
            "-e", f"trace={TRACED}", "-o", log, "--"]


def unescape(text: str) -> str:
    """A string as strace printed it (C escapes), as the bytes the call got, decoded as file names are."""
    if "\\" not in text:
        return text

    def one(m: re.Match) -> str:
        e = m.group(1)
        if e[0] == "x" and len(e) == 3:
            return chr(int(e[1:], 16))
        if e[0] in "01234567":
            return chr(int(e, 8))
        return _SIMPLE.get(e, e)

    raw = _ESCAPE.sub(one, text)
    return os.fsdecode(raw.encode("latin-1")) if any(ord(c) > 127 for c in raw) else raw


def _args(text: str) -> list:
    """A call's top-level arguments, each (kind, value, extra): ("str", text, truncated) for a
    quoted string, ("fd", path, fd or "AT_FDCWD") for a descriptor strace named (-y), ("raw", text,
    False) for anything else (flags, numbers), ("struct", "", False) for a {...} or [...]."""
    out, depth, i = [], 0, 0
    while i < len(text):
        c = text[i]
        if c in "{[":
            if depth == 0:
                out.append(("struct", "", False))
            depth += 1
        elif c in "}]":
            depth -= 1
        elif depth == 0 and c not in ", ":
            m = _TOKEN.match(text, i)
            if m and m.group(1) is not None:
                out.append(("str", unescape(m.group(1)), bool(m.group(2))))
                i = m.end()
                continue
            if m and m.group(4) is not None:
                out.append(("fd", unescape(m.group(4)), m.group(3)))
                i = m.end()
                continue
            end = i
            while end < len(text) and text[end] not in ",{[":
                end += 1
            out.append(("raw", text[i:end].strip(), False))
            i = end
            continue
        i += 1
    return out


def parse(log_text: str, cwd: str) -> Trace:
    """The trace of one observed command; cwd: the folder it started in."""
    reads: dict[tuple[str, bool], str] = {}
    listed, executed, writes, opaque = set(), set(), set(), []
    cwds: dict[str, str] = {}
    pending: dict[str, str] = {}
    first = None

    def record(path: str, follow: bool, result: str) -> None:
        if path == UNSEEN or any(path == u or path.startswith(u + "/") for u in UNSEEN):
            return
        key = (path, follow)
        if key not in reads or reads[key] != "ok":  # a path found once was there: keep that answer
            reads[key] = result

    for line in log_text.splitlines():
        m = _LINE.match(line)
        if not m:
            if line.strip():
                opaque.append(line)
            continue
        pid, rest = m.groups()
        if first is None:
            first = pid
        if rest.endswith("<unfinished ...>"):
            pending[pid] = rest[: -len("<unfinished ...>")].rstrip()
            continue
        if rest.startswith("<... "):
            head = pending.pop(pid, None)
            close = rest.find(" resumed>")
            if head is None or close < 0:
                opaque.append(line)
                continue
            rest = head + rest[close + len(" resumed>"):]
        if rest.startswith("+++") or rest.startswith("---"):
            continue
        call = _CALL.match(rest)
        if not call:
            opaque.append(line)
            continue
        name, argtext, ret, retfd, errno = call.groups()
        here = cwds.get(pid, cwd)
        args = _args(argtext)
        if name in _FORKS:
            if ret.isdigit():
                cwds[ret] = here
            continue
        # -y names the working folder at every *at call: the best source for this process's.
        for kind, value, tag in args:
            if kind == "fd" and tag == "AT_FDCWD":
                cwds[pid] = here = value

        def path_at(index: int | None) -> str | None:
            """The path a call names at argument `index`; an *at call's dirfd is the one before it."""
            if index is None or index >= len(args) or args[index][0] != "str":
                return None
            p = args[index][1]
            if p.startswith("/"):
                return p
            base = here
            if index > 0:
                kind, value, _ = args[index - 1]
                if kind == "fd":
                    base = value
                elif value != "AT_FDCWD":
                    return None  # a folder strace could not name
            return base if p == "" else os.path.join(base, p)

        failed = errno if ret.startswith("-") else None
        if name in ("chdir", "fchdir"):
            if failed is None:
                target = path_at(0) if name == "chdir" else (args[0][1] if args and args[0][0] == "fd" else None)
                if target is None:
                    opaque.append(line)
                else:
                    cwds[pid] = target
            continue
        if name in ("getdents64", "getdents"):
            if args and args[0][0] == "fd":
                if failed is None:
                    listed.add(args[0][1])
            else:
                opaque.append(line)
            continue
        if name in _WRITES:
            for index in _WRITES[name]:
                p = path_at(index)
                if p is None:
                    opaque.append(line)
                else:
                    writes.add(os.path.normpath(p))
            continue
        if name in _READS:
            index, follow = _READS[name]
            if index is None:
                continue
            if any(k == "str" and trunc for k, _, trunc in args):
                opaque.append(line)  # a path longer than strace printed
                continue
            p = path_at(index)
            if p is None:
                opaque.append(line)
                continue
            if name in ("newfstatat", "fstatat64", "statx", "faccessat2") and "AT_SYMLINK_NOFOLLOW" in argtext:
                follow = False
            if name in ("newfstatat", "fstatat64", "statx") and args[index][1] == "" and "AT_EMPTY_PATH" in argtext:
                continue  # a stat of an open file: its open was seen
            if name in ("open", "openat", "openat2"):
                if any(f in argtext for f in WRITE_FLAGS):
                    writes.add(os.path.normpath(p))
                    continue
                if "O_NOFOLLOW" in argtext:
                    follow = False
            if name == "readlink" or name == "readlinkat":
                result = "ok" if failed in (None, "EINVAL") else failed
            else:
                result = "ok" if failed is None else failed
            record(p, follow, result)
            if name == "execve" and failed is None:
                executed.add(p)
            continue
        if name in _FREE:
            continue
        opaque.append(line)  # a call of the %file class this parser does not know
    for pid, head in pending.items():
        opaque.append(f"{pid} {head} <unfinished: the process was killed in the call>")
    return Trace(reads, frozenset(listed), frozenset(executed), frozenset(writes), tuple(opaque))


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
