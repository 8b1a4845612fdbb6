"""The progress reporter of a ninja run (pp4/report/progress.py) is started here, by the first
compile edge of the run, by module name: the reuse rule that runs the edge never loads the report.
The lock it is started under lives in the build's state folder."""

from __future__ import annotations

import fcntl
import os
import sys

from pp4 import ninjarun, statedir


def ensure_running(state_dir: str) -> None:
    """Start this ninja run's reporter unless one runs: called by every compile edge, it costs a
    lock attempt when one does."""
    try:
        fd = os.open(statedir.part(state_dir, statedir.PROGRESS_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return  # this run's reporter holds it
    os.close(fd)  # the reporter takes the lock itself; a second one started meanwhile finds it taken
    ninja = ninjarun.ninja_ancestor()
    if ninja is None:  # run by hand, not by ninja: nobody to report to
        return
    import subprocess  # here: every compile edge imports this module, one a run starts the reporter

    subprocess.Popen([sys.executable, "-m", "pp4.report.progress", str(state_dir), str(ninja)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)
