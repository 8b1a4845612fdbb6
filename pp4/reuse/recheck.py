"""The check before ninja decides (`python -m pp4.reuse --recheck CONFIG ACTIONS STAMP`): every
existing object's and module's observations against the machine now, and out-of-date ones removed
so that this very ninja run builds them again.

ninja decides what to run from mtimes and its dependency log, which name the files a compile read.
It cannot see a header that appears earlier in the search path, a link pointed elsewhere, a folder
whose listing changed, or a library that appears in an earlier -L folder: nothing it knows of
changed. Each of those changes the folder it happened in, though (a new entry, or a link replaced
by rename, changes the folder's mtime). So build.ninja's own edge, which ninja brings up to date
before it decides anything else, waits (order-only) for this check, whose dependencies are those
folders: the deepest existing folder of every path an object or module looked for and did not
find, the folder of every link and folder it observed, every folder it listed, the folder of every
file it read. The check runs only when one of them changed; it compares every observation of every
existing output with the machine now (through the same `pathstates.States` the lookup uses, files
hashed once and kept by stamp) and removes the outputs that no longer hold (and their restore
markers), then ninja, which re-reads every file's state after build.ninja's edge, rebuilds exactly
those and what uses them.

The stamp is made once and never rewritten (restat): build.ninja does not depend on it, so the
check never makes configure run. The build folder itself, where ninja keeps its lock, is not
watched; nor is pp4's state folder. When ninja was started to audit or report (`ninja certify`,
`ninja report`, ...), nothing is removed: the check says what is out of date and leaves the
stamp's removal to make the next building run check again.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pp4.build import config as buildconfig
from pp4.build import events, modules
from pp4 import statedir
from pp4.execution import depfile

# Targets that build nothing: a run that asked only for them leaves every output in place.
READ_ONLY_TARGETS = {"certify", "report", "wheel-built", "compdb", "compile_commands.json"}


def nothing_built(config_file: Path, actions_file: Path, stamp: Path) -> bool:
    """A build folder none of whose outputs exist yet (a new one, or one cleaned): there is
    nothing to check, only the outputs' folders to watch. Made and said without loading the reuse
    rule, which a new build folder's check would load for nothing. False where an output exists."""
    t0 = time.monotonic()
    doc = json.loads(actions_file.read_text())
    state_dir = buildconfig.load(config_file).state_dir
    events.mark_run(state_dir)  # the first edge of a run where it runs: where the run starts in ninja's log
    builddir = Path(state_dir).parent
    outputs = [a["output"] for a in doc["actions"]] + _modules(builddir, doc)
    if any(os.path.lexists(out) for out in outputs):
        return False
    _write_watched(stamp, _output_folders(outputs), builddir)
    if not stamp.exists():
        stamp.write_text(json.dumps({"checked": 0, "seconds": round(time.monotonic() - t0, 3)}) + "\n")
    return True


def recheck(cfg, actions_file: Path, stamp: Path) -> int:
    """cfg: the build's ReuseConfig (pp4/build/config.py)."""
    from pp4 import paths
    from pp4.execution.root import Root
    from pp4.reuse import inputsets, link, pathstates
    from pp4.reuse.actionkey import FileHasher
    from pp4.reuse.wrapper import MARKER_SUFFIX

    t0, cpu0 = time.monotonic(), time.process_time()
    doc = json.loads(actions_file.read_text())
    hasher = FileHasher(paths.file_hashes())
    states = pathstates.States(hasher)
    checker = inputsets.SetChecker(states)
    sets_dir = inputsets.directory(cfg.state_dir)
    known = events.Events(cfg.state_dir)
    stale: list[tuple[str, str]] = []  # (output, why)
    watched_sets: set[tuple] = set()
    folders: dict[str, str] = {}  # a path's folder -> its deepest existing folder
    checked = 0
    outputs = [a["output"] for a in doc["actions"]] + _modules(Path(cfg.builddir()), doc)
    watched = _output_folders(outputs)
    for action in doc["actions"]:
        out = action["output"]
        if not os.path.exists(out):
            continue
        ev = known.get(out)
        if ev is None or not ev.input_sets:
            continue  # not observed (or not yet recorded): the compile edge's own business
        mapping = Root.from_mounts(ev.mounts) if ev.mounts else None
        to_real = mapping.real if mapping is not None else (lambda p: p)
        checked += 1
        for sid in ev.input_sets:
            pairs = checker.load(sets_dir, ev.sets_pack, sid)
            if pairs is None:
                stale.append((out, f"its observation set {sid[:16]} is missing"))
                break
            if (sid, mapping) not in watched_sets:  # a set most units share: its folders once
                watched_sets.add((sid, mapping))
                _watch(pairs, to_real, watched, folders)
            if not checker.matches(sets_dir, ev.sets_pack, sid, mapping):
                changed = pathstates.differences(pairs, to_real, states)
                stale.append((out, changed[0] if changed else "an observation no longer holds"))
                break
    for module in outputs[len(doc["actions"]):]:
        record = modules.read_link(cfg.state_dir, module)
        if record is None or not os.path.exists(module) or record.not_observed:
            continue
        checked += 1
        to_real = link.to_real(record)
        _watch(record.observations, to_real, watched, folders)
        if not pathstates.holds(record.observations, to_real, states):
            changed = pathstates.differences(record.observations, to_real, states)
            stale.append((module, changed[0] if changed else "an observation no longer holds"))
    hasher.save()
    _write_watched(stamp, watched, cfg.builddir())
    if stale:
        removing = not _read_only_run()
        for out, _ in stale if removing else ():
            for p in (Path(out), Path(out + MARKER_SUFFIX)):
                p.unlink(missing_ok=True)
        out, why = stale[0]
        verb = "removed, so this run builds them again" if removing else "left in place (this run builds nothing)"
        print(f"pp4: {len(stale)} output(s) no longer match what made them, which ninja's file times cannot show "
              f"(first, {out}: {why}): {verb}", flush=True)
        if not removing:
            stamp.unlink(missing_ok=True)  # the next building run checks again
            return 0
    if not stamp.exists():
        stamp.write_text(json.dumps({"checked": checked, "seconds": round(time.monotonic() - t0, 3),
                                     "cpu_seconds": round(time.process_time() - cpu0, 3)}) + "\n")
    return 0


def _output_folders(outputs: list[str]) -> set[str]:
    """The outputs' folders, made now: an output written there (a compile, a restore, a link) means
    there is something new to watch, so the next run checks once more, even after a first build."""
    watched = set()
    for out in outputs:
        folder = os.path.dirname(os.path.abspath(out))
        os.makedirs(folder, exist_ok=True)
        watched.add(os.path.realpath(folder))
    return watched


def _write_watched(stamp: Path, watched: set[str], builddir) -> None:
    """The stamp's dependency file: the watched folders but the build folder, where ninja keeps its
    lock, and pp4's state folder in it."""
    builddir = os.path.realpath(builddir)
    watched = {w for w in watched if w != builddir and not _inside(w, os.path.join(builddir, statedir.FOLDER))}
    stamp.parent.mkdir(parents=True, exist_ok=True)
    depfile.write(str(stamp) + ".d", str(stamp), sorted(watched))


def _watch(pairs, to_real, watched: set[str], folders: dict[str, str]) -> None:
    """The folders whose change can make an observation false without any file ninja knows of
    changing: where a missing path would appear, where a link or folder would be replaced, a listed
    folder, a read file's folder (a file replaced by rename keeps whatever time it had). folders:
    each path's folder's deepest existing folder, found once per check."""
    from pp4.reuse import pathstates

    for path, state in pairs:
        real = to_real(path)
        if real is None or not real.startswith("/") or state.startswith((pathstates.AT, pathstates.REL)):
            continue
        if state.startswith(pathstates.LISTING):
            watched.add(real)
            continue
        parent = os.path.dirname(real)
        folder = folders.get(parent)
        if folder is None:
            folder = parent
            while folder and not os.path.isdir(folder):
                folder = os.path.dirname(folder)
            folders[parent] = folder
        if folder:
            watched.add(folder)


def _modules(builddir: Path, doc: dict) -> list[str]:
    found = []
    for target in sorted({a["target"] for a in doc["actions"]}):
        try:
            found.append(modules.load_plan(builddir, target).output)
        except buildconfig.BuildFolderError:
            continue
    # the device links (nvcc -dlink) are links too: what each observed is checked the same way
    return found + [d["output"] for d in doc.get("device_links") or []]


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + "/")


def _read_only_run() -> bool:
    """Whether the ninja that runs this check was asked only for targets that build nothing."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            words = [w.decode(errors="replace") for w in f.read().split(b"\0") if w]
    except OSError:
        return False
    if not words or os.path.basename(words[0]) != "ninja":
        # run through the shell ninja started (sh -c): ninja is its parent
        try:
            with open(f"/proc/{os.getppid()}/stat") as f:
                grandparent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{grandparent}/cmdline", "rb") as f:
                words = [w.decode(errors="replace") for w in f.read().split(b"\0") if w]
        except (OSError, ValueError, IndexError):
            return False
    targets, skip = [], False
    for w in words[1:]:
        if skip:
            skip = False
            continue
        if w in ("-C", "-f", "-j", "-k", "-l", "-d", "-t", "-w"):
            skip = True
            continue
        if not w.startswith("-"):
            targets.append(w)
    return bool(targets) and all(t in READ_ONLY_TARGETS for t in targets)
