"""The store's index from a manifest key to the entries of earlier compiles of that command, and
the per-key locks that let the same unit of two variants compile once.

    <store>/manifests/<2 hex>/<manifest key>.json   {"manifest_key", "entries", "sha256"}, as a zstd frame
    <store>/locks/<2 hex>/<manifest key>            flock'd while a compile of that key runs

The store owns these files. An entry (ManifestEntry) is {"action_key": <key of an action record>,
"pack": <the set pack under <store>/setpacks that holds its observation sets>}: the names of its
sets are read from the pack (pp4/store/packs.py), where they are kept once, not listed here again
(an EXL3 unit observes 200-400 folders: each name is 32 bytes of entropy). An entry whose pack is
missing or damaged reads as no entry. gc keeps the entries whose action record is still there, and
the packs they name. Whether an entry may stand in for a compile is pp4.reuse's question (which
also checks, on every lookup, that an entry's action key follows from its inputs). Each manifest
carries the sha256 of its canonical content, so `pp4.store verify` finds a changed byte on its own. A manifest that is
missing or unreadable reads as no entries: a miss, never a wrong object.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import attrs

from pp4.files import canonical_json, write_whole
from pp4.store import compressed, hashed, packs
from pp4.store.layout import SETS_FOLDER


MANIFEST_ENTRIES = 16  # the most recent observation sets kept per command, locally and remotely
# The most a manifest may expand to: 16 entries of 1,400 set names each are about 1.5 MB.
MANIFEST_LIMIT = 64 * 1024 * 1024


@attrs.frozen
class ManifestEntry:
    """One earlier compile of a command: the action record it stored and the input sets it observed.
    Whether it may stand in for a compile is pp4.reuse's question (its predicates)."""
    action_key: str
    input_sets: tuple[str, ...] = attrs.field(converter=tuple)
    pack: str | None = None  # the set pack (pp4/store/packs.py) that holds the sets

    @classmethod
    def parse(cls, doc, sets_of: "Callable[[str], list[str] | None]") -> "ManifestEntry | None":
        """An entry as JSON holds it, its input sets those its pack holds (sets_of(pack name), None
        when the pack is missing or damaged); an entry without a pack lists them. None when it is
        not an entry (read as no entry: a miss)."""
        if not isinstance(doc, dict):
            return None
        key, pack = doc.get("action_key"), doc.get("pack")
        sets = sets_of(pack) if isinstance(pack, str) else doc.get("input_sets") if pack is None else None
        if not (isinstance(key, str) and isinstance(sets, list) and all(isinstance(s, str) for s in sets)):
            return None
        return cls(key, sorted(sets), pack)

    def to_json(self) -> dict:
        if self.pack is not None:
            return {"action_key": self.action_key, "pack": self.pack}
        return {"action_key": self.action_key, "input_sets": list(self.input_sets)}


def parse_entries(docs, sets_of: "Callable[[str], list[str] | None]") -> list[ManifestEntry]:
    return [e for d in docs if (e := ManifestEntry.parse(d, sets_of)) is not None]


def _checksum(mkey: str, entries: list) -> str:
    return hashlib.sha256(canonical_json({"manifest_key": mkey, "entries": entries})).hexdigest()


def encode(doc: dict) -> bytes:
    """A manifest's file: its JSON as a zstd frame (the entries' set names are hex, half of which
    is redundancy)."""
    return compressed.compress(json.dumps(doc).encode(), compressed.SETS_LEVEL)


def decode(data: bytes) -> dict:
    """A manifest file's document; ValueError when it is not one."""
    return json.loads(compressed.decompress(data, MANIFEST_LIMIT))


class Manifests:
    def __init__(self, store_root: str | Path):
        self.folder = Path(store_root) / "manifests"
        self.locks = Path(store_root) / "locks"
        self.packs = Path(store_root) / SETS_FOLDER

    def path(self, mkey: str) -> Path:
        return self.folder / mkey[:2] / f"{mkey}.json"

    def read(self, mkey: str) -> list[ManifestEntry]:
        """The entries, oldest first; the checksum is left to verify, because every lookup checks
        each entry it uses on its own (its action key must follow from its inputs), which a
        checksum adds nothing to and would cost a JSON encoding per lookup."""
        entries, _ = self._load(self.path(mkey), mkey, check_sum=False)
        return parse_entries(entries or [], self._sets_of)

    def _sets_of(self, name: str) -> list[str] | None:
        """The names of the sets a local pack holds, read from its start: the pack itself is checked
        against its name, and each set against its own, where they are used (the reuse rule's
        SetChecker), and names that are not the pack's make its action key not follow (a miss)."""
        try:
            return packs.names(hashed.path_of(self.packs, name).read_bytes())
        except (OSError, packs.NotAPack):
            return None

    def add(self, mkey: str, entry: ManifestEntry, keep: int, still_good: Callable[[ManifestEntry], bool]) -> None:
        """Append an entry, keeping the last `keep` and only the older ones still_good accepts (and
        none with the same action key). Two writers at once may lose one entry, which is only a
        future miss. OSError when the store cannot be written (full, read-only): the caller
        decides how to say so."""
        entries = [e for e in self.read(mkey) if e.action_key != entry.action_key and still_good(e)]
        self._write(mkey, [e.to_json() for e in (entries + [entry])[-keep:]])

    def _write(self, mkey: str, entries: list[dict]) -> None:
        doc = {"manifest_key": mkey, "entries": entries, "sha256": _checksum(mkey, entries)}
        write_whole(self.path(mkey), encode(doc))

    @staticmethod
    def _load(path: Path, mkey: str, check_sum: bool = True) -> tuple[list | None, str | None]:
        """(entries, None), or (None, what is wrong)."""
        try:
            doc = decode(path.read_bytes())
            entries = doc["entries"]
            if doc.get("manifest_key") != mkey or not isinstance(entries, list):
                return None, "its manifest key or entry list is wrong"
            if check_sum and doc.get("sha256") != _checksum(mkey, entries):
                return None, "its content does not match its checksum"
            return entries, None
        except FileNotFoundError:
            return None, "missing"
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # NotAFrame is a ValueError
            return None, f"unreadable ({e})"

    def verify(self, repair: bool) -> list[tuple[str, str, bool]]:
        """Damaged manifests: (path, what is wrong, removed). Removing one only turns the lookups
        of its command into misses until it compiles again."""
        damage = []
        for path in sorted(self.folder.glob("*/*.json")):
            entries, problem = self._load(path, path.stem)
            if problem:
                if repair:
                    path.unlink(missing_ok=True)
                damage.append((str(path), problem, repair))
        return damage

    @contextmanager
    def lock(self, mkey: str, wait: Callable[[], bool]) -> Iterator[bool]:
        """Hold the key's lock for a compile. When another process holds it, wait for it only if
        wait() says so (the other may store what this one needs). Yields True when it waited. A
        store that cannot be written yields False without locking: locks only schedule."""
        path = self.locks / mkey[:2] / mkey
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            f = open(path, "a+")
        except OSError:
            yield False
            return
        with f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                waited = False
            except BlockingIOError:
                if not wait():
                    yield False
                    return
                fcntl.flock(f, fcntl.LOCK_EX)
                waited = True
            try:
                yield waited
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def collect(self, alive: Callable[[str], bool]) -> tuple[int, int, set[str]]:
        """Drop the entries whose action record is gone (alive(action_key) is False), and the
        manifests left empty. Returns (entries removed, manifests removed, the input sets the
        remaining entries' packs). Run under the store's exclusive lock, so no record is published
        meanwhile; a manifest added to at this moment may lose that one entry (a future miss)."""
        entries_removed = manifests_removed = 0
        named: set[str] = set()
        for path in self.folder.glob("*/*.json"):
            entries, problem = self._load(path, path.stem, check_sum=False)
            if problem:
                continue  # damaged: verify's to judge and remove
            keep = [e for e in entries if isinstance(e, dict) and alive(e.get("action_key"))]
            entries_removed += len(entries) - len(keep)
            if not keep:
                path.unlink(missing_ok=True)
                manifests_removed += 1
                continue
            if len(keep) < len(entries):
                self._write(path.stem, keep)
            for e in keep:
                if isinstance(e.get("pack"), str):
                    named.add(e["pack"])
        return entries_removed, manifests_removed, named

    def collect_locks(self) -> int:
        """Remove the lock files no process holds (gc): one per key ever compiled otherwise
        stays for good. A process that opened one just before it goes locks a file no one else
        will find, which at worst lets two twins compile at once; the lookup still decides."""
        removed = 0
        for path in self.locks.glob("*/*"):
            try:
                with open(path, "a+") as f:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    os.unlink(path)
                    removed += 1
            except (BlockingIOError, FileNotFoundError):
                continue
            except OSError:
                continue
        return removed
