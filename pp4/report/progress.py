"""A line a minute while ninja builds: how many of the objects of the targets asked for are built,
what this run compiled and restored, the CPU left, the CPU the build is getting, and when it
should end.

ninja prints a line when an edge ends, so a build whose units each take minutes is silent for
minutes. The first compile edge of a `ninja` run (pp4/reuse/edge.py) starts this reporter beside
ninja, once per run (a lock in the build's state folder); it writes every PP4_PROGRESS_S seconds
(default 60) to build/.pp4/progress.log and to ninja's own output where a line can be added there
safely (a terminal, a pipe, a file opened for appending), and ends when ninja does:

    pp4: progress 12:04:31: 142 of 190 objects of p2p built (this run: 22 compiled, 120 restored),
    about 41 min of CPU left, the build gets 1.6 CPUs: done in about 26 min (12:30)

Counted: the objects of the targets ninja was asked for (build/actions.json's "target" of each
compile; the default target, `all`, and a target that names no module count every object). The
CPU left: configure's estimate (build/.pp4/estimates.json, in this machine's seconds: see
pp4/plan/estimate.py's machine speed) of each object not built, times how this run's own compiles
compared with their estimates, less what the compiles running now have already spent. The CPU the
build gets: measured, the CPU time of ninja's processes and of its compile server's over the last
few minutes against the wall clock, so a machine shared with other work shows in every line. When
ninja ends, the reporter adds this run's compiles to this machine's speed record.

    python -m pp4.report.progress STATE_DIR NINJA_PID     (what the edge starts; not for users)
"""

from __future__ import annotations

import contextlib
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


def estimates_doc(jobs: int, seconds_by_output: dict[str, float], h200_by_output: dict[str, float]) -> str:
    """What configure writes to build/.pp4/estimates.json for the reporter: each object's CPU
    seconds on this machine as configure expects them, and, for those not timed by this build
    before, the H200 figure that was scaled to this machine (what the reporter learns the
    machine's speed from)."""
    return json.dumps({"jobs": jobs, "objects": seconds_by_output, "h200": h200_by_output}, indent=1,
                      sort_keys=True) + "\n"


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


# The CPU the build gets is measured over this much of the recent past: long enough to span a
# compile's start and end, short enough that a machine that got busier shows within a few lines.
WINDOW_S = 300.0


_TICK = os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[int, float, str]]:
    """pid -> (parent pid, CPU seconds of the process and of its children it has reaped, name)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                text = f.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        found[int(name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]) / _TICK,
                            text[text.index("(") + 1:text.rindex(")")])
    return found


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [w.decode(errors="replace") for w in f.read().split(b"\0") if w]
    except OSError:
        return []


class Run:
    """What the reporter reads of its ninja run from /proc: the CPU time its processes have used
    (ninja's, every edge's, and the run's compile server's and its workers', which run apart from
    ninja: pp4/reuse/server.py), and the objects whose edges run now."""

    def __init__(self, ninja: int):
        self.ninja = ninja
        self.run = ninjarun.run_id_of(ninja)
        self.samples: list[tuple[float, float]] = []  # (time, CPU seconds)

    def sample(self, now: float) -> tuple[float, list[str]]:
        """(CPU seconds the run has used, the command lines of ninja's edges running now)."""
        procs = _processes()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in procs.items():
            children.setdefault(ppid, []).append(pid)
        roots = [self.ninja] + [pid for pid, (_, _, name) in procs.items()
                                if name.startswith("python") and self._is_server(_cmdline(pid))]
        seen: set[int] = set()
        stack = [r for r in roots if r in procs]
        while stack:  # a set: the server is ninja's descendant until the edge that started it ends
            pid = stack.pop()
            if pid not in seen:
                seen.add(pid)
                stack += children.get(pid, [])
        cpu = sum(procs[p][1] for p in seen)
        self.samples.append((now, cpu))
        return cpu, [" ".join(_cmdline(c)) for c in children.get(self.ninja, [])]

    def _is_server(self, cmd: list[str]) -> bool:
        """python -m pp4.reuse.server NAME RUN, of this run (a process that has just ended has none)."""
        return len(cmd) >= 3 and cmd[-3] == "pp4.reuse.server" and cmd[-1] == self.run

    def rate(self) -> float | None:
        """CPUs the run has had over the last WINDOW_S (None before two samples)."""
        if len(self.samples) < 2:
            return None
        now, cpu = self.samples[-1]
        then, before = next(s for s in self.samples if s[0] >= now - WINDOW_S or s is self.samples[-2])
        self.samples = [s for s in self.samples if s[0] >= then]
        return max(cpu - before, 0.0) / max(now - then, 1e-3)


def running_objects(commands: list[str], objects) -> set[str]:
    """The objects whose compile edges run now: an edge's command names its object after -o."""
    named = set()
    for cmd in commands:
        words = cmd.split()
        named.update(words[i + 1] for i, w in enumerate(words[:-1]) if w == "-o")
    return named & set(objects)


def _where(work: str, state_dir: str, estimates: dict, since: float, asked: set[str] | None):
    """(the objects counted with their estimates, those built, those this run compiled, restored,
    the CPU of each compile of this run): line()'s reading of the build folder."""
    objects: dict[str, float] = {o: s for o, s in estimates.get("objects", {}).items() if asked is None or o in asked}
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
    cpu_of: dict[str, float] = {}
    for path in glob.glob(os.path.join(state_dir, statedir.EVENTS, "*.json")):
        try:
            if os.stat(path).st_mtime >= since:
                with open(path) as f:
                    doc = json.load(f)
                (compiled if doc.get("status") == "compiled" else restored).add(doc.get("output"))
                if doc.get("status") == "compiled" and doc.get("compile_cpu_s"):
                    cpu_of[doc["output"]] = float(doc["compile_cpu_s"])
        except (OSError, ValueError, AttributeError, TypeError):
            continue
    batch = statedir.part(state_dir, statedir.PREPASS_EVENTS)
    try:
        if os.stat(batch).st_mtime >= since:
            with open(batch) as f:
                restored |= (set(json.load(f).get("events", {})) & fresh) - compiled
    except (OSError, ValueError, AttributeError):
        pass
    return objects, present - (fresh - compiled - restored), compiled, restored, cpu_of


def line(work: str, state_dir: str, estimates: dict, since: float, now: float, asked: set[str] | None = None,
         asked_name: str = "", cpu_used: float | None = None, running: set[str] = frozenset(),
         cpus: float | None = None) -> str:
    """The progress line. This run compiled or restored an object when its compile edge's event
    is newer than ninja's start (pp4/build/events.py), or when the prepass restored it in this run
    (in the prepass's batch, with a fresh mtime); built: present, and not being written now (newer
    than ninja's start but with no word of how yet). Counted: the objects in `asked` (None: all).

    The CPU left: the estimate of each object not built, times what this run's compiles took over
    their estimates, less what the running compiles have spent (cpu_used less the CPU of the
    compiles done; never more than nine tenths of a running one's own estimate). The end: that
    CPU at `cpus`, the CPUs the build has had lately, else at one a job."""
    objects, built, compiled, restored, cpu_of = _where(work, state_dir, estimates, since, asked)
    timed = [o for o in cpu_of if o in estimates.get("objects", {})]  # every compile of the run, asked or not
    estimated = sum(estimates["objects"][o] for o in timed)
    # What this run's compiles took over their estimates (a whole-run mean: a slow unit counts as
    # much as it weighs). Before any has ended, the estimate as configure scaled it.
    factor = sum(cpu_of[o] for o in timed) / estimated if estimated > 0 else 1.0
    running = set(running) - built
    spent = max((cpu_used or 0.0) - sum(cpu_of.values()), 0.0)
    left = (sum(s for out, s in objects.items() if out not in built) * factor
            - min(spent, 0.9 * factor * sum(objects.get(o, 0.0) for o in running)))
    rate = cpus if cpus and cpus > 0.05 else float(max(estimates.get("jobs", 1), 1))
    eta = left / rate
    clock = time.strftime("%H:%M", time.localtime(now + eta))
    of = f" of {asked_name}" if asked_name else ""
    return (f"pp4: progress {time.strftime('%H:%M:%S', time.localtime(now))}: {len(built)} of {len(objects)} "
            f"objects{of} built (this run: {len(compiled & built)} compiled, {len(restored & built)} restored), about "
            f"{human_duration(left)} of CPU left"
            + (f" (the estimate times {factor:.2f}, as this run's {len(timed)} compiles went)" if timed else "")
            + (f", the build gets {cpus:.1f} CPUs" if cpus is not None else "")
            + f": done in about {human_duration(eta)} ({clock})")


def stopped(work: str, state_dir: str, estimates: dict, since: float, asked: set[str] | None = None,
            asked_name: str = "") -> str | None:
    """The line for a ninja run that ended before every object it was asked for was built (Ctrl-C,
    a failed compile): how far it got and how to go on. None when it built them all."""
    objects, built, compiled, restored, _ = _where(work, state_dir, estimates, since, asked)
    if len(built) >= len(objects):
        return None
    of = f" of {asked_name}" if asked_name else ""
    return (f"pp4: the build stopped with {len(built)} of {len(objects)} objects{of} built (this run: "
            f"{len(compiled & built)} compiled, {len(restored & built)} restored); run ninja again to go on from "
            "there: what is built is kept, and only the rest compiles")


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
        with open(os.path.join(os.path.dirname(os.path.abspath(state_dir)), "actions.json")) as f:
            asked, asked_name = ninjarun.asked_objects(ninjarun.requested_targets(ninja), json.load(f))
    except (OSError, ValueError, KeyError, TypeError):
        asked, asked_name = None, ""
    try:
        interval = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S))
    except ValueError:
        interval = DEFAULT_INTERVAL_S
    out, terminal = _outlet(ninja)
    log_path = statedir.part(state_dir, statedir.PROGRESS_LOG)
    open(log_path, "w").close()  # this run's lines only
    # A terminal is held open, to say after ninja ended how far it got (a pipe is not: its reader
    # would wait for this process).
    held = _held(out) if terminal else None
    run = Run(ninja)
    run.sample(time.time())
    next_at = time.time() + min(interval, 1.0)  # the first line at once: a resumed build's first compile takes minutes
    while ninjarun.started(ninja) == since:  # ninja still runs (the same process, not a reused pid)
        time.sleep(min(1.0, interval))
        now = time.time()
        if now < next_at or ninjarun.started(ninja) != since:
            continue
        next_at = now + interval
        cpu, commands = run.sample(now)
        text = line(work, state_dir, estimates, since, now, asked, asked_name, cpu,
                    running_objects(commands, estimates.get("objects", {})), run.rate())
        with open(log_path, "a") as log:
            log.write(text + "\n")
        # On a terminal, over ninja's status line, which ninja draws again.
        if out is not None and not _say(out, ("\r\x1b[K" if terminal else "") + text + "\n"):
            out = None
    end = stopped(work, state_dir, estimates, since, asked, asked_name)
    if end is not None:
        with open(log_path, "a") as log:
            log.write(end + "\n")
        if held is not None:
            with contextlib.suppress(OSError):
                os.write(held, ("\r\x1b[K" + end + "\n").encode())
    if held is not None:
        os.close(held)
    learn(state_dir, estimates, since)
    return 0


def _held(path: str) -> int | None:
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None


def learn(state_dir: str, estimates: dict, since: float) -> None:
    """Add this run's compiles to this machine's speed record (pp4/plan/estimate.py): each one's
    CPU against the H200 figure configure estimated it from (estimates.json's "h200"; an object
    this build had timed before has none: its own time says nothing of the H200's)."""
    h200 = estimates.get("h200", {})
    pairs = []
    for path in glob.glob(os.path.join(state_dir, statedir.EVENTS, "*.json")):
        try:
            if os.stat(path).st_mtime < since:
                continue
            with open(path) as f:
                doc = json.load(f)
            if doc.get("status") == "compiled" and doc.get("compile_cpu_s") and h200.get(doc.get("output")):
                pairs.append((float(doc["compile_cpu_s"]), float(h200[doc["output"]])))
        except (OSError, ValueError, AttributeError, TypeError):
            continue
    if pairs:
        from pp4.plan import estimate

        estimate.learn_speed(pairs)


if __name__ == "__main__":
    sys.exit(report(sys.argv[1], int(sys.argv[2])))
