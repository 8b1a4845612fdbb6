"""The ninja run a process belongs to: the ninja among its nearest ancestors (an edge's command
runs under ninja's shell), known by pid and start time, so that a reused pid is never taken for it.
Read from /proc; None wherever it cannot be read."""

from __future__ import annotations

import os


def proc_stat(pid: int) -> tuple[str, list[str]] | None:
    """(command name, the fields after it) of /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()


# Where the walk up to ninja starts: this process's parent, or, in a worker of the compile server
# (pp4/reuse/server.py), the parent of the client that handed the edge over.
ANCESTORS_FROM: int | None = None


def ninja_ancestor() -> int | None:
    pid = ANCESTORS_FROM or os.getppid()
    for _ in range(4):  # the edge's shell, then ninja
        found = proc_stat(pid)
        if found is None:
            return None
        name, fields = found
        if name == "ninja":
            return pid
        pid = int(fields[1])
    return None


def run_id() -> str | None:
    """pid-starttime of the ninja run this process is part of."""
    return run_id_of(ninja_ancestor())


def run_id_of(pid: int | None) -> str | None:
    found = proc_stat(pid) if pid is not None else None
    return f"{pid}-{found[1][19]}" if found else None


def is_running(run: str) -> bool:
    """Whether the ninja of RUN (run_id's pid-starttime) is still that process."""
    pid, _, start = run.partition("-")
    found = proc_stat(int(pid)) if pid.isdigit() else None
    return found is not None and found[1][19] == start


# ninja's options that take a value (ninja --help); the words left over are the targets asked for.
_VALUED_OPTIONS = {"-C", "-f", "-j", "-k", "-l", "-d", "-t", "-w"}


def requested_targets(pid: int | None = None) -> list[str] | None:
    """The targets the ninja this process runs under (or ninja PID) was asked for ([] for its
    default); None when there is no such ninja, or it ran a tool (`-t`)."""
    pid = pid or ninja_ancestor()
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = [w.decode(errors="replace") for w in f.read().split(b"\0")[1:] if w]
    except OSError:
        return None
    targets, i = [], 0
    while i < len(words):
        w = words[i]
        if w == "-t" or w.startswith("-t"):
            return None
        if w in _VALUED_OPTIONS:
            i += 2
            continue
        if w == "--":
            targets += words[i + 1:]
            break
        if not w.startswith("-"):
            targets.append(w)
        i += 1
    return targets


def started(pid: int) -> float | None:
    """When a running process started, in seconds since the epoch; None once it has ended (a
    zombie that its parent has not reaped yet counts as ended)."""
    found = proc_stat(pid)
    if found is None or found[1][0] in ("Z", "X"):
        return None
    ticks = int(found[1][19])  # starttime, field 22
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def installed() -> str:
    """The ninja of the ninja wheel pp4 depends on, else the one on PATH."""
    try:
        from ninja import BIN_DIR

        candidate = os.path.join(BIN_DIR, "ninja")
        if os.path.isfile(candidate):
            return candidate
    except ImportError:
        pass
    import shutil

    return shutil.which("ninja") or "ninja"


def binary() -> str:
    """The ninja running this process's edge, else installed()."""
    pid = ninja_ancestor()
    if pid is not None:
        try:
            return os.readlink(f"/proc/{pid}/exe")
        except OSError:
            pass
    return installed()


def asked_objects(targets: list[str] | None, actions: dict) -> tuple[set[str] | None, str]:
    """The objects the targets asked for need, and their name for the line: (None, "") for every
    object (the default target, `all`, the certificate, a setup.py project's wheel, a target this
    cannot map). A module's target, its `wheel-` target, its module file or pin, or an object."""
    by_target: dict[str, set[str]] = {}
    for a in actions.get("actions", []):
        by_target.setdefault(a["target"], set()).add(a["output"])
    by_file = {os.path.normpath(ln[k]): ln["target"] for ln in actions.get("links", []) for k in ("output", "pin")}
    objects = {o for outs in by_target.values() for o in outs}
    wanted: set[str] = set()
    names: list[str] = []
    for t in targets or ["all"]:
        module = t.removeprefix("wheel-") if t.removeprefix("wheel-") in by_target else by_file.get(os.path.normpath(t))
        if module is not None:
            wanted |= by_target[module]
            names.append(module)
        elif os.path.normpath(t) in objects:
            wanted.add(os.path.normpath(t))
            names.append(os.path.basename(t))
        else:
            return None, ""
    return wanted, ", ".join(dict.fromkeys(names))
