"""The CPU time a group of processes used, read from /proc: what a limit on a step pp4 runs counts.

Wall time is no measure of a step's work on a busy machine, least of all of a step pp4 itself runs
at nice 19 (a --setup-py project's wheel stage: issue 55, a setup.py stopped at 300 s of wall time
after 3.6 CPU-seconds). A step started in a process group of its own is measured as every process
of that group: each one's user and system time, and its children's that it has waited for (cutime
and cstime: processes that ended), so nothing is counted twice. A group, not a session: a new
session is a new scheduler autogroup, which would undo the nice the step runs at.
"""

from __future__ import annotations

import os

from pp4.ninjarun import proc_stat

# Fields of /proc/PID/stat after the command name: process group at 2, utime 11, stime 12, cutime 13, cstime 14.
_PGRP, _UTIME, _CSTIME = 2, 11, 14


def group_cpu_seconds(group: int) -> float:
    """User + system CPU seconds of every process in the process group (its ended children included)."""
    ticks = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        found = proc_stat(int(name))
        if found is None:
            continue  # ended while we looked
        fields = found[1]
        if int(fields[_PGRP]) == group:
            ticks += sum(int(v) for v in fields[_UTIME:_CSTIME + 1])
    return ticks / os.sysconf("SC_CLK_TCK")
