"""`python -m pp4.reuse why OBJECT`: why an object of the build in this folder was compiled, not
restored (what ccache's debug log and Bazel's execution-log diff answer); `why --all` (`ninja
explain`): each object whose newest event is a compile.

The object's event (pp4/build/events.py) has the command and environment it ran with, hence its
manifest key. The entries the local store holds for that key, other than the one this compile
stored itself and stored after it, are what its lookup was compared with: for the newest, the
first observation that does not hold now (path, what the entry recorded, what is there now), its
action key, when it was stored, for which output, and who signed it (their labels on the trust
list). With no such entry, the command itself changed: the newest record the store holds for the
same output under another command is found, and the words of the two commands that differ are
named. The answer is read from the store and the files as they are now; the compile event's own
reason (the newest entry's first difference at the time) is shown too.
"""

from __future__ import annotations

import difflib
import json
import os
import time
from pathlib import Path

from pp4.build import config as buildconfig
from pp4.build import events
from pp4.build.config import BuildFolderError, ReuseConfig
from pp4.reuse import actionkey
from pp4.reuse.wrapper import Reuser, manifest_key
from pp4.store import signing
from pp4.store.records import ActionRecord, InvalidRecord, decode_record_file


def when(created: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(created))


def labels(reuser: Reuser, signatures) -> str:
    """Who signed, by the labels the trust list gives their keys (base64's start where it has none)."""
    trust = reuser.front.trust if reuser.front is not None else None
    names = []
    for sig in signatures or ():
        signer = sig.get("signer", "") if isinstance(sig, dict) else ""
        raw = signing.raw_signer(signer)
        if trust is None:
            names.append(f"{str(signer)[:12]}...")
            continue
        state = " (revoked)" if raw in trust.revoked else "" if raw in trust.keys else " (not trusted)"
        names.append(trust.label(signer) + state)
    return ", ".join(names) or "nobody"


def command_difference(old: list[str], old_env: dict, new: list[str], new_env: dict) -> str:
    """The words of two commands (and their environments) that differ, the stored one's first."""
    parts = []
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            parts.append(f"{' '.join(old[i1:i2]) or '(nothing)'} then, {' '.join(new[j1:j2]) or '(nothing)'} now")
    for name in sorted(set(old_env) | set(new_env)):
        if old_env.get(name) != new_env.get(name):
            parts.append(f"${name} {old_env.get(name, '(unset)')!r} then, {new_env.get(name, '(unset)')!r} now")
    return "; ".join(parts) or "the same words (a fixed root then, none now, or the other way)"


def _records(reuser: Reuser):
    """Every action record of the local store (a diagnostic reads them all)."""
    for path in reuser.front.local.actions_dir.glob("*/*.json"):
        try:
            yield decode_record_file(path.read_bytes(), expected_key=path.stem)
        except (OSError, InvalidRecord):
            continue


def _previous_command(reuser: Reuser, output: str, mkey: str) -> ActionRecord | None:
    """The newest record stored for this output (this folder's) under another command."""
    real = os.path.abspath(output)
    best = None
    for record in _records(reuser):
        p = record.payload
        made_for = p.get("compiled_for") if isinstance(p.get("compiled_for"), dict) else {}
        if made_for.get("output") == real and p.get("manifest_key") != mkey and isinstance(p.get("command"), list):
            if best is None or record.created > best.created:
                best = record
    return best


def explain(cfg: ReuseConfig, actions_file: Path, output: str) -> list[str]:
    planned = json.loads(actions_file.read_text())["actions"]
    docs = {actionkey.parse_compile(d["argv"]).output: d for d in planned}
    if output not in docs:
        shown = ", ".join(sorted(docs)[:3]) + (", ..." if len(docs) > 3 else "")
        return [f"{output} is not an object of this build (its objects: {shown}; give one as ninja names it)"]
    event = events.Events(cfg.state_dir).get(output)
    if event is None:
        return [f"{output} has not been built (run ninja)"]
    reuser = Reuser(cfg)
    if event.status == "reused":
        return [f"{output} was restored ({event.via or 'by its edge'}, {event.tier or 'local'} store), entry "
                f"{(event.action_key or '')[:16]}, signed by {labels(reuser, event.signatures)}"]
    head = f"{output} was compiled, not restored"
    if reuser.front is None:
        return [f"{head}: this build has no store ({reuser.store_problem or 'configure --no-reuse'})"]
    mkey = manifest_key(event.command, event.env, event.mounts is not None)
    own = reuser.front.local.lookup(event.action_key) if event.action_key else None
    before = own.created if own is not None else float("inf")
    entries = []
    for entry in reversed(reuser.front.manifests.read(mkey)):  # newest first, as a lookup takes them
        record = reuser.front.local.lookup(entry.action_key) if entry.action_key != event.action_key else None
        if record is not None and record.created < before:
            entries.append((entry, record))
    lines = []
    differs = None
    if entries:
        action = reuser.action(actionkey.parse_compile(docs[output]["argv"]), docs[output]["env"])
        entry, record = entries[0]
        differs = reuser.first_difference(entry, action)
        verdict = reuser.front.verdict(entry, record)
        lines.append(f"{head}: " + (f"the first observation that differs: {differs}" if differs else
                                    "every observation of the newest stored entry holds now"
                                    + ("" if verdict.ok else f", but it is not restored: {verdict.why}")))
        made_for = record.payload.get("compiled_for") or {}
        lines.append(f"  compared with: action {entry.action_key[:16]}, stored {when(record.created)}"
                     f"{' for ' + str(made_for.get('output')) if made_for.get('output') else ''}, "
                     f"signed by {labels(reuser, record.signatures)}"
                     + (f" ({len(entries) - 1} older entr{'y' if len(entries) == 2 else 'ies'} of the command too)"
                        if len(entries) > 1 else ""))
    else:
        lines.append(f"{head}: no entry of this command in the store (manifest key {mkey[:16]})")
        previous = _previous_command(reuser, output, mkey)
        if previous is not None:
            p = previous.payload
            lines.append(f"  the command differs from the one stored for {output} on {when(previous.created)} "
                         f"(action {previous.action_key[:16]}, manifest key {str(p.get('manifest_key'))[:16]}, "
                         f"signed by {labels(reuser, previous.signatures)}): "
                         + command_difference(p["command"], p.get("env") or {}, list(event.command), event.env))
    if event.missed and event.missed != differs:
        lines.append(f"  when it was compiled: {event.missed}")
    if event.not_stored:
        lines.append(f"  it was not stored: {event.not_stored}")
    return lines


def compiled_objects(cfg: ReuseConfig, actions_file: Path) -> list[str]:
    """The objects of the build whose newest event is a compile (`ninja explain` explains each)."""
    known = events.Events(cfg.state_dir)
    outputs = [actionkey.parse_compile(d["argv"]).output for d in json.loads(actions_file.read_text())["actions"]]
    return [o for o in outputs if (ev := known.get(o)) is not None and ev.status == "compiled"]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m pp4.reuse why OBJECT   (in the folder of build.ninja; OBJECT as ninja names it, "
              "or --all: every object compiled)")
        return 2
    builddir = buildconfig.builddir_of(".")
    if builddir is None:
        raise BuildFolderError("no build.ninja here: run `python -m pp4.reuse why OBJECT` in the folder you run "
                               "ninja in")
    output = argv[0]
    if os.path.isabs(output):
        output = os.path.relpath(output)
    cfg = ReuseConfig.load(builddir)
    actions = buildconfig.actions_path(builddir)
    wanted = compiled_objects(cfg, actions) if output == "--all" else [os.path.normpath(output)]
    if not wanted:
        print("pp4: no object of this build was compiled when last built: each was restored")
    for one in wanted:
        for line in explain(cfg, actions, one):
            print(line)
    return 0
