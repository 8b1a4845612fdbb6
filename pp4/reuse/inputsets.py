"""Observation sets: what one compile observed (pp4/reuse/observed.py), stored once by hash.

An EXL3 unit observes about 5,000 paths: 1,400 headers read, the places its include search looked
and found nothing, the compilers' programs and libraries. Each set is named by the sha256 of its
canonical text, written once into the store (for manifests) and into the build's state folder (for
events and the certificate), and read and checked once per process. An action key hashes the set's
name, which is the hash of its content, which holds every path's state. A set whose bytes do not
hash to its name is never used.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pp4.execution.depfile import depfile_body
from pp4.files import canonical_json
from pp4.reuse.observations import by_folder
from pp4.reuse.pathstates import States, holds, is_file
from pp4.store import hashed
from pp4.store.layout import SETS_FOLDER

def canonical(shared: list[list[str]]) -> bytes:
    return canonical_json(sorted(map(list, shared)))


def set_id(shared: list[list[str]]) -> str:
    return hashlib.sha256(canonical(shared)).hexdigest()


def directory(root: str | Path) -> Path:
    """Where the sets of a store or of a build's state directory live."""
    return Path(root) / SETS_FOLDER


def encode(shared: list[list[str]]) -> tuple[str, bytes]:
    """(name, canonical bytes) of a set: encoded once, written to as many directories as needed."""
    data = canonical(shared)
    return hashlib.sha256(data).hexdigest(), data


def encode_by_folder(pairs: list[list[str]]) -> dict[str, bytes]:
    """A compile's or link's observations as the sets they are stored as, one per folder
    (observed.by_folder), by name."""
    return dict(encode(part) for part in by_folder(pairs))


def write_canonical(directory: str | Path, sid: str, data: bytes) -> None:
    """Store a set's canonical bytes, encoded once (encode_by_folder) for every directory that keeps
    it. The bytes must hash to the name (ValueError otherwise). A restore links the store's file
    instead (SetChecker.copy)."""
    hashed.write(directory, sid, data)


def read(directory: str | Path, sid: str) -> list[list[str]] | None:
    """The set, or None when it is missing or its bytes do not hash to its name."""
    return _read(directory, sid)[1]


def _read(directory: str | Path, sid: str) -> tuple[bytes | None, list[list[str]] | None]:
    """(canonical bytes, set), or (None, None) when it is missing or its bytes do not hash to its name."""
    data = hashed.read(directory, sid)
    if data is None:
        return None, None
    try:
        doc = json.loads(data)
    except ValueError:
        return None, None
    if not (isinstance(doc, list) and all(isinstance(e, list) and len(e) == 2 and isinstance(e[0], str)
                                          and (e[1] is None or isinstance(e[1], str)) for e in doc)):
        return None, None
    return data, doc


class SetChecker:
    """Per-process answers about sets: their content, and whether every observation still holds
    (once per set and per mapping of recorded paths to this machine's)."""

    def __init__(self, states: States):
        self.states = states
        self._sets: dict[str, list[list[str]] | None] = {}
        self._bytes: dict[str, bytes | None] = {}
        self._match: dict[object, dict[str, bool]] = {}  # mapping -> set name -> verdict
        self._files: dict[tuple[str, object], list[str]] = {}
        self._bodies: dict[tuple[str, object], str] = {}

    def load(self, directory: str | Path, sid: str) -> list[list[str]] | None:
        """The set's (path as observed, state) pairs. A missing set is looked for again next time:
        the store may fetch it from its remote tier meanwhile."""
        if self._sets.get(sid) is None:
            data, entries = _read(directory, sid)
            self._bytes[sid] = data
            self._sets[sid] = entries
        return self._sets[sid]

    def copy(self, directory: str | Path, sid: str, to: str | Path) -> None:
        """Write a set this process read from directory into another directory, as the bytes read."""
        self.load(directory, sid)
        data = self._bytes[sid]
        if data is None:
            raise ValueError(f"input set {sid} is missing or damaged in {directory}")
        hashed.link(to, sid, hashed.path_of(directory, sid), data)

    def matches(self, directory: str | Path, sid: str, mapping) -> bool:
        """mapping: a hashable object with real(path) (pp4.execution.root.Root), or None when the
        paths are this machine's."""
        return self.all_match(directory, (sid,), mapping)

    def all_match(self, directory: str | Path, sids, mapping) -> bool:
        """Whether every observation of every named set holds, at the mapping's paths. (A restore
        asks this of 200-300 sets per unit, most of them shared by every unit of a build.)"""
        verdicts = self._match.get(mapping)
        if verdicts is None:
            verdicts = self._match[mapping] = {}
        for sid in sids:
            verdict = verdicts.get(sid)
            if verdict is None:
                entries = self.load(directory, sid)
                if entries is None:
                    return False  # not remembered: the set may be fetched meanwhile
                to_real = mapping.real if mapping is not None else (lambda p: p)
                verdict = verdicts[sid] = holds(entries, to_real, self.states)
            if not verdict:
                return False
        return True

    def loaded(self) -> int:
        """How many distinct sets this process has read."""
        return len(self._sets)

    def files(self, directory: str | Path, sid: str, mapping) -> list[str]:
        """The regular files of a set, where they are on this machine: a dependency file's list."""
        key = (sid, mapping)
        found = self._files.get(key)
        if found is None:
            to_real = mapping.real if mapping is not None else (lambda p: p)
            found = []
            for path, state in self.load(directory, sid) or []:
                real = to_real(path)
                if real is not None and is_file(state):
                    found.append(real)
            found = self._files[key] = sorted(set(found))
        return found


    def depfile_body(self, directory: str | Path, sid: str, mapping) -> str:
        """The set's files, escaped for a dependency file: every restored object of a build that
        shares the set writes the same names (5,500 a unit that includes torch/extension.h)."""
        key = (sid, mapping)
        found = self._bodies.get(key)
        if found is None:
            found = self._bodies[key] = depfile_body(self.files(directory, sid, mapping))
        return found


def collect(directory: str | Path, keep: set[str], older_than_s: float) -> int:
    """Remove the sets nothing names (not in keep) once they are older_than_s: how many went."""
    return hashed.collect(directory, keep, older_than_s)
