"""The remote tier: what a build keeps on a remote storage, and the checks that make it harmless.

Four kinds of value, each under a key that is a digest (pp4/store/remote/__init__.py):

    set/<sha256>   an input set's canonical bytes (pp4/reuse/inputsets.py); its name is their hash
    obj/<sha256>   an object's bytes; its name is their hash
    act/<key>      the action record (checksummed JSON, pp4/store/records.py) of one action key
    man/<key>      the manifest of one manifest key: the most recent entries, as JSON

A compile's results are published in that order, the manifest last, so a reader that finds an entry
finds what it names (or, after an eviction, a miss). Nothing read is trusted: a set must hash to its
name, a record must be for the action key it is filed under and pass its checksum, an object must
hash to the record's sha256 and have its size; the reuse rule then checks every entry as it checks a
local one (its action key must follow from its inputs, which must hash to their local bytes). A
value that fails is refused: one warning line, a line in build/.pp4/remote/refused.log, never used.

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
from pp4.store.manifests import MANIFEST_ENTRIES, ManifestEntry, parse_entries
from pp4.store.records import SHA256_RE, ActionRecord, InvalidRecord, decode_record, encode_record
from pp4.store.remote import REDACTED, RemoteStorage, RemoteUnavailable, open_remote, redact

MODES = ("read", "readwrite")
RETRY_S = backoff.RETRY_S
# How much one batched read asks for: sets are small (a few KB), objects up to tens of MB.
SETS_PER_TRIP = 1000
OBJECT_BYTES_PER_TRIP = 64 << 20


class RemoteTier:
    def __init__(self, storage: RemoteStorage, mode: str, state_dir: str | Path):
        if mode not in MODES:
            raise ValueError(f"remote store mode {mode!r}: read or readwrite")
        self.storage = storage
        self.mode = mode
        self.folder = statedir.part(state_dir, statedir.REMOTE)
        self.refused = 0

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

    def entries(self, mkey: str) -> list[ManifestEntry]:
        data = self._get(f"man/{mkey}")
        if data is None:
            return []
        entries = manifest_entries(data)
        if entries is None:
            self.refuse(f"man/{mkey}", NOT_A_MANIFEST)
            return []
        return parse_entries(entries)

    def entries_of(self, mkeys: list[str]) -> dict[str, list[ManifestEntry]]:
        """The remote manifests of several commands, in one round trip."""
        found = {}
        for mkey, data in zip(mkeys, self._get_many([f"man/{m}" for m in mkeys])):
            if data is None:
                continue
            entries = manifest_entries(data)
            if entries is None:
                self.refuse(f"man/{mkey}", NOT_A_MANIFEST)
                continue
            found[mkey] = parse_entries(entries)
        return found

    def input_sets(self, sids: list[str]) -> dict[str, bytes]:
        """Several input sets, each checked against its name, in a round trip per SETS_PER_TRIP."""
        sids = [sid for sid in dict.fromkeys(sids) if isinstance(sid, str) and SHA256_RE.fullmatch(sid)]
        found = {}
        for start in range(0, len(sids), SETS_PER_TRIP):
            chunk = sids[start:start + SETS_PER_TRIP]
            for sid, data in zip(chunk, self._get_many([f"set/{sid}" for sid in chunk])):
                why = None if data is None else damage(f"set/{sid}", data)
                if why:
                    self.refuse(f"set/{sid}", why)
                elif data is not None:
                    found[sid] = data
        return found

    def records(self, action_keys: list[str]) -> dict[str, ActionRecord]:
        """The action records of several actions, each checked, in one round trip."""
        found = {}
        for key, data in zip(action_keys, self._get_many([f"act/{k}" for k in action_keys])):
            if data is None:
                continue
            try:
                found[key] = decode_record(data, expected_key=key)
            except InvalidRecord as e:
                self.refuse(f"act/{key}", str(e))
        return found

    def objects_of(self, records: list[ActionRecord]) -> dict[str, bytes]:
        """The objects several records name, each checked, in a round trip per OBJECT_BYTES_PER_TRIP."""
        found: dict[str, bytes] = {}
        wanted = list({r.object_sha256: r for r in records}.values())
        start = 0
        while start < len(wanted):
            end, size = start, 0
            while end < len(wanted) and (end == start or size + wanted[end].object_size <= OBJECT_BYTES_PER_TRIP):
                size += wanted[end].object_size
                end += 1
            chunk = wanted[start:end]
            for record, blob in zip(chunk, self._get_many([f"obj/{r.object_sha256}" for r in chunk])):
                if blob is None:
                    continue
                if len(blob) != record.object_size or hashlib.sha256(blob).hexdigest() != record.object_sha256:
                    self.refuse(f"obj/{record.object_sha256}", f"{len(blob)} bytes that do not hash to the sha256 "
                                f"the record of action {record.action_key[:16]} names")
                    continue
                found[record.object_sha256] = blob
            start = end
        return found

    def input_set(self, sid: str) -> bytes | None:
        if not (isinstance(sid, str) and SHA256_RE.fullmatch(sid)):
            self.refuse("man/", f"an entry names an input set {str(sid)[:40]!r}, not a sha256")
            return None
        data = self._get(f"set/{sid}")
        why = None if data is None else damage(f"set/{sid}", data)
        if why:
            self.refuse(f"set/{sid}", why)
            return None
        return data

    def record(self, action_key: str) -> ActionRecord | None:
        """The action record under a key, checked (its checksum, its key), or None."""
        data = self._get(f"act/{action_key}")
        if data is None:
            return None
        try:
            return decode_record(data, expected_key=action_key)
        except InvalidRecord as e:
            self.refuse(f"act/{action_key}", str(e))
            return None

    def object_of(self, record: ActionRecord) -> bytes | None:
        """The object a record names, checked against its sha256 and size, or None."""
        blob = self._get(f"obj/{record.object_sha256}")
        if blob is None:
            return None  # evicted: a miss
        if len(blob) != record.object_size or hashlib.sha256(blob).hexdigest() != record.object_sha256:
            self.refuse(f"obj/{record.object_sha256}", f"{len(blob)} bytes that do not hash to the sha256 "
                        f"the record of action {record.action_key[:16]} names")
            return None
        return blob

    def fetch(self, action_key: str) -> tuple[ActionRecord, bytes] | None:
        """The record and object bytes of one action, both checked, or None."""
        record = self.record(action_key)
        blob = self.object_of(record) if record is not None else None
        return (record, blob) if blob is not None else None

    # -- writing ---------------------------------------------------------------------------

    def publish(self, mkey: str, entry: ManifestEntry, sets: dict[str, bytes], record: ActionRecord,
                object_path: str, keep) -> ActionRecord | None:
        """Put one compile's results, the manifest entry last. keep(entry) says which of the remote
        manifest's present entries to keep beside the new one. Returns the record the remote holds
        for the action now (its signatures and this one's, when its object is this one), or None
        when not all of it got there. A record of another object is left as it is (returned: the
        caller disputes it)."""
        if not self.writes:
            return None
        try:
            there = self.record(record.action_key)
            if there is not None and there.object_sha256 != record.object_sha256:
                return there
            # Written over whatever is there: a value under a digest's name has one right content,
            # so a damaged one is healed; a record keeps every signature either side holds.
            for sid, data in sets.items():
                self.storage.put(f"set/{sid}", data)
            self.storage.put(f"obj/{record.object_sha256}", Path(object_path).read_bytes())
            merged = record
            if there is not None:
                merged = attrs.evolve(record, signatures=_union(there.signatures, record.signatures),
                                      disputes=_union(there.disputes, record.disputes))
            self.storage.put(f"act/{record.action_key}", encode_record(merged))
        except RemoteUnavailable as e:
            self.down(str(e))
            return None
        except OSError as e:  # the object to send vanished: nothing half-published names it
            print(f"pp4.reuse: warning: cannot send {object_path} to the remote store ({e.strerror})", file=sys.stderr)
            return None
        # Read, merge, write: two writers at once may lose one entry (a later miss, never a wrong hit).
        return merged if self.publish_entry(mkey, entry, keep) else None

    def add_dispute(self, action_key: str, dispute: dict) -> None:
        """Add a builder's dispute to the remote record of an action (read, merge, write)."""
        try:
            there = self.record(action_key)
            if there is not None:
                self.storage.put(f"act/{action_key}",
                                 encode_record(attrs.evolve(there, disputes=_union(there.disputes, (dispute,)))))
        except RemoteUnavailable as e:
            self.down(str(e))

    def publish_entry(self, key: str, entry: ManifestEntry, keep) -> bool:
        """Add an entry to the remote manifest under key, the entry's sets, object and record being
        there already: the last step of publish, and how the name-free index of variants
        (pp4/reuse/variants.py) names what a compile published under its own key."""
        if not self.writes:
            return False
        try:
            kept = [e for e in self.entries(key) if e.action_key != entry.action_key and keep(e)]
            doc = {"entries": [e.to_json() for e in (kept + [entry])[-MANIFEST_ENTRIES:]]}
            self.storage.put(f"man/{key}", canonical_json(doc))
            return True
        except RemoteUnavailable as e:
            self.down(str(e))
            return False

    # -- faults ----------------------------------------------------------------------------

    def _get(self, key: str) -> bytes | None:
        try:
            return self.storage.get(key)
        except RemoteUnavailable as e:
            self.down(str(e))
            raise

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
        if any(f" {key}: " in seen for seen in refusals(self.folder.parent)):
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
        open_remote(url_with_secret(storage_url, state_dir), ttl=ttl).get("man/" + "0" * 64)
        return None
    except (ValueError, RemoteUnavailable) as e:
        return str(e)


NOT_A_MANIFEST = "not a manifest (JSON with an entries list)"


def manifest_entries(data: bytes) -> list | None:
    """The entries a remote manifest's bytes hold; None when they are not a manifest."""
    try:
        entries = json.loads(data)["entries"]
    except (ValueError, KeyError, TypeError):
        return None
    return entries if isinstance(entries, list) else None


def damage(key: str, data: bytes) -> str | None:
    """What is wrong with a remote value as its key alone can tell (None: nothing): a set or an
    object must hash to its name, a record pass its checksum and name its key, a manifest parse."""
    kind, name = key.split("/", 1)
    if kind in ("set", "obj"):
        return None if hashlib.sha256(data).hexdigest() == name else "its bytes do not hash to its name"
    if kind == "act":
        try:
            decode_record(data, expected_key=name)
        except InvalidRecord as e:
            return str(e)
        return None
    return None if manifest_entries(data) is not None else NOT_A_MANIFEST


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
