"""A service that failed is left alone for a while by every process of a build: the first process
to find it down leaves a marker file and says so once; the others see the marker and go on without
it until the marker is RETRY_S old (the remote store, the compile cluster)."""

from __future__ import annotations

import os
import time
from pathlib import Path

RETRY_S = 60.0


def recently_down(folder: Path, retry_s: float = RETRY_S) -> bool:
    try:
        return time.time() - (folder / "down").stat().st_mtime < retry_s
    except OSError:
        return False


def mark_down(folder: Path, reason: str, retry_s: float = RETRY_S) -> bool:
    """Record that the service failed; True when this process is the first to record it (and
    should say so)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fresh = not recently_down(folder, retry_s)
        tmp = folder / f".down.{os.getpid()}"
        tmp.write_text(reason + "\n")
        os.replace(tmp, folder / "down")
    except OSError:
        fresh = True
    return fresh
