"""A line a minute while ninja builds: what is built, what this run compiled and restored, the CPU
left by configure's estimate, and when the build should end.

ninja prints a line when an edge ends, so a build whose units each take minutes is silent for
minutes. The first compile edge of a `ninja` run (pp4/reuse/edge.py) starts this reporter beside
ninja, once per run (a lock in the build's state folder); it writes every PP4_PROGRESS_S seconds
(default 60) to build/.pp4/progress.log and to ninja's own output where a line can be added there
safely (a terminal, a pipe, a file opened for appending), and ends when ninja does:

    pp4: progress 12:04:31: 142 of 395 objects built (this run: 22 compiled, 120 restored), about
    41 min of CPU left by the estimate, done in about 20 min (12:24)

    python -m pp4.report.progress STATE_DIR NINJA_PID     (what the edge starts; not for users)
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import stat
import sys
import time

from pp4 import ninjarun, statedir
from pp4.sizes import human_duration

INTERVAL_ENV = "PP4_PROGRESS_S"
DEFAULT_INTERVAL_S = 60.0


def estimates_doc(jobs: int, seconds_by_output: dict[str, float]) -> str:
    """What configure writes to build/.pp4/estimates.json for the reporter."""
    return json.dumps({"jobs": jobs, "objects": seconds_by_output}, indent=1, sort_keys=True) + "\n"


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


def _outlet(ninja: int) -> tuple[str | None, bool]:
    """ninja's own output, where a line can be added without overwriting its text: a terminal, a
    pipe, or a file it appends to. (path to open for each line, is a terminal), or (None, False).
    Opened for each line and closed at once: held open, a pipe's reader would wait for the
    reporter after ninja ended."""
    path = f"/proc/{ninja}/fd/1"
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            with open(f"/proc/{ninja}/fdinfo/1") as f:
                flags = int(next(ln.split()[1] for ln in f if ln.startswith("flags:")), 8)
            if not flags & os.O_APPEND:
                return None, False
        elif not (stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode)):
            return None, False
        return path, stat.S_ISCHR(st.st_mode) and _is_terminal(path)
    except (OSError, ValueError, StopIteration):
        return None, False


def _is_terminal(path: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.isatty(fd)
    finally:
        os.close(fd)


def _say(path: str, text: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOCTTY)
    except OSError:
        return False
    try:
        os.write(fd, text.encode())
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def line(work: str, state_dir: str, estimates: dict, since: float, now: float) -> str:
    """The progress line. This run compiled or restored an object when its compile edge's event
    is newer than ninja's start (pp4/reuse/events.py), or when the prepass restored it in this run
    (in the prepass's batch, with a fresh mtime); built: present, and not being written now (newer
    than ninja's start but with no word of how yet). The CPU left is the estimate's for what is not
    built; the end comes at the pace this run kept, else at the estimate spread over the jobs."""
    objects: dict[str, float] = estimates.get("objects", {})
    fresh, present = set(), set()
    for out in objects:
        try:
            mtime = os.stat(os.path.join(work, out)).st_mtime
        except OSError:
            continue
        present.add(out)
        if mtime >= since:
            fresh.add(out)
    compiled, restored = set(), set()
    for path in glob.glob(os.path.join(state_dir, statedir.EVENTS, "*.json")):
        try:
            if os.stat(path).st_mtime >= since:
                with open(path) as f:
                    doc = json.load(f)
                (compiled if doc.get("status") == "compiled" else restored).add(doc.get("output"))
        except (OSError, ValueError, AttributeError):
            continue
    batch = statedir.part(state_dir, statedir.PREPASS_EVENTS)
    try:
        if os.stat(batch).st_mtime >= since:
            with open(batch) as f:
                restored |= (set(json.load(f).get("events", {})) & fresh) - compiled
    except (OSError, ValueError, AttributeError):
        pass
    built = present - (fresh - compiled - restored)
    left = sum(s for out, s in objects.items() if out not in built)
    done = sum(objects.get(out, 0.0) for out in compiled | restored)
    elapsed = max(now - since, 1.0)
    pace = done / elapsed if done else float(max(estimates.get("jobs", 1), 1))  # estimated CPU-s per second
    eta = left / pace
    clock = time.strftime("%H:%M", time.localtime(now + eta))
    return (f"pp4: progress {time.strftime('%H:%M:%S', time.localtime(now))}: {len(built)} of {len(objects)} "
            f"objects built (this run: {len(compiled & built)} compiled, {len(restored & built)} restored), about "
            f"{human_duration(left)} of CPU left by the estimate, done in about {human_duration(eta)} ({clock})")


def report(state_dir: str, ninja: int) -> int:
    lock = os.open(statedir.part(state_dir, statedir.PROGRESS_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another edge started this run's reporter first
    since = ninjarun.started(ninja)
    if since is None:
        return 0
    try:
        work = os.readlink(f"/proc/{ninja}/cwd")
        with open(statedir.part(state_dir, statedir.ESTIMATES)) as f:
            estimates = json.load(f)
    except (OSError, ValueError):
        return 0
    try:
        interval = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S))
    except ValueError:
        interval = DEFAULT_INTERVAL_S
    out, terminal = _outlet(ninja)
    log_path = statedir.part(state_dir, statedir.PROGRESS_LOG)
    open(log_path, "w").close()  # this run's lines only
    next_at = time.time() + interval
    while ninjarun.started(ninja) == since:  # ninja still runs (the same process, not a reused pid)
        time.sleep(min(1.0, interval))
        now = time.time()
        if now < next_at or ninjarun.started(ninja) != since:
            continue
        next_at = now + interval
        text = line(work, state_dir, estimates, since, now)
        with open(log_path, "a") as log:
            log.write(text + "\n")
        # On a terminal, over ninja's status line, which ninja draws again.
        if out is not None and not _say(out, ("\r\x1b[K" if terminal else "") + text + "\n"):
            out = None
    return 0


if __name__ == "__main__":
    sys.exit(report(sys.argv[1], int(sys.argv[2])))
