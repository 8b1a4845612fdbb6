"""Whole-build CPU for the benches. A ninja run's compile server (pp4/reuse/server.py) and its
progress reporter outlive the edge that started them, so their CPU, and that of the server's
workers (which run the compiles), never reaches the process that ran ninja: `time ninja` and
RUSAGE_CHILDREN leave it out. A bench that times builds makes itself a child subreaper: those
orphans become its children, and once ninja has ended it waits for them, so RUSAGE_CHILDREN holds
the whole build."""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed: whole-build CPU cannot be counted")


def reap_orphans(timeout_s: float = 120.0, keep: tuple[int, ...] = ()) -> int:
    """Wait for every child left but those in keep (a server the bench runs for the whole of it);
    call it when no subprocess of the bench's own is running. How many were reaped."""
    reaped, deadline = 0, time.monotonic() + timeout_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid:
            reaped += 1
        elif keep and set(_children()) <= set(keep):
            return reaped
        elif time.monotonic() > deadline:
            raise TimeoutError(f"processes a build left behind still run after {timeout_s:.0f} s")
        else:
            time.sleep(0.05)


def _children() -> list[int]:
    """This process's children now, from /proc (every thread's list: a child belongs to the thread
    that started it)."""
    found = []
    for task in Path("/proc/self/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def main(argv: list[str]) -> int:
    """python bench/common/accounting.py LABEL CMD...: run CMD, then wait for what it left running, and
    print `LABEL: W s wall, U+S CPU-s` (the format of `/usr/bin/time -f "%e s wall, %U+%S CPU-s"`) to
    stderr, for the whole build. Exits with CMD's status."""
    import resource
    import subprocess
    import sys

    label, cmd = argv[0], argv[1:]
    become_subreaper()
    t0 = time.monotonic()
    status = subprocess.run(cmd).returncode
    reap_orphans()
    wall = time.monotonic() - t0
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"{label}: {wall:.2f} s wall, {r.ru_utime:.2f}+{r.ru_stime:.2f} CPU-s", file=sys.stderr)
    return status


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
