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
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs

from pp4 import statedir
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

