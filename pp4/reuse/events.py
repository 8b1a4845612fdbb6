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

from pp4.files import write_whole

BATCH = "prepass-events.json"


def event_path(state_dir: str, output: str) -> Path:
    return Path(state_dir) / "events" / (output.replace(os.sep, "__") + ".json")


def batch_path(state_dir: str) -> Path:
    return Path(state_dir) / BATCH


def write(state_dir: str, output: str, doc: dict) -> None:
    """One object's event, from a compile edge (whole, then renamed)."""
    write_whole(event_path(state_dir, output), json.dumps(doc, sort_keys=True))


def read_batch(state_dir: str) -> dict[str, dict]:
    """The prepass batch: output -> event; empty when missing or unreadable (then every restored
    object lacks an event, which the certificate refuses)."""
    try:
        doc = json.loads(batch_path(state_dir).read_text())
        events = doc["events"]
        return events if isinstance(events, dict) else {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def write_batch(state_dir: str, new: dict[str, dict]) -> dict[str, dict]:
    """Add a prepass's events to the batch (whole file, renamed into place), then remove the event
    files they supersede. Order matters: see the module's docstring. Returns the whole batch."""
    events = read_batch(state_dir)
    if not new:
        return events
    events.update(new)
    write_whole(batch_path(state_dir), json.dumps({"events": events}, sort_keys=True))
    for output in new:
        event_path(state_dir, output).unlink(missing_ok=True)
    return events


class Events:
    """The events of one build's state directory, as the certificate and the prepass read them."""

    def __init__(self, state_dir: str, batch: dict[str, dict] | None = None):
        self.state_dir = state_dir
        self._batch = read_batch(state_dir) if batch is None else batch  # batch: as just written

    def get(self, output: str) -> dict | None:
        """An output's newest event, or None when it has none (or its file is damaged)."""
        try:
            return json.loads(event_path(self.state_dir, output).read_text())
        except FileNotFoundError:
            return self._batch.get(output)
        except (OSError, ValueError):
            return None

