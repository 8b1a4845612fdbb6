"""Files: generated ones written only when their content changes, atomically; hashing; the one
canonical JSON form that is hashed; folder locks.

A re-run that produces the same content touches nothing, so ninja sees no new mtimes and a second
`python configure.py && ninja` does no work.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path

READ_CHUNK = 1 << 20


def sha256_file(path: Path | str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return sha256_fd(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def sha256_and_size(path: Path | str) -> tuple[str, int]:
    """(sha256, size) of a file's bytes, the size being what was read."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        h, size = hashlib.sha256(), 0
        buf = bytearray(READ_CHUNK)
        view = memoryview(buf)
        while n := os.readv(fd, [buf]):
            h.update(view[:n])
            size += n
        return h.hexdigest(), size
    finally:
        os.close(fd)


def canonical_json(value) -> bytes:
    """The bytes of a JSON value that pp4 hashes or compares: sorted keys, no spaces, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def fsync_dir(path: Path | str) -> None:
    """Make a new or renamed entry of a folder durable across power loss, not just process death."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_fd(fd: int, size: int) -> str:
    """sha256 of an open file's bytes; plain os.read for small files, which for the audit's 7,000
    small headers costs half what a Python file object does, and reads into one reused buffer for
    big ones.  (A read-only mapping cost the same CPU on 1 GB of objects, measured, and would turn
    a file truncated while it is hashed into a SIGBUS, so it is not used.)"""
    h = hashlib.sha256()
    if size < READ_CHUNK:
        while chunk := os.read(fd, READ_CHUNK):
            h.update(chunk)
        return h.hexdigest()
    buf = bytearray(READ_CHUNK)
    view = memoryview(buf)
    while n := os.readv(fd, [buf]):
        h.update(view[:n])
    return h.hexdigest()


@contextmanager
def locked(directory: Path):
    """One writer at a time for a folder (a .lock file in it, flock'd exclusively)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_whole(path: Path, content: str | bytes, mode: int = 0o666) -> None:
    """Write a file whole, then rename it into place: a reader sees the old file or the new one,
    never part of it, and a writer killed half-way leaves no partial file under the name. mode: at
    most these permissions (the umask takes more away)."""
    data = content.encode() if isinstance(content, str) else content
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode), "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_if_changed(path: Path, content: str | bytes) -> bool:
    """Write content to path unless it already holds exactly that; True when it wrote."""
    data = content.encode() if isinstance(content, str) else content
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    write_whole(path, data)
    return True
