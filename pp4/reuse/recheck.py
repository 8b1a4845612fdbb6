"""The check before ninja decides (`python -m pp4.reuse --recheck CONFIG ACTIONS STAMP`, which
pp4/reuse/quickcheck.py, run by build.ninja on every ninja run, becomes where an identity in its
table moved): every existing object's and module's observations against the machine now, and
out-of-date ones removed so that this very ninja run builds them again.

ninja decides what to run from mtimes and its dependency log, which name the files a compile read.
It cannot see an edit whose mtime was put back, a header that appears earlier in the search path, a
link pointed elsewhere, a folder whose listing changed, or a library that appears in an earlier -L
folder: nothing it knows of changed. build.ninja's own edge, which ninja brings up to date before it
decides anything else, waits (order-only) for this check. It compares every observation of every
existing output with the machine now (through the same `pathstates.States` the lookup uses, files
hashed once and kept by an identity that holds the ctime) and removes the outputs that no longer
hold (and their restore markers), then ninja, which re-reads every file's state after build.ninja's
edge, rebuilds exactly those and what uses them. Then it writes the quick check's table: the
identity of every path the outputs observed to be there, the folders where what they found absent
would appear (the deepest existing folder of each; every folder they listed, or read a file or link
in), the outputs, config and actions.
The trust list is in the table too (the revoked keys' file, the trusted keys' folder): an object
restored from an entry whose signers the build no longer trusts enough is removed the same way
(no_longer_vouched); one this builder compiled stays.

Each output's own bytes are checked too (outputs_not_made): an object against the sha256 its
compile's event keeps, a module against its link record's, a pin against the module its link made,
the certificate against its build record. A tool that writes into a module (strip, a patch, one
byte) changes no input of the link, only the module, which ninja would pin again as it is. The
outputs, their pins and the certificate are in the quick check's table, so the check runs, finds
the output by its identity (its bytes hashed only where that moved), and removes it, and ninja
links or restores it instead of pinning what it is now.

The stamp is made once and never rewritten (restat): build.ninja does not depend on it, so the
check never makes configure run. When ninja was started to audit or report (`ninja certify`,
`ninja report`, ...), nothing is removed: the check says what is out of date and leaves the
stamp's removal, and the table's, to make the next building run check again in full.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pp4.build import config as buildconfig
from pp4.build import events, modules
from pp4 import statedir
from pp4.reuse import quickcheck

# Targets that build nothing: a run that asked only for them leaves every output in place.
READ_ONLY_TARGETS = {"certify", "report", "explain", "wheel-built", "compdb", "compile_commands.json"}


def nothing_built(config_file: Path, actions_file: Path, stamp: Path) -> bool:
    """A build folder none of whose outputs exist yet (a new one, or one cleaned): there is
    nothing to check (and no table: the next run checks in full again). Made and said without loading the reuse
    rule, which a new build folder's check would load for nothing. False where an output exists."""
    t0 = time.monotonic()
    doc = json.loads(actions_file.read_text())
    state_dir = buildconfig.load(config_file).state_dir
    events.mark_run(state_dir)  # the first edge of a run where it runs: where the run starts in ninja's log
    builddir = Path(state_dir).parent
    outputs = [a["output"] for a in doc["actions"]] + _modules(builddir, doc)
    if any(os.path.lexists(out) for out in outputs):
        return False
    stamp.parent.mkdir(parents=True, exist_ok=True)
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
    states.stats, since_ns = {}, time.time_ns()  # the next run's table takes its identities from these stats
    checker = inputsets.SetChecker(states)
    sets_dir = inputsets.directory(cfg.state_dir)
    known = events.Events(cfg.state_dir)
    stale: list[tuple[str, str]] = []  # (output, why)
    watched_sets: set[tuple] = set()
    folders: dict[str, str] = {}  # a path's folder -> its deepest existing folder
    identities: dict[str, bool] = {}  # what the next run's quick check stats: path -> follow its link
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
                _observed(pairs, to_real, identities)
            if not checker.matches(sets_dir, ev.sets_pack, sid, mapping):
                changed = pathstates.differences(pairs, to_real, states)
                stale.append((out, changed[0] if changed else "an observation no longer holds"))
                break
    gone = {out for out, _ in stale}
    stale += no_longer_vouched(cfg, known, [a["output"] for a in doc["actions"]
                                            if a["output"] not in gone and os.path.exists(a["output"])])
    watched.update(_trust_files())
    for module in outputs[len(doc["actions"]):]:
        record = modules.read_link(cfg.state_dir, module)
        if record is None or not os.path.exists(module) or record.not_observed:
            continue
        checked += 1
        to_real = link.to_real(record)
        _watch(record.observations, to_real, watched, folders)
        _observed(record.observations, to_real, identities)
        if not pathstates.holds(record.observations, to_real, states):
            changed = pathstates.differences(record.observations, to_real, states)
            stale.append((module, changed[0] if changed else "an observation no longer holds"))
    not_made, present = outputs_not_made(cfg.state_dir, doc["actions"], outputs[len(doc["actions"]):], known, hasher,
                                         doc.get("certificate"))
    stale += [s for s in not_made if s[0] not in {out for out, _ in stale}]
    watched.update(os.path.realpath(p) for p in present)  # the pins and the certificate too
    hasher.save()
    removing = bool(stale) and not _read_only_run()
    if stale:
        for out, _ in stale if removing else ():
            for p in (Path(out), Path(out + MARKER_SUFFIX)):
                p.unlink(missing_ok=True)
        out, why = stale[0]
        verb = "removed, so this run builds them again" if removing else "left in place (this run builds nothing)"
        print(f"pp4: {len(stale)} output(s) no longer match what made them, which ninja's file times cannot show "
              f"(first, {out}: {why}): {verb}", flush=True)
        if not removing:
            stamp.unlink(missing_ok=True)  # the next building run checks again
            quickcheck.forget(stamp)
            return 0
    _write_identities(stamp, identities, watched, outputs, (buildconfig.config_path(cfg.builddir()), actions_file),
                      cfg.builddir(), states.stats, since_ns)
    if not stamp.exists():
        stamp.write_text(json.dumps({"checked": checked, "seconds": round(time.monotonic() - t0, 3),
                                     "cpu_seconds": round(time.process_time() - cpu0, 3)}) + "\n")
    return 0


def _observed(pairs, to_real, identities: dict[str, bool]) -> None:
    """The paths whose identity the next run's quick check compares (pp4/reuse/quickcheck.py):
    every path observed to be there, followed or not as it was observed. An absence is the business
    of its deepest existing folder (_watch), whose ctime any new entry moves."""
    from pp4.reuse import pathstates

    for path, state in pairs:
        if state == pathstates.ABSENT or state.startswith(pathstates.ASKED):
            continue
        real = to_real(path)
        if real is not None and real.startswith("/"):
            follow = not state.startswith(pathstates.NOFOLLOW)
            identities[real] = identities.get(real, False) or follow


def _write_identities(stamp: Path, identities: dict[str, bool], watched: set[str], outputs: list[str],
                      documents, builddir, known, since_ns: int) -> None:
    """The quick check's table: the observed paths, the watched folders but the build folder and
    pp4's state folder (written every run), the outputs, config and actions."""
    builddir = os.path.realpath(builddir)
    table = dict(identities)
    for folder in watched:
        if folder != builddir and not _inside(folder, os.path.join(builddir, statedir.FOLDER)):
            table[folder] = True
    for path in (*outputs, *map(str, documents)):
        table[os.path.abspath(path)] = True
    quickcheck.write_table(stamp, table, known, since_ns)


def no_longer_vouched(cfg, known, outputs: list[str]) -> list[tuple[str, str]]:
    """The objects restored from the store whose entry's signers this build trusts now are fewer than
    it requires (a key revoked, or taken off the trust list, since): (output, why). An object this
    builder compiled is its own and stays; a trust list that cannot be read leaves all in place
    (the lookups say why)."""
    from pp4.store import signing

    try:
        trust = signing.build_trust(cfg.trust)
    except signing.SigningKeyError:
        return []
    found = []
    for out in outputs:
        ev = known.get(out)
        if ev is None or ev.status != "reused":
            continue
        signers = {signing.raw_signer(s.get("signer")): s.get("signer") for s in ev.signatures if isinstance(s, dict)}
        still = [raw for raw in signers if raw in trust.keys]
        if len(still) < trust.require:
            lost = [trust.label(text) for raw, text in signers.items() if raw not in trust.keys]
            found.append((out, f"restored from an entry signed by {', '.join(lost) or 'nobody'}, no longer trusted "
                               f"({len(still)} trusted signer(s) left, {trust.require} required)"))
    return found


def _trust_files() -> set[str]:
    """What the trust list is read from, in the quick check's table so that a key revoked or taken
    off the list makes the full check run: the revoked keys' file and the trusted keys' folder, or
    the folder above where either is yet to be made (making it moves that folder's ctime)."""
    from pp4.store import signing

    found = set()
    for path in (signing.revoked_file(), signing.trusted_folder()):
        while not path.exists() and path != path.parent:
            path = path.parent
        found.add(str(path))
    return found


def outputs_not_made(state_dir: str, actions: list[dict], module_outputs: list[str], known, hasher,
                     certificate: str | None = None) -> tuple[list[tuple[str, str]], list[str]]:
    """([(output, why)] for every output whose bytes are not what made it, [every output there]):
    an object against its event's sha256 (through hasher, which answers an unchanged file by its
    identity), a module against its link record (a module with none is not known to be its
    link's), a pin against its link record's sha256, the certificate against the hash its build
    record names. Only outputs that exist: a missing one is ninja's business."""
    stale, present = [], []
    for action in actions:
        out = action["output"]
        try:
            st = os.stat(out)
        except OSError:
            continue
        present.append(out)
        ev = known.get(out)
        if ev is not None and hasher.sha256(out, st) != ev.object_sha256:
            stale.append((out, f"its bytes are not what its compile made (sha256 {ev.object_sha256[:16]}...)"))
    for module in module_outputs:
        if not os.path.exists(module):
            continue
        present.append(module)
        record = modules.read_link(state_dir, module)
        why = "no link record says what its link made" if record is None or not record.sha256 else record.made(module)
        if why is not None:
            stale.append((module, why))
        pin = str(modules.pin_path_for(module))
        try:
            pinned = json.loads(Path(pin).read_text()).get("sha256")
        except FileNotFoundError:
            continue
        except (OSError, ValueError, AttributeError):
            pinned = None
        present.append(pin)
        if record is not None and pinned != record.sha256:
            stale.append((pin, "it does not pin the module its link made"))
    if certificate and os.path.exists(certificate):
        present.append(certificate)
        why = _certificate_unlike_its_record(Path(certificate))
        if why is not None:
            stale.append((certificate, why))
    return stale, present


def _certificate_unlike_its_record(cert: Path) -> str | None:
    """Why the certificate is not the one its build record names (pp4/certify/certificate.py writes
    both: build-record.json beside it, naming the sha256 of its uncompressed JSON), or None."""
    import gzip
    import hashlib

    try:
        named = json.loads(cert.with_name("build-record.json").read_text())["certificate"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return "no build record names it"
    try:
        digest = hashlib.sha256(gzip.decompress(cert.read_bytes())).hexdigest()
    except (OSError, EOFError, ValueError) as e:  # gzip.BadGzipFile is an OSError
        return f"it cannot be read ({e})"
    return None if digest == named else f"its sha256 is {digest}, its build record names {named}"


def _output_folders(outputs: list[str]) -> set[str]:
    """The outputs' folders, made now: an output written there (a compile, a restore, a link) moves
    the folder's identity, so the next run checks in full once more, even after a first build."""
    watched = set()
    for out in outputs:
        folder = os.path.dirname(os.path.abspath(out))
        os.makedirs(folder, exist_ok=True)
        watched.add(os.path.realpath(folder))
    return watched


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
