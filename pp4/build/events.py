"""Events: how each object of a build was made (compiled, or reused from which action), for the
certificate and the prepass's dependency file.

A compile edge writes its own event file, build/.pp4/events/<output>.json. The prepass, which
restores a few hundred objects in one process, writes its events in one batch file instead,
build/.pp4/prepass-events.json: a file created and renamed per restore cost the prepass more than a
tenth of its time (an ext4 create is about 0.2 ms). The two are read through `Events`:

- an output's own event file, when there is one, is its newest event: the prepass removes the event
  file of every object it restores (after writing the batch), and a compile edge writes one after;
- otherwise its batch entry.

The batch keeps the entries of earlier prepasses for objects this one did not restore, and is
written whole and renamed into place, so a prepass killed at any point leaves the previous batch or
the new one, never a torn one. Killed between the batch and the removals, a restored object's older
event file would still win: the certificate rechecks every object's sha256 against its event, so
that can only make it refuse to certify, never certify the wrong object; and the restored objects'
markers are still there, so the next prepass restores them again.

Runs: where each ninja run that did something starts in ninja's log (`build/.ninja_log`), for the
report of the last build (pp4/report/timeline.py). ninja's log has no mark of its own between runs:
each edge's line holds times from its run's start and nothing else. So the first pp4 edge of a run
(the check before ninja decides, the prepass, a compile, a link, a pin, the certificate) appends
a line to build/.pp4/runs.log, once a run: the run (ninja's pid and start time), the log's size
then, and a checksum of the bytes before that offset (a log that ninja recompacted since no longer
has them, and the mark is not used). Each edge marks as it starts, so every line of the run after
that offset is the run's; an edge that is not pp4's and ends before the first pp4 edge starts (a
toolchain check, configure) is before it. The report reads marks and never writes one: `ninja
report` is a run of its own, and not the last build.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import attrs

from pp4 import ninjarun, statedir
from pp4.files import write_whole

@attrs.frozen
class CompileEvent:
    """How one object of a build came to be: compiled (here or on a cluster node), or reused from a
    stored action. The certificate is written from these."""
    output: str
    source: str
    root: str | None  # the extension source root it belongs to
    status: str  # "compiled" or "reused"
    object_sha256: str
    command: tuple[str, ...] = attrs.field(converter=tuple)  # as it ran: the fixed root's paths
    env: dict = attrs.field(hash=False)
    mounts: dict | None = attrs.field(hash=False)  # the fixed root's mounts; None: it ran where it is
    action_key: str | None = None  # None: compiled and not stored
    input_sets: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    sets_pack: str | None = None  # the pack in the build's state folder that holds them (pp4/store/packs.py)
    not_stored: str | None = None  # why a compiled object was not stored
    missed: str | None = None  # why the newest stored entry of the command did not hold
    not_shared: str | None = None  # why another variant's stored object was not proven to be this one
    remote: str | None = None  # the remote tier a compiled object was published to
    executed_on: str | None = None  # the cluster node that compiled it
    compile_duration_s: float | None = None  # reused: the stored compile's
    compile_cpu_s: float | None = None  # compiled here: its process tree's CPU
    via: str | None = None  # reused: by the prepass or by its own compile edge
    tier: str | None = None  # reused: "local" or "remote"
    fetched_from: str | None = None  # reused from the remote tier: which
    reused_from: dict | None = attrs.field(default=None, hash=False)  # reused: where it was compiled
    restore_duration_s: float | None = None
    # The builders' signatures of the entry (restored: the trusted ones that verified; compiled and
    # stored: the entry's, this builder's among them) and the payload they cover, which the
    # certificate keeps and `ninja certify` checks again (pp4/store/signing.py).
    signatures: list = attrs.field(factory=list, hash=False)
    signed_payload: dict | None = attrs.field(default=None, hash=False)

    def to_json(self) -> dict:
        return attrs.asdict(self, value_serializer=lambda _i, _a, v: list(v) if isinstance(v, tuple) else v)

    @classmethod
    def from_json(cls, doc) -> "CompileEvent | None":
        """None when doc is not an event (a damaged file reads as no event: the certificate refuses)."""
        if not isinstance(doc, dict):
            return None
        names = {f.name for f in attrs.fields(cls)}
        try:
            return cls(**{k: v for k, v in doc.items() if k in names})
        except (TypeError, ValueError):
            return None


def event_path(state_dir: str, output: str) -> Path:
    return statedir.part(state_dir, statedir.EVENTS) / (output.replace(os.sep, "__") + ".json")


def batch_path(state_dir: str) -> Path:
    return statedir.part(state_dir, statedir.PREPASS_EVENTS)


def write(state_dir: str, event: CompileEvent) -> None:
    """One object's event, from a compile edge (whole, then renamed)."""
    write_whole(event_path(state_dir, event.output), json.dumps(event.to_json(), sort_keys=True))


def read_batch(state_dir: str) -> dict[str, dict]:
    """The prepass batch: output -> event; empty when missing or unreadable (then every restored
    object lacks an event, which the certificate refuses)."""
    try:
        doc = json.loads(batch_path(state_dir).read_text())
        events = doc["events"]
        return events if isinstance(events, dict) else {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def write_batch(state_dir: str, new: list[CompileEvent]) -> dict[str, dict]:
    """Add a prepass's events to the batch (whole file, renamed into place), then remove the event
    files they supersede. Order matters: see the module's docstring. Returns the whole batch."""
    events = read_batch(state_dir)
    if not new:
        return events
    events.update({e.output: e.to_json() for e in new})
    _put_batch(state_dir, events)
    for e in new:
        event_path(state_dir, e.output).unlink(missing_ok=True)
    return events


def _put_batch(state_dir: str, events: dict[str, dict]) -> None:
    write_whole(batch_path(state_dir), json.dumps({"events": events}, sort_keys=True))


def collect(state_dir: str, outputs: set[str], batch: dict[str, dict]) -> int:
    """Remove the events of outputs this build no longer has (a target configured away, a source
    removed), files and entries of batch (the batch as write_batch just returned it). Returns how
    many went."""
    keep = {event_path(state_dir, o).name for o in outputs}
    removed = 0
    for path in statedir.part(state_dir, statedir.EVENTS).glob("*.json"):
        if path.name not in keep:
            path.unlink(missing_ok=True)
            removed += 1
    stale = [o for o in batch if o not in outputs]
    if stale:
        _put_batch(state_dir, {o: e for o, e in batch.items() if o in outputs})
    return removed + len(stale)


class Events:
    """The events of one build's state directory, as the certificate and the prepass read them."""

    def __init__(self, state_dir: str, batch: dict[str, dict] | None = None):
        self.state_dir = state_dir
        self._batch = read_batch(state_dir) if batch is None else batch  # batch: as just written

    def get(self, output: str) -> CompileEvent | None:
        """An output's newest event, or None when it has none (or its file is damaged)."""
        try:
            doc = json.loads(event_path(self.state_dir, output).read_text())
        except FileNotFoundError:
            doc = self._batch.get(output)
        except (OSError, ValueError):
            return None
        return CompileEvent.from_json(doc)



# -- ninja runs -------------------------------------------------------------------------------

NINJA_LOG = ".ninja_log"  # ninja's own, in the build folder (build.ninja's `builddir`)
RUNS_KEPT = 16  # the newest marks a rewrite keeps (the report needs the last few)
_CHECKED = 256  # bytes before a mark's offset that its checksum covers


@attrs.frozen
class RunMark:
    """Where a ninja run starts in ninja's log: its lines are those after log_offset."""
    run: str  # ninjarun.run_id(): ninja's pid and start time
    log_offset: int  # the log's size when the run's first pp4 edge started
    before: int  # crc32 of the log's _CHECKED bytes before log_offset

    def holds(self, log: bytes) -> bool:
        """Whether the log still has the bytes this mark was made after (ninja rewrites its log
        whole when it recompacts it: then the offset means nothing)."""
        return (self.log_offset <= len(log) and (self.log_offset == 0 or log[self.log_offset - 1:self.log_offset] == b"\n")
                and zlib.crc32(log[max(0, self.log_offset - _CHECKED):self.log_offset]) == self.before)


def runs_path(state_dir: str | Path) -> Path:
    return statedir.part(state_dir, statedir.RUNS)


def ninja_log(state_dir: str | Path) -> Path:
    return Path(state_dir).parent / NINJA_LOG


def read_runs(state_dir: str | Path) -> list[RunMark]:
    """The marks, oldest first (a damaged line is left out)."""
    try:
        text = runs_path(state_dir).read_text()
    except (OSError, ValueError):
        return []
    marks = []
    for line in text.splitlines():
        words = line.split()
        if len(words) == 3 and words[1].isdigit() and words[2].isdigit():
            marks.append(RunMark(words[0], int(words[1]), int(words[2])))
    return marks


def mark_run(state_dir: str | Path, run: str | None = None) -> None:
    """Mark the start of this ninja run (run: its ninjarun.run_id(), else the one this process runs
    under), once a run: every pp4 edge calls it as it starts. Nothing when not run by ninja."""
    run = run or ninjarun.run_id()
    if run is None:
        return
    marks = read_runs(state_dir)
    if any(m.run == run for m in marks):
        return
    try:
        with open(ninja_log(state_dir), "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _CHECKED))
            tail = f.read(size - max(0, size - _CHECKED))
    except OSError:
        size, tail = 0, b""
    line = f"{run} {size} {zlib.crc32(tail)}\n"
    path = runs_path(state_dir)
    try:
        if len(marks) >= 2 * RUNS_KEPT:  # rewritten whole now and then: the file stays small
            write_whole(path, "".join(f"{m.run} {m.log_offset} {m.before}\n" for m in marks[-RUNS_KEPT:]) + line)
        else:  # one write of one short line to a file opened to append: edges of one run may race here
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
    except OSError:
        pass  # the report then counts this run as the log's own order says
