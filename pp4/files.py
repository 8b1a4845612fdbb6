"""Files: generated ones written only when their content changes, atomically; hashing; folder locks.

A re-run that produces the same content touches nothing, so ninja sees no new mtimes and a second
`python configure.py && ninja` does no work.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from contextlib import contextmanager
from pathlib import Path


def sha256_file(path: Path | str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


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


def write_if_changed(path: Path, content: str | bytes) -> bool:
    """Write content to path unless it already holds exactly that; True when it wrote."""
    data = content.encode() if isinstance(content, str) else content
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return True
