"""Folders of files named by the sha256 of their bytes (`<folder>/<2 hex>/<sha256>`).

The store keeps the reuse rule's set packs this way (pp4/store/packs.py), and a build keeps its own
copies in its state folder. What the bytes mean is the writer's business; this module makes sure a file is
never used, or written, under a name its bytes do not hash to, so verify needs no knowledge of
the content.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from pp4.files import write_whole


def named_files(folder: str | Path):
    """The files kept under a name (staging files of write_whole start with a dot and are not)."""
    return (p for p in Path(folder).glob("*/*") if not p.name.startswith("."))


def path_of(folder: str | Path, name: str) -> Path:
    return Path(folder) / name[:2] / name


def write(folder: str | Path, name: str, data: bytes) -> None:
    """Keep data under its name, unless an intact copy is there already. ValueError when the
    bytes do not hash to the name: a copy can never name other content than its source."""
    if hashlib.sha256(data).hexdigest() != name:
        raise ValueError(f"bytes do not hash to {name}")
    path = path_of(folder, name)
    if read(folder, name) is None:
        write_whole(path, data)
    else:  # used again: young again, so that gc's grace period covers it until something names it
        try:
            os.utime(path)
        except OSError:
            pass


def link(folder: str | Path, name: str, source: str | Path, data: bytes) -> None:
    """Keep under its name in folder the file source (in another such folder), whose bytes data
    were just read and checked against the name: a hard link where the two folders share a
    filesystem (nothing ever writes such a file in place, and a store's gc only unlinks its own
    name), a copy elsewhere."""
    if hashlib.sha256(data).hexdigest() != name:
        raise ValueError(f"bytes do not hash to {name}")
    path = path_of(folder, name)
    sub = str(path.parent)
    if sub not in _made:
        os.makedirs(sub, exist_ok=True)
        _made.add(sub)
    try:
        os.link(source, path)
        return
    except FileExistsError:
        try:
            if os.path.samefile(source, path):
                return
        except OSError:
            pass
    except OSError:  # another filesystem, or links not allowed there
        pass
    write(folder, name, data)


_made: set[str] = set()  # folders this process made or found: each asked about once


def read(folder: str | Path, name: str) -> bytes | None:
    """The bytes kept under a name; None when missing or when they do not hash to it."""
    try:
        data = path_of(folder, name).read_bytes()
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == name else None


def verify(folder: str | Path, repair: bool) -> list[tuple[str, str, bool]]:
    """Damaged files: (path, what is wrong, removed). Removing one only turns what names it into
    a miss."""
    damage = []
    for path in sorted(named_files(folder)):
        if read(folder, path.name) is None:
            if repair:
                path.unlink(missing_ok=True)
            damage.append((str(path), "its bytes do not hash to its name", repair))
    return damage


def collect(folder: str | Path, keep: set[str], older_than_s: float) -> int:
    """Remove the files no one names (not in keep) that were last written or used more than
    older_than_s ago: a writer names a file only after writing it. Returns how many went."""
    limit = time.time() - older_than_s
    removed = 0
    for path in named_files(folder):
        if path.name in keep:
            continue
        try:
            if path.stat().st_mtime < limit:
                path.unlink()
                removed += 1
        except FileNotFoundError:
            continue
    return removed
