"""What every ninja run starts first (build.ninja's recheck edge runs on every run): one ninja at a
time in a build folder, then the identities of what the build's outputs observed, compared without
reading a file; where any moved, the full check (pp4/reuse/recheck.py) in this same process.

    python -S -I quickcheck.py CONFIG ACTIONS STAMP

Run with -S -I and only built-in modules (and pp4/ninjarun.py), so it starts in a few milliseconds.

Identities. ninja decides by mtime, which `touch -r`, `tar x`, `rsync -a` and `cp -p` put back: an
edit made so is invisible to it, and to a folder's mtime too (tar and rsync put those back as well).
A path's ctime cannot be put back by any of them (only the kernel sets it, to now, on every write,
chmod, rename or link), so a path's identity here is its device, inode, size, mode, mtime and ctime,
as stat gives them. The full check writes the table (STAMP.ids) of every path the build's outputs
observed (each file read and each link, as observed: followed or not), the folders where a missing
path would appear, the outputs themselves, config and actions; this check stats each and compares.
A table is written only when no identity in it is within SLACK_S of when it was taken: a write in
the same clock tick could leave a ctime as it was. Where any identity moved, the full check judges
each output by its observations' content (the FileHasher rehashes a file whose identity moved).

One ninja at a time. ninja reads .ninja_log and .ninja_deps when it starts and appends to them as it
goes, numbering the deps log's paths from what it read: two runs at once both build everything and
can leave a deps log whose later records are dropped when read. Every edge runs after those reads,
so a second run cannot be made to wait and then go on with logs it read before the first one ended:
it is stopped here, before it builds or records anything, with one line naming the run it met.
"""

import os
import sys
import time

if not __package__:  # run as a script, with -I: pp4's folder, for its one module without imports of its own
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from pp4 import ninjarun  # noqa: E402

# The table's first line; bump it when its format changes. 1: records "MODE IDENT\0PATH\0", MODE f
# (stat, following links) or l (lstat), IDENT dev:ino:size:mode:mtime_ns:ctime_ns, or - for nothing.
FORMAT = b"pp4-recheck-identities 1\n"
SLACK_S = 2.0
# In the state folder, beside the stamp (pp4/statedir.py names both: NINJA_LOCK, RECHECK_IDS; not
# imported here, since it loads pathlib): the ninja run building in this folder, and the table.
LOCK = "ninja.lock"
IDS_SUFFIX = ".ids"


def table_path(stamp) -> str:
    return f"{stamp}{IDS_SUFFIX}"


def identity(path: str, follow: bool, known=None) -> str:
    """known: stat results by (path, follow) already taken (pathstates.States.stats)."""
    st = known.get((path, follow)) if known else None
    if st is None:
        try:
            st = os.stat(path) if follow else os.lstat(path)
        except OSError:
            return "-"
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mode}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def holds(stamp) -> bool:
    """Whether the table exists and every identity in it is as it was. (Bytes throughout: at EXL3's
    5,600 paths the stat calls are most of its time.)"""
    try:
        with open(table_path(stamp), "rb") as f:
            data = f.read()
    except OSError:
        return False
    if not data.startswith(FORMAT):
        return False
    fields = data[len(FORMAT):].split(b"\0")
    if len(fields) % 2 != 1 or fields[-1]:
        return False
    pairs = iter(fields[:-1])
    stat, lstat = os.stat, os.lstat
    for head, path in zip(pairs, pairs):
        try:
            st = stat(path) if head[:2] == b"f " else lstat(path)
        except OSError:
            now = b"-"
        else:
            now = b"%d:%d:%d:%d:%d:%d" % (st.st_dev, st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns)
        if head[2:] != now:
            return False
    return True


def write_table(stamp, paths: dict[str, bool], known=None, since_ns: int | None = None) -> bool:
    """Write the table of paths (path -> whether stat follows its last link); False (and no table,
    so the next run checks in full) where an identity is too recent to be trusted. known: stat
    results taken since since_ns (else now), by (path, follow)."""
    target = table_path(stamp)
    settled = (time.time_ns() if since_ns is None else since_ns) - int(SLACK_S * 1e9)
    parts = [FORMAT]
    for path in sorted(paths):
        ident = identity(path, paths[path], known)
        if ident != "-" and int(ident.rsplit(":", 1)[1]) > settled:
            _remove(target)
            return False
        parts.append(b"%s %s\0%s\0" % (b"f" if paths[path] else b"l", ident.encode(), os.fsencode(path)))
    tmp = f"{target}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(b"".join(parts))
    os.replace(tmp, target)
    return True


def forget(stamp) -> None:
    """No table: the next run checks in full."""
    _remove(table_path(stamp))


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def claim(state_dir: str) -> str | None:
    """Record this ninja run as the one building in the folder; where another ninja run that is
    still running (and is not an ancestor of this one) holds it, the line that says so."""
    mine = ninjarun.run_id()
    if mine is None:
        return None  # not run by ninja (a test, a bench): nothing to share
    import fcntl

    try:
        os.makedirs(state_dir, exist_ok=True)
        fd = os.open(os.path.join(state_dir, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:  # a folder this user cannot write: ninja, which writes its logs beside it, will say so
        print(f"pp4: cannot record this ninja run in {state_dir}: {e}", file=sys.stderr)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held only while reading and writing the holder
        holder = os.read(fd, 200).decode(errors="replace").strip()
        if holder and holder != mine and ninjarun.is_running(holder):
            pid = int(holder.split("-")[0])
            if _ancestor(pid):
                return None  # a ninja an edge of the holder started: the holder stays
            since = ninjarun.started(pid)
            when = time.strftime(" since %H:%M:%S", time.localtime(since)) if since else ""
            builddir = os.path.dirname(os.path.abspath(state_dir))
            return (f"pp4: ninja {pid} is already building in {builddir}{when}; this ninja stops before it builds "
                    "or records anything (two at once would both build everything and can break ninja's logs): "
                    "run it again when that one has ended")
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, (mine + "\n").encode())
        return None
    finally:
        os.close(fd)


def _ancestor(pid: int) -> bool:
    """Whether pid is an ancestor of this process (a ninja started by an edge of that ninja)."""
    at = os.getppid()
    for _ in range(64):
        if at == pid:
            return True
        found = ninjarun.proc_stat(at)
        if found is None or at <= 1:
            return False
        at = int(found[1][1])
    return False


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -S -I quickcheck.py CONFIG ACTIONS STAMP", file=sys.stderr)
        return 2
    stamp = argv[2]
    refused = claim(os.path.dirname(os.path.abspath(stamp)))
    if refused:
        print(refused, file=sys.stderr, flush=True)
        return 1
    if holds(stamp):
        return 0
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "pp4.reuse", "--recheck", *argv])
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
