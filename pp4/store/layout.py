"""Small file operations on the store's folders, shared by its writers (local.py), its size
accounting and eviction (usage.py) and its verification (verify.py)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

# Where a store, and a build's state folder, keep set packs (pp4/store/packs.py); the store's gc
# removes the ones no manifest entry names, a build's prepass the ones no event names.
SETS_FOLDER = "setpacks"


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def unlink_quietly(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def iter_shard_files(top: Path) -> Iterator[os.DirEntry]:
    """Files in top/<shard>/; tolerates directories vanishing under a concurrent gc."""
    try:
        shards = list(os.scandir(top))
    except FileNotFoundError:
        return
    for shard in shards:
        if not shard.is_dir(follow_symlinks=False):
            continue
        try:
            entries = list(os.scandir(shard.path))
        except FileNotFoundError:
            continue
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                yield entry
