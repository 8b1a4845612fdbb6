"""The store as one compile sees it: one call down to find an object, one to keep one; the tier order
lives here and nowhere else.

    find(mkey, sound, holds[, fits])
                               the local store's entries for a command, newest first; then the
                               remote tier's, whose input sets are fetched (checked) into the local
                               set folder first, and whose object, once an entry holds, is checked
                               and put into the local store, which then serves it; `fits`, when
                               given, must accept the action record too
    keep(mkey, entry, sets, object, payload)
                               the input sets, the object, the manifest entry, in that order (an
                               entry never names what is not there); then the remote tier
    index(key, entry, published)
                               a kept entry named under a second key as well, in both tiers

What an entry must satisfy is the caller's (pp4.reuse): `sound(entry)`, its action key follows from
its inputs, `holds(entry)`, every observation of its input sets holds now, and for another variant's
entry `fits(entry, record)`, the record's command is this one's but for the module's name and the
compile is proven not to read it. The store never asks
why. Every fault of a tier ends as a miss or as "not stored", said once on stderr, never as a wrong
object.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import attrs

from pp4.store import hashed
from pp4.store.layout import SETS_FOLDER
from pp4.store.local import Store
from pp4.store.manifests import MANIFEST_ENTRIES, ManifestEntry, Manifests
from pp4.store.records import ActionRecord, CorruptObject, ObjectMissing, StoreError

Check = Callable[[ManifestEntry], bool]
Fits = Callable[[ManifestEntry, ActionRecord], bool]


@attrs.frozen
class Found:
    entry: ManifestEntry
    record: ActionRecord
    tier: str = "local"  # "remote": fetched from the remote tier (checked) into the local store first


@attrs.frozen
class Kept:
    """What keep() did: the record the store holds for the action (None: not stored, and why)."""
    record: ActionRecord | None
    problem: str | None = None
    existed: bool = False  # the store held this action already (an earlier compile's record)
    remote: str | None = None  # the remote tier it was published to


class StoreFront:
    def __init__(self, root: str | Path, remote: dict | None, state_dir: str | Path, tmpdir: Path):
        """StoreError when the local store cannot be opened (an unwritable place with no store)."""
        self.root = Path(root)
        self.local = Store(root)
        self.manifests = Manifests(root)
        self.sets = self.root / SETS_FOLDER
        self._sets_here: set[str] = set()  # sets this process found intact in (or fetched into) self.sets
        self.tmpdir = tmpdir
        # Remote hits are restored through the local store, so the tier comes only with one. Its
        # modules (a URL parser, a client) are loaded only by builds that have one.
        self.remote = None
        if remote:
            from pp4.store.remote.tier import RemoteTier

            self.remote = RemoteTier.from_config(remote, state_dir)

    # -- finding ------------------------------------------------------------------------------

    def find(self, mkey: str, sound: Check, holds: Check, fits: Fits | None = None, remote: bool = True) -> Found | None:
        """fits(entry, record): a further condition on the action record an entry names; remote
        False: the local store alone."""
        for entry in reversed(self.manifests.read(mkey)):
            if not sound(entry) or not holds(entry):
                continue
            try:
                record = self.local.lookup(entry.action_key)
            except StoreError as e:
                print(f"pp4.reuse: warning: {e} (compiling instead)", file=sys.stderr)
                return None
            if record is not None and (fits is None or fits(entry, record)):
                return Found(entry, record)
        if self.remote is not None and remote:
            from pp4.store.remote import RemoteUnavailable

            try:
                return self._find_remote(mkey, sound, holds, fits)
            except RemoteUnavailable:
                self.remote = None  # said once (pp4/store/remote/tier.py); this process goes on locally
        return None

    def _find_remote(self, mkey: str, sound: Check, holds: Check, fits: Fits | None) -> Found | None:
        remote = self.remote
        for entry in reversed(remote.entries(mkey)):
            if not sound(entry):
                remote.refuse(f"man/{mkey}", "an entry whose action key does not follow from its observations")
                continue
            if not self._sets_from_remote(entry) or not holds(entry):
                continue
            try:
                record = self.local.lookup(entry.action_key)
            except StoreError:
                record = None
            if record is None:
                fetched = remote.fetch(entry.action_key)
                if fetched is None:
                    continue
                record = self._fill_local(*fetched)
                if record is None:
                    return None
            if fits is not None and not fits(entry, record):
                continue
            self.add_entry(mkey, entry, sound)
            return Found(entry, record, tier="remote")
        return None

    def _sets_from_remote(self, entry: ManifestEntry) -> bool:
        """Put the entry's input sets the local folder lacks there, as the remote holds them
        (checked against their names); False when one is missing there too. Each set is checked
        once per process: a prepass meets the same few dozen sets in hundreds of entries."""
        for sid in entry.input_sets:
            if sid in self._sets_here:
                continue
            if hashed.read(self.sets, sid) is None:
                data = self.remote.input_set(sid)
                if data is None:
                    return False
                hashed.write(self.sets, sid, data)
            self._sets_here.add(sid)
        return True

    def set_bytes(self, sid: str) -> bytes | None:
        """An observation set as the local store holds it (checked against its name)."""
        return hashed.read(self.sets, sid)

    def _fill_local(self, record: ActionRecord, blob: bytes) -> ActionRecord | None:
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        staged = self.tmpdir / f"remote-{record.object_sha256[:16]}-{os.getpid()}.o"
        try:
            staged.write_bytes(blob)
            return self.local.put(record.action_key, staged, dict(record.payload, fetched_from=self.remote.describe()))
        except (OSError, StoreError) as e:
            print(f"pp4.reuse: warning: cannot keep the remote store's object in the local store ({e}); "
                  "compiling instead", file=sys.stderr)
            return None
        finally:
            staged.unlink(missing_ok=True)

    def materialize(self, found: Found, out: Path) -> str | None:
        """Put the object at out, checked again; None, or why it could not be (then: compile)."""
        try:
            # A copy, not a hard link: a later compile writing to the output in place must never
            # reach the stored object through a shared inode.
            self.local.materialize(found.record, out, allow_link=False)
            return None
        except (CorruptObject, ObjectMissing) as e:
            return str(e)

    # -- keeping ------------------------------------------------------------------------------

    def keep(self, mkey: str, entry: ManifestEntry, sets: dict[str, bytes], object_path: str, sha256: str,
             payload: dict, sound: Check) -> Kept:
        """sha256: the object's digest as its compile left it; a store that read other bytes adds no entry."""
        existing = self.local.lookup(entry.action_key)
        if existing is not None:
            # The same action, stored by an earlier compile (whose entry the manifest may lack:
            # a put killed before the manifest was written).
            self.add_entry(mkey, entry, sound)
            return Kept(existing, existed=True, remote=self._publish(mkey, entry, sets, existing, object_path, sound))
        try:
            for sid, data in sets.items():  # the sets first: an entry or record never names a set the store lacks
                hashed.write(self.sets, sid, data)
        except OSError as e:  # a full or read-only store: said as the store says it for objects
            problem = str(self.local.os_error(e, "writing an observation set"))
            print(f"pp4.reuse: warning: {problem} (the object was built; it is just not stored)", file=sys.stderr)
            return Kept(None, problem)
        try:
            record = self.local.put(entry.action_key, object_path, payload)
        except StoreError as e:
            print(f"pp4.reuse: warning: {e} (the object was built; it is just not stored)", file=sys.stderr)
            return Kept(None, str(e))
        if record.object_sha256 != sha256:
            return Kept(None, "the object changed while it was being stored")
        self.add_entry(mkey, entry, sound)
        return Kept(record, remote=self._publish(mkey, entry, sets, record, object_path, sound))

    def add_entry(self, mkey: str, entry: ManifestEntry, sound: Check) -> None:
        try:
            self.manifests.add(mkey, entry, MANIFEST_ENTRIES, sound)
        except OSError as e:  # a full or read-only store: the object is stored, but not findable yet
            print(f"pp4.reuse: warning: cannot write the store's manifest {self.manifests.path(mkey)} "
                  f"({e.strerror}); this object will not be reused until it is compiled again with room "
                  "in the store", file=sys.stderr)

    def index(self, key: str, entry: ManifestEntry, published: bool) -> None:
        """Name a kept entry under a second key too (a name-free key: pp4/reuse/variants.py), locally
        and, where the compile was published, in the remote tier, which holds its object already."""
        self.add_entry(key, entry, sound=lambda e: True)
        if published and self.remote is not None:
            self.remote.publish_entry(key, entry, keep=lambda e: True)

    def _publish(self, mkey: str, entry: ManifestEntry, sets: dict[str, bytes], record: ActionRecord,
                 object_path: str, sound: Check) -> str | None:
        """Send a kept compile to the remote tier (readwrite mode); where it went."""
        if self.remote is None or not self.remote.writes:
            return None
        ok = self.remote.publish(mkey, entry, sets, record, object_path, keep=sound)
        return self.remote.describe() if ok else None

    @contextmanager
    def compile_lock(self, mkey: str) -> Iterator[bool]:
        """Held while compiling, per manifest key: the same command run by two builds at once (two
        build folders or checkouts, whose commands are the same in the fixed root) compiles once,
        and the second then finds what the first kept. Waiting is a scheduling choice, never a
        correctness one: the lookup after it decides. Yields True when it waited."""
        with self.manifests.lock(mkey, lambda: True) as waited:
            yield waited
