"""The store as one compile sees it: one call down to find an object, one to keep one; the tier order
lives here and nowhere else.

    find(mkey, sound, holds[, fits, group])
                               the local store's entries for a command, newest first; then the
                               remote tier's (its group: pp4/store/remote/tier.py), whose set
                               packs are kept (checked) in the local store first, and whose
                               object, once an entry holds, is checked and put into the local
                               store, which then serves it; `fits`, when given, must accept the
                               action record too, and the remote group's entries of every command
                               are candidates
    keep(mkey, entry, pack, object, payload[, group])
                               the set pack, the object, the manifest entry, in that order (an
                               entry never names what is not there); then the remote tier
    index(key, entry)          a kept entry named under a second key as well (the remote tier
                               names it through its group)

What an entry must satisfy is the caller's (pp4.reuse): `sound(entry)`, its action key follows from
its inputs, `holds(entry)`, every observation of its input sets holds now, and for another variant's
entry `fits(entry, record)`, the record's command is this one's but for the module's name and the
compile is proven not to read it. The store never asks
why. Who stored an entry is the store's own question (pp4/store/signing.py): an entry is found only
when builders on the trust list signed it, in whichever tier it is, and no trusted builder disputes
it; a refused entry is a miss, counted in `refused` with its reason. Every entry this builder keeps
is signed with its key; when the tier holds the action already, the same object adds its signature
there and another object disputes it. Every fault of a tier ends as a miss or as "not stored", said
once on stderr, never as a wrong object.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import attrs

from pp4.store import packs, signing
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
    signers: tuple = ()  # the trusted builders whose signatures of the entry verified


@attrs.frozen
class Kept:
    """What keep() did: the record the store holds for the action (None: not stored, and why)."""
    record: ActionRecord | None
    problem: str | None = None
    existed: bool = False  # the store held this action already (an earlier compile's record)
    remote: str | None = None  # the remote tier it was published to


class StoreFront:
    def __init__(self, root: str | Path, remote: dict | None, state_dir: str | Path,
                 trust: "signing.Trust | None" = None, signer: "signing.Signer | None" = None, *,
                 pack_problem: "Callable[[Path, str, tuple], str | None]"):
        """StoreError when the local store cannot be opened (an unwritable place with no store).
        trust: whose entries may be restored (None: none may); signer: this builder's key (None:
        nothing is kept); pack_problem(folder, name, sids): why a set pack kept there cannot be used
        for an entry naming sids, or None: the reuse rule's SetChecker.problem, which keeps what it
        read for the lookups that follow, so a pack the remote tier sent is checked once."""
        self.pack_problem = pack_problem
        self.trust = trust
        self.signer = signer
        self.refused: list[tuple[str, str]] = []  # (action key, why) of entries not restored for who stored them
        self.root = Path(root)
        self.local = Store(root)
        self.manifests = Manifests(root)
        self.sets = self.root / SETS_FOLDER  # the set packs (pp4/store/packs.py)
        self.prefetched: set[str] = set()  # action keys prefetch() brought from the remote tier
        # Remote hits are restored through the local store, so the tier comes only with one. Its
        # modules (a URL parser, a client) are loaded only by builds that have one.
        self.remote = None
        if remote:
            from pp4.store.remote.tier import RemoteTier

            self.remote = RemoteTier.from_config(remote, state_dir)

    # -- finding ------------------------------------------------------------------------------

    def find(self, mkey: str, sound: Check, holds: Check, fits: Fits | None = None, remote: bool = True,
             group: str | None = None) -> Found | None:
        """fits(entry, record): a further condition on the action record an entry names; remote
        False: the local store alone; group: the remote group the command's entries are in (its
        manifest key when None)."""
        for entry in reversed(self.manifests.read(mkey)):
            if not sound(entry) or not holds(entry):
                continue
            try:
                record = self.local.lookup(entry.action_key)
            except StoreError as e:
                print(f"pp4.reuse: warning: {e} (compiling instead)", file=sys.stderr)
                return None
            if record is not None and (fits is None or fits(entry, record)):
                verdict = self.verdict(entry, record)
                if verdict.ok:
                    tier = "remote" if entry.action_key in self.prefetched else "local"
                    return Found(entry, record, tier=tier, signers=verdict.signers)
        if self.remote is not None and remote:
            from pp4.store.remote import RemoteUnavailable

            try:
                return self._find_remote(mkey, group or mkey, sound, holds, fits)
            except RemoteUnavailable:
                self.remote = None  # said once (pp4/store/remote/tier.py); this process goes on locally
        return None

    def _find_remote(self, mkey: str, name: str, sound: Check, holds: Check, fits: Fits | None) -> Found | None:
        remote = self.remote
        group = remote.group(name)
        for _, entry in reversed(group.entries(None if fits is not None else mkey)):
            if not sound(entry):
                remote.refuse(f"ent/{name}", "an entry whose action key does not follow from its observations")
                continue
            entry = self._pack_from_remote(group, entry)
            if entry is None or not holds(entry):
                continue
            try:
                record = self.local.lookup(entry.action_key)
            except StoreError:
                record = None
            if record is None:
                record = remote.record_in(group, entry.action_key)
                if record is None:
                    continue
                # Who stored it is asked before its object is fetched or kept here.
                verdict = self.verdict(entry, record)
                if not verdict.ok:
                    continue
                frame = remote.object_of(record)
                if frame is None:
                    continue
                record = self._fill_local(record, frame)
                if record is None:
                    return None
            verdict = self.verdict(entry, record)
            if not verdict.ok or (fits is not None and not fits(entry, record)):
                continue
            self.add_entry(mkey, entry, sound)
            return Found(entry, record, tier="remote", signers=verdict.signers)
        return None

    def prefetch(self, wanted: list[tuple[str, str, Check, Check]]) -> int:
        """Bring what the remote tier holds for several commands into the local store in two round
        trips, whatever their number (a prepass asks for every missing object of a build at once):
        their groups (one trip: entries, records and input sets), then the objects of the entries
        whose every observation holds and that builders on the trust list signed (one per 64 MB).
        Each value is checked as find() checks it one at a time; what passes is kept locally, with
        a local manifest entry, so that find() then restores it from the local store. wanted:
        (manifest key, group, sound, holds) of each command. Returns how many entries it kept."""
        if self.remote is None:
            return 0
        from pp4.store.remote import RemoteUnavailable

        try:
            return self._prefetch(wanted)
        except RemoteUnavailable:
            self.remote = None  # said once (pp4/store/remote/tier.py); this process goes on locally
            return 0

    def _prefetch(self, wanted: list[tuple[str, str, Check, Check]]) -> int:
        remote = self.remote
        groups = remote.groups([name for _, name, _, _ in wanted])
        trusted = []
        for mkey, name, sound, holds in wanted:
            group = groups[name]
            for _, entry in reversed(group.entries(mkey)):
                if not sound(entry):
                    remote.refuse(f"ent/{name}", "an entry whose action key does not follow from its observations")
                    continue
                entry = self._pack_from_remote(group, entry)
                if entry is None or not holds(entry):
                    continue
                record = remote.record_in(group, entry.action_key)
                if record is not None and self.verdict(entry, record).ok:
                    trusted.append((mkey, entry, sound, record))
                break  # the newest entry that holds, as find() takes
        frames = remote.objects_of([r for _, _, _, r in trusted])
        kept = 0
        for mkey, entry, sound, record in trusted:
            frame = frames.get(record.object_sha256)
            if frame is None or self._fill_local(record, frame) is None:
                continue
            self.add_entry(mkey, entry, sound)
            self.prefetched.add(entry.action_key)
            kept += 1
        return kept

    def verdict(self, entry: ManifestEntry, record: ActionRecord) -> signing.Verdict:
        """Whether builders on the trust list signed this entry (its record's statement, with the
        entry's input sets); a refusal is noted in `refused`."""
        if self.trust is None:
            verdict = signing.Verdict(False, why="no trust list (configure could not read one)")
        else:
            verdict = self.trust.verdict(record.action_key, record.object_sha256, record.object_size,
                                         entry.input_sets, record.payload, record.signatures, record.disputes)
        if verdict.dispute is not None:  # seen once, kept: a record rewritten without it revives nothing
            signing.remember_dispute(verdict.dispute)
        if not verdict.ok and not any(k == record.action_key for k, _ in self.refused):
            self.refused.append((record.action_key, verdict.why or "not trusted"))
        return verdict

    def _pack_from_remote(self, group, entry: ManifestEntry) -> ManifestEntry | None:
        """The entry, its set pack (as the remote group holds it, checked against its name) kept in
        the local store. None when the group lacks it or the local store cannot keep it."""
        found = self.remote.pack_in(group, entry.pack)
        if found is None:
            return None
        try:
            packs.write(self.sets, found)
        except OSError as e:
            print(f"pp4.reuse: warning: {self.local.os_error(e, 'writing an observation set pack')} "
                  "(compiling instead)", file=sys.stderr)
            return None
        problem = self.pack_problem(self.sets, found.name, entry.input_sets)
        if problem is not None:
            self.remote.refuse(f"ent/{group.name}", f"the set pack {found.name[:16]}: {problem}")
            return None
        return entry

    def pack(self, name: str | None) -> "packs.SetPack | None":
        """A set pack as the local store holds it (checked against its name)."""
        return packs.read(self.sets, name) if name is not None else None

    def _fill_local(self, record: ActionRecord, frame: bytes) -> ActionRecord | None:
        """Keep an object the remote tier sent (its frame, checked against the record) locally."""
        try:
            kept = self.local.put_frame(record.action_key, frame, record.object_sha256, record.object_size,
                                        dict(record.payload, fetched_from=self.remote.describe()),
                                        signatures=record.signatures)
            return self.local.amend(attrs.evolve(kept, disputes=record.disputes)) if record.disputes else kept
        except (OSError, StoreError) as e:
            print(f"pp4.reuse: warning: cannot keep the remote store's object in the local store ({e}); "
                  "compiling instead", file=sys.stderr)
            return None

    def materialize(self, found: Found, out: Path) -> str | None:
        """Put the object at out, checked again; None, or why it could not be (then: compile)."""
        try:
            self.local.materialize(found.record, out)
            return None
        except (CorruptObject, ObjectMissing) as e:
            return str(e)

    # -- keeping ------------------------------------------------------------------------------

    def keep(self, mkey: str, entry: ManifestEntry, pack: "packs.SetPack", object_path: str, sha256: str,
             payload: dict, sound: Check, group: str | None = None) -> Kept:
        """pack: the entry's input sets, in the pack the entry names. sha256: the object's digest as
        its compile left it; a store that read other bytes adds no entry. The entry is signed with
        this builder's key. When a tier holds the action already, the same object gains this
        builder's signature there, and another object is disputed (signed: this builder's compile
        gave other bytes) and never restored again. group: the remote group (the manifest key when
        None)."""
        group = group or mkey
        if self.signer is None:
            return Kept(None, "this builder has no signing key, so nothing it compiles is stored "
                              "(python -m pp4.store keys new)")
        try:  # the sets first: an entry or record never names a set the store lacks
            packs.write(self.sets, pack)
        except OSError as e:  # a full or read-only store: said as the store says it for objects
            problem = str(self.local.os_error(e, "writing an observation set pack"))
            print(f"pp4.reuse: warning: {problem} (the object was built; it is just not stored)", file=sys.stderr)
            return Kept(None, problem)
        existing = self.local.lookup(entry.action_key)
        if existing is not None:
            # The same action, stored by an earlier compile (whose entry the manifest may lack:
            # a put killed before the manifest was written), or by another builder.
            if existing.object_sha256 != sha256:
                return self._dispute(existing, sha256, group)
            existing = self._countersign(existing, entry)
            self.add_entry(mkey, entry, sound)
            return Kept(existing, existed=True,
                        remote=self._publish(group, mkey, entry, pack, existing, object_path, sound))
        try:
            size = os.stat(object_path).st_size
            signature = self._signature(entry.action_key, sha256, size, entry, payload)
            record = self.local.put(entry.action_key, object_path, payload, signatures=[signature])
        except (OSError, StoreError) as e:
            print(f"pp4.reuse: warning: {e} (the object was built; it is just not stored)", file=sys.stderr)
            return Kept(None, str(e))
        if record.object_sha256 != sha256:
            return Kept(None, "the object changed while it was being stored")
        self.add_entry(mkey, entry, sound)
        return Kept(record, remote=self._publish(group, mkey, entry, pack, record, object_path, sound))

    def _signature(self, action_key: str, sha256: str, size: int, entry: ManifestEntry, payload: dict) -> dict:
        message = signing.statement(action_key, sha256, size, entry.input_sets, payload)
        return {"signer": self.signer.public.key, "sig": self.signer.sign(message), "name": self.signer.public.name}

    def _countersign(self, record: ActionRecord, entry: ManifestEntry) -> ActionRecord:
        """The record with this builder's signature added (kept in the local store), if it lacks one."""
        if any(signing.raw_signer(s.get("signer")) == self.signer.public.raw for s in record.signatures):
            return record
        signature = self._signature(record.action_key, record.object_sha256, record.object_size, entry, record.payload)
        try:
            return self.local.amend(attrs.evolve(record, signatures=(*record.signatures, signature)))
        except (OSError, StoreError):
            return record

    def _dispute(self, record: ActionRecord, sha256: str, group: str) -> Kept:
        """This builder compiled the action and got other bytes than the stored entry: it signs a
        dispute into the local and the remote record, remembers the action as disputed, and says so
        loudly. Its own object is used by this build, and stored nowhere."""
        dispute = {"signer": self.signer.public.key, "object_sha256": sha256,
                   "sig": self.signer.sign(signing.dispute_statement(record.action_key, sha256)),
                   "name": self.signer.public.name}
        signing.remember_dispute(dict(dispute, action_key=record.action_key))
        try:
            self.local.amend(attrs.evolve(record, disputes=(*record.disputes, dispute)))
        except (OSError, StoreError):
            pass
        if self.remote is not None and self.remote.writes:
            self.remote.add_dispute(group, record.action_key, dispute)
        label = self.trust.label if self.trust is not None else (lambda signer: f"{str(signer)[:12]}...")
        signers = ", ".join(label(s.get("signer")) for s in record.signatures) or "nobody"
        problem = (f"DISAGREES with the store: this compile of action {record.action_key[:16]} gave {sha256[:16]}, the "
                   f"entry signed by {signers} holds {record.object_sha256[:16]}: either the entry was forged (poisoning) "
                   "or the compiler is not deterministic here. The entry is disputed and never restored again")
        print(f"pp4.reuse: WARNING: {problem}", file=sys.stderr)
        return Kept(None, problem)

    def add_entry(self, mkey: str, entry: ManifestEntry, sound: Check) -> None:
        try:
            self.manifests.add(mkey, entry, MANIFEST_ENTRIES, sound)
        except OSError as e:  # a full or read-only store: the object is stored, but not findable yet
            print(f"pp4.reuse: warning: cannot write the store's manifest {self.manifests.path(mkey)} "
                  f"({e.strerror}); this object will not be reused until it is compiled again with room "
                  "in the store", file=sys.stderr)

    def index(self, key: str, entry: ManifestEntry) -> None:
        """Name a kept entry under a second key too (a name-free key: pp4/reuse/variants.py) in the
        local store; the remote tier keeps the entry in that key's group already."""
        self.add_entry(key, entry, sound=lambda e: True)

    def _publish(self, group: str, mkey: str, entry: ManifestEntry, pack: "packs.SetPack", record: ActionRecord,
                 object_path: str, sound: Check) -> str | None:
        """Send a kept compile to the remote tier (readwrite mode); where it went. The remote's
        signatures of the same object are merged into the local record (and this one's into the
        remote's); a remote record of other bytes is disputed, not replaced."""
        if self.remote is None or not self.remote.writes:
            return None
        published = self.remote.publish(group, mkey, entry, pack, record, object_path, keep=sound)
        if published is None:
            return None
        if published.object_sha256 != record.object_sha256:
            self._dispute(published, record.object_sha256, group)
            return None
        if set(map(_signer, published.signatures)) - set(map(_signer, record.signatures)):
            try:
                self.local.amend(attrs.evolve(record, signatures=published.signatures))
            except (OSError, StoreError):
                pass
        return self.remote.describe()

    @contextmanager
    def compile_lock(self, mkey: str) -> Iterator[bool]:
        """Held while compiling, per manifest key: the same command run by two builds at once (two
        build folders or checkouts, whose commands are the same in the fixed root) compiles once,
        and the second then finds what the first kept. Waiting is a scheduling choice, never a
        correctness one: the lookup after it decides. Yields True when it waited."""
        with self.manifests.lock(mkey, lambda: True) as waited:
            yield waited


def _signer(signature: dict) -> str:
    return str(signature.get("signer"))
