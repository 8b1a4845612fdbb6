"""The remote tier: what a build keeps on a remote storage, and the checks that make it harmless.

Two kinds of value, each a zstd frame (pp4/store/compressed.py) under a key that is a digest
(pp4/store/remote/__init__.py), so a stored object costs two keys and a restore two round trips:

    ent/<group>    a unit's entries: for each manifest key of the group, its most recent entries;
                   the action record (checksummed JSON, pp4/store/records.py) of every entry; the
                   set pack (pp4/store/packs.py) of every entry, as the local store keeps it. One
                   frame: the group's JSON, a newline, then the packs' frames end to end
    obj/<sha256>   an object's bytes; its name is their hash

A group is the name-free key the variants of a unit share (pp4/reuse/variants.py), else the unit's
manifest key: one read brings a command's entries, their records and observations, and those of
the other variants. A compile's results are published object first, its group last, so a reader
that finds an entry finds what it names (or, after an eviction, a miss); a group is written whole,
so it never names a record or pack it lacks. Nothing read is trusted: a frame must expand within its
bound, a pack must hash to its name and each of its sets to its own, a record must be for the action
key it is filed under and pass its checksum, an object must hash to the record's sha256 and have its
size; the reuse rule then checks every entry as it checks a local one (its action key must follow
from its inputs, which must hash to their local bytes) and the trust list who signed it. A value
that fails is refused: one warning line, a line in build/.pp4/remote/refused.log, never used.

A group is read, merged and written: two builders publishing the same unit at the same moment may
lose one's entry (a later miss, never a wrong hit).

A remote that cannot answer (RemoteUnavailable) is left alone by every process of the build for
RETRY_S seconds: one warning, then local work only, so a dead server costs one timeout, not one per
compile.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import attrs

from pp4 import backoff
from pp4 import statedir
from pp4.files import canonical_json
from pp4.store import compressed, packs
from pp4.store.manifests import MANIFEST_ENTRIES, ManifestEntry, parse_entries
from pp4.store.records import SHA256_RE, ActionRecord, InvalidRecord, decode_record, encode_record
from pp4.store.remote import REDACTED, RemoteStorage, RemoteUnavailable, redact
from pp4.store.remote.backend import open_remote

MODES = ("read", "readwrite")
RETRY_S = backoff.RETRY_S
# 1: separate man/, act/ and set/ values, uncompressed (another key kind); 2: each set's JSON in the
# group's (refused as a group of another format: a miss)
GROUP_FORMAT = 3
# The most a group may expand to (16 entries of a few variants, each with its observations) and how
# many objects' bytes one batched read asks for.
GROUP_LIMIT = 256 << 20
OBJECT_BYTES_PER_TRIP = 64 << 20
KINDS = ("obj", "ent")


@attrs.define
class Group:
    """One ent/<group> value as read: entries by manifest key, records and set packs by name
    (bytes, each checked when used)."""
    name: str
    manifests: dict[str, list[ManifestEntry]] = attrs.Factory(dict)
    records: dict[str, bytes] = attrs.Factory(dict)
    packs: dict[str, bytes] = attrs.Factory(dict)

    def entries(self, mkey: str | None = None) -> list[tuple[str, ManifestEntry]]:
        """(manifest key, entry) of one manifest key, or of all, oldest first per key."""
        keys = [mkey] if mkey is not None else sorted(self.manifests)
        return [(k, e) for k in keys for e in self.manifests.get(k, [])]

    def encode(self) -> bytes:
        names = sorted(self.packs)
        doc = {"format": GROUP_FORMAT, "group": self.name,
               "manifests": {k: [e.to_json() for e in es] for k, es in self.manifests.items() if es},
               "records": {k: v.decode() for k, v in self.records.items()},
               "packs": [[n, len(self.packs[n])] for n in names]}
        # The packs are zstd frames already: the outer frame stores them as they are, and costs
        # about 3 bytes a block.
        return compressed.compress(canonical_json(doc) + b"\n" + b"".join(self.packs[n] for n in names))


def decode_group(name: str, frame: bytes) -> Group:
    """A group's value, its shape checked (NotAGroup otherwise); records and packs are checked one
    by one where they are used."""
    try:
        content = compressed.decompress(frame, GROUP_LIMIT)
        head, _, tail = content.partition(b"\n")
        doc = json.loads(head)
    except (compressed.NotAFrame, ValueError, RecursionError) as e:
        raise NotAGroup(str(e)) from None
    if isinstance(doc, dict) and isinstance(doc.get("format"), int) and doc["format"] != GROUP_FORMAT:
        raise OtherFormat(f"a group of format {doc['format']}, which this pp4 does not read (it reads {GROUP_FORMAT})")
    if not isinstance(doc, dict) or doc.get("format") != GROUP_FORMAT or doc.get("group") != name:
        raise NotAGroup(f"not a group of format {GROUP_FORMAT} named {name[:16]}")
    manifests, records, sizes = doc.get("manifests"), doc.get("records"), doc.get("packs")
    if not (isinstance(manifests, dict) and all(isinstance(v, list) for v in manifests.values())
            and isinstance(records, dict) and all(isinstance(v, str) for v in records.values())
            and isinstance(sizes, list) and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
                                                and isinstance(p[1], int) and p[1] >= 0 for p in sizes)
            and sum(p[1] for p in sizes) == len(tail)):
        raise NotAGroup("its manifests, records or packs are not what a group holds")
    found, at = {}, 0
    for pack_name, size in sizes:
        found[pack_name] = tail[at:at + size]
        at += size

    def sets_of(pack_name: str) -> list[str]:
        try:
            return packs.names(found[pack_name])
        except (KeyError, packs.NotAPack):
            raise NotAGroup(f"an entry names the set pack {pack_name[:40]!r}, which the group lacks or cannot "
                            "be read") from None

    return Group(name, {k: parse_entries(v, sets_of) for k, v in manifests.items()},
                 {k: v.encode() for k, v in records.items()}, found)


class NotAGroup(ValueError):
    pass


class OtherFormat(NotAGroup):
    """A group another pp4 wrote in its own format: not damage, so read as empty without a warning
    (a miss), and replaced whole by the next compile of its unit that this pp4 publishes."""


class RemoteTier:
    def __init__(self, storage: RemoteStorage, mode: str, state_dir: str | Path):
        if mode not in MODES:
            raise ValueError(f"remote store mode {mode!r}: read or readwrite")
        self.storage = storage
        self.mode = mode
        self.folder = statedir.part(state_dir, statedir.REMOTE)
        self.refused = 0
        self._groups: dict[str, Group] = {}  # read once per process

    @classmethod
    def from_config(cls, config: dict | None, state_dir: str | Path) -> "RemoteTier | None":
        """The tier a build's pp4.json names, or None (none configured, or down a moment ago)."""
        if not config:
            return None
        folder = statedir.part(state_dir, statedir.REMOTE)
        if _recently_down(folder):
            return None
        try:
            storage = open_remote(url_with_secret(config["url"], state_dir), ttl=config.get("ttl"))
        except (ValueError, RemoteUnavailable) as e:
            _mark_down(folder, str(e))
            return None
        return cls(storage, config.get("mode", "readwrite"), state_dir)

    @property
    def writes(self) -> bool:
        return self.mode == "readwrite"

    def describe(self) -> str:
        return redact(self.storage.describe())

    # -- reading ---------------------------------------------------------------------------

    def groups(self, names: list[str]) -> dict[str, Group]:
        """Several groups, in one round trip for those this process has not read; a missing or
        damaged one reads as empty."""
        wanted = [n for n in dict.fromkeys(names) if n not in self._groups]
        for name, frame in zip(wanted, self._get_many([f"ent/{n}" for n in wanted])):
            self._groups[name] = self._decode(name, frame)
        return {n: self._groups[n] for n in names}

    def group(self, name: str) -> Group:
        return self.groups([name])[name]

    def _decode(self, name: str, frame: bytes | None) -> Group:
        if frame is None:
            return Group(name)
        try:
            return decode_group(name, frame)
        except OtherFormat:
            return Group(name)
        except NotAGroup as e:
            self.refuse(f"ent/{name}", f"not a group ({e})")
            return Group(name)

    def record_in(self, group: Group, action_key: str) -> ActionRecord | None:
        """The action record a group holds for a key, checked (its checksum, its key), or None."""
        data = group.records.get(action_key)
        if data is None:
            return None
        try:
            return decode_record(data, expected_key=action_key)
        except InvalidRecord as e:
            self.refuse(f"ent/{group.name}", f"the record of {action_key[:16]}: {e}")
            return None

    def pack_in(self, group: Group, name: str | None) -> packs.SetPack | None:
        """The set pack a group holds under a name, its frame checked against the name (its sets
        are checked against theirs where they are opened), or None."""
        if not (isinstance(name, str) and SHA256_RE.fullmatch(name)):
            self.refuse(f"ent/{group.name}", f"an entry names a set pack {str(name)[:40]!r}, not a sha256")
            return None
        frame = group.packs.get(name)
        if frame is None:
            return None
        if hashlib.sha256(frame).hexdigest() != name:
            self.refuse(f"ent/{group.name}", f"the set pack {name[:16]}: its bytes do not hash to its name")
            return None
        return packs.SetPack(name, frame)

    def objects_of(self, records: list[ActionRecord]) -> dict[str, bytes]:
        """The objects several records name, as their zstd frames (what the local store keeps), each
        checked, in a round trip per OBJECT_BYTES_PER_TRIP."""
        found: dict[str, bytes] = {}
        wanted = list({r.object_sha256: r for r in records}.values())
        start = 0
        while start < len(wanted):
            end, size = start, 0
            while end < len(wanted) and (end == start or size + wanted[end].object_size <= OBJECT_BYTES_PER_TRIP):
                size += wanted[end].object_size
                end += 1
            chunk = wanted[start:end]
            for record, frame in zip(chunk, self._get_many([f"obj/{r.object_sha256}" for r in chunk])):
                if self._checked(record, frame):
                    found[record.object_sha256] = frame
            start = end
        return found

    def object_of(self, record: ActionRecord) -> bytes | None:
        """The object a record names, its frame checked against its sha256 and size, or None."""
        return self.objects_of([record]).get(record.object_sha256)

    def _checked(self, record: ActionRecord, frame: bytes | None) -> bool:
        if frame is None:
            return False  # evicted: a miss
        try:
            blob = compressed.decompress(frame, record.object_size)
        except compressed.NotAFrame as e:
            self.refuse(f"obj/{record.object_sha256}", f"not the object the record of action "
                        f"{record.action_key[:16]} names ({e})")
            return False
        if len(blob) != record.object_size or hashlib.sha256(blob).hexdigest() != record.object_sha256:
            self.refuse(f"obj/{record.object_sha256}", f"{len(blob)} bytes that do not hash to the sha256 "
                        f"the record of action {record.action_key[:16]} names")
            return False
        return True

    # -- writing ---------------------------------------------------------------------------

    def publish(self, group: str, mkey: str, entry: ManifestEntry, pack: packs.SetPack, record: ActionRecord,
                object_path: str, keep) -> ActionRecord | None:
        """Put one compile's results: its object, then its group with the entry, its record and its
        set pack (the one the entry names). keep(entry) says which of the manifest key's present
        entries stay beside the new one. Returns the record the remote holds for the action now (its
        signatures and this one's, when its object is this one), or None when not all of it got
        there. A record of another object is left as it is (returned: the caller disputes it)."""
        if not self.writes:
            return None
        try:
            there_group = self._fresh(group)
            there = self.record_in(there_group, record.action_key)
            if there is not None and there.object_sha256 != record.object_sha256:
                return there
            # Written over whatever is there: a value under a digest's name has one right content,
            # so a damaged one is healed.
            self.storage.put(f"obj/{record.object_sha256}", compressed.compress(Path(object_path).read_bytes()))
            merged = record
            if there is not None:
                merged = attrs.evolve(record, signatures=_union(there.signatures, record.signatures),
                                      disputes=_union(there.disputes, record.disputes))
            kept = [e for e in there_group.manifests.get(mkey, []) if e.action_key != entry.action_key and keep(e)]
            there_group.manifests[mkey] = (kept + [entry])[-MANIFEST_ENTRIES:]
            there_group.records[record.action_key] = encode_record(merged)
            there_group.packs[pack.name] = pack.frame
            self._write(there_group)
            return merged
        except RemoteUnavailable as e:
            self.down(str(e))
            return None
        except OSError as e:  # the object to send vanished: nothing published names it
            print(f"pp4.reuse: warning: cannot send {object_path} to the remote store ({e.strerror})", file=sys.stderr)
            return None

    def add_dispute(self, group: str, action_key: str, dispute: dict) -> None:
        """Add a builder's dispute to the remote record of an action (read, merge, write)."""
        try:
            there_group = self._fresh(group)
            there = self.record_in(there_group, action_key)
            if there is not None:
                there_group.records[action_key] = encode_record(
                    attrs.evolve(there, disputes=_union(there.disputes, (dispute,))))
                self._write(there_group)
        except RemoteUnavailable as e:
            self.down(str(e))

    def _fresh(self, name: str) -> Group:
        """A group as the remote holds it now (a writer merges into what is there, not what this
        process read earlier)."""
        self._groups.pop(name, None)
        return self.group(name)

    def _write(self, group: Group) -> None:
        """A group written whole, without the records and packs no entry names any more."""
        named = {e.action_key for _, e in group.entries()}
        group.records = {k: v for k, v in group.records.items() if k in named}
        wanted = {e.pack for _, e in group.entries()}
        group.packs = {k: v for k, v in group.packs.items() if k in wanted}
        self.storage.put(f"ent/{group.name}", group.encode())
        self._groups[group.name] = group

    # -- faults ----------------------------------------------------------------------------

    def _get_many(self, keys: list[str]) -> list[bytes | None]:
        if not keys:
            return []
        try:
            return self.storage.get_many(keys)
        except RemoteUnavailable as e:
            self.down(str(e))
            raise

    def down(self, reason: str) -> None:
        _mark_down(self.folder, reason)

    def refuse(self, key: str, why: str) -> None:
        """A remote value that failed its check: said and counted once per build, never used."""
        if any(f" {key}: {why}" in seen for seen in refusals(self.folder.parent)):
            return  # the prepass refused it already; this compile's own lookup met it again
        self.refused += 1
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {self.describe()} {key}: {why}"
        print(f"pp4.reuse: warning: refused the remote store's {key[:24]}: {why}", file=sys.stderr)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(self.folder / "refused.log", "a") as f:
                f.write(line + "\n")
        except OSError:
            pass


def settings(url: str, mode: str, expire_days: float | None, state_dir: str | Path) -> dict:
    """What configure records in build/pp4.json for a remote tier: the URL without its password (a
    password given in the URL is kept in build/.pp4/remote/secret, readable by its owner only, for
    the build's processes; PP4_REMOTE_PASSWORD, when set, wins), the mode, the expiry. ValueError
    when the URL cannot name a remote."""
    if mode not in MODES:
        raise ValueError(f"--remote-store-mode {mode}: read or readwrite")
    if expire_days is not None and not 0 < expire_days <= 3650:
        raise ValueError(f"--remote-expire-days {expire_days}: more than 0 and at most 3650")
    folder = statedir.part(state_dir, statedir.REMOTE)
    secret = folder / "secret"
    parts = urlsplit(url)
    try:
        password = parts.password
    except ValueError:
        password = None
    if password is not None and password != REDACTED:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(unquote(password))
        os.chmod(secret, 0o600)
    ttl = int(expire_days * 86400) if expire_days else None
    open_remote(url_with_secret(redact(url), state_dir), ttl=ttl)  # refuses a bad URL or a missing client now
    return {"url": redact(url), "mode": mode, "ttl": ttl}


def url_with_secret(url: str, state_dir: str | Path) -> str:
    """A recorded URL with the password the build keeps put back in."""
    parts = urlsplit(url)
    if parts.password != REDACTED:
        return url
    try:
        password = (statedir.part(state_dir, statedir.REMOTE) / "secret").read_text()
    except OSError:
        password = os.environ.get("PP4_REMOTE_PASSWORD", "")
    port = f":{parts.port}" if parts.port else ""
    return parts._replace(netloc=f"{parts.username or ''}:{quote(password, safe='')}@{parts.hostname}{port}").geturl()


def reachable(storage_url: str, state_dir: str | Path, ttl: int | None) -> str | None:
    """None when the remote answers a read now, else why not."""
    try:
        open_remote(url_with_secret(storage_url, state_dir), ttl=ttl).get("ent/" + "0" * 64)
        return None
    except (ValueError, RemoteUnavailable) as e:
        return str(e)


def damage(key: str, data: bytes) -> str | None:
    """What is wrong with a remote value as its key alone can tell (None: nothing): an object must
    expand to bytes that hash to its name; a group must parse, and every record in it pass its
    checksum and name its key, every pack hash to its name and each of its sets to its own, every
    entry's record and pack be there."""
    kind, name = key.split("/", 1)
    if kind == "obj":
        try:
            blob = compressed.decompress(data, compressed.VERIFY_OBJECT_LIMIT)
        except compressed.NotAFrame as e:
            return str(e)
        return None if hashlib.sha256(blob).hexdigest() == name else "its bytes do not hash to its name"
    try:
        group = decode_group(name, data)
    except NotAGroup as e:
        return f"not a group ({e})"
    for akey, text in group.records.items():
        try:
            decode_record(text, expected_key=akey)
        except InvalidRecord as e:
            return f"the record of {akey[:16]}: {e}"
    for pack_name, frame in group.packs.items():
        if hashlib.sha256(frame).hexdigest() != pack_name:
            return f"the set pack {pack_name[:16]}: its bytes do not hash to its name"
        try:
            packs.checked_pairs(frame)
        except packs.NotAPack as e:
            return f"the set pack {pack_name[:16]}: {e}"
    for _, entry in group.entries():
        if entry.action_key not in group.records or entry.pack not in group.packs:
            return f"the entry of {entry.action_key[:16]} names a record or set pack the group lacks"
    return None


def refusals(state_dir: str | Path) -> list[str]:
    """The lines of a build's refused.log (the certificate counts them)."""
    try:
        return (statedir.part(state_dir, statedir.REMOTE) / "refused.log").read_text().splitlines()
    except OSError:
        return []


# What a user does to stop a build trying a remote that will not come back.
STOP_TRYING = "to stop trying it, re-run configure without --remote-store"


def _recently_down(folder: Path) -> bool:
    return backoff.recently_down(folder, RETRY_S)


def _mark_down(folder: Path, reason: str) -> None:
    """Record that the remote failed; the first process to record it says so."""
    if backoff.mark_down(folder, reason, RETRY_S):
        print(f"pp4.reuse: warning: {reason}; going on with the local store alone (the remote store is tried "
              f"again after {RETRY_S:.0f} s; {STOP_TRYING})", file=sys.stderr)


def _union(first, second) -> tuple:
    """Signatures (or disputes) of both, each signer's once (the first's when both have one)."""
    seen, out = set(), []
    for item in (*first, *second):
        key = (item.get("signer"), item.get("object_sha256"))
        if key not in seen:
            seen.add(key)
            out.append(item)
    return tuple(out)
