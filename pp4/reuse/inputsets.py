"""Observation sets: what one compile observed (pp4/reuse/observations.py), one set per folder.

An EXL3 unit observes about 5,000 paths: 1,400 headers read, the places its include search looked
and found nothing, the compilers' programs and libraries. Each set is named by the sha256 of its
canonical text; a compile's sets are kept together in one pack (pp4/store/packs.py), written into
the store (named by its manifest entry) and into the build's state folder (named by its event),
and each set is read and checked once per process. An action key hashes the sets' names, each the
hash of its content, which holds every path's state. A set whose bytes do not hash to its name is
never used.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pp4.execution.depfile import depfile_body
from pp4.files import canonical_json
from pp4.reuse.observations import by_folder
from pp4.reuse.pathstates import States, holds, is_file
from pp4.store import packs
from pp4.store.layout import SETS_FOLDER
from pp4.store.packs import SetPack

def canonical(shared: list[list[str]]) -> bytes:
    return canonical_json(sorted(map(list, shared)))


def set_id(shared: list[list[str]]) -> str:
    return hashlib.sha256(canonical(shared)).hexdigest()


def directory(root: str | Path) -> Path:
    """Where the set packs of a store or of a build's state directory live."""
    return Path(root) / SETS_FOLDER


def encode(shared: list[list[str]]) -> tuple[str, bytes]:
    """(name, canonical bytes) of a set: encoded once, written to as many directories as needed."""
    data = canonical(shared)
    return hashlib.sha256(data).hexdigest(), data


def encode_by_folder(pairs: list[list[str]]) -> dict[str, bytes]:
    """A compile's or link's observations as the sets they are stored as, one per folder
    (observations.by_folder), by name."""
    return dict(encode(part) for part in by_folder(pairs))


def pack(encoded: dict[str, bytes]) -> SetPack:
    """A compile's sets (encode_by_folder) in the pack every folder that keeps them is given."""
    return packs.pack(encoded)


def write_pack(directory: str | Path, found: SetPack) -> None:
    """Keep a pack in a directory (the build's state folder; the store's through its front)."""
    packs.write(directory, found)


class SetChecker:
    """Per-process answers about sets: their content, and whether every observation still holds
    (once per set and per mapping of recorded paths to this machine's)."""

    def __init__(self, states: States):
        self.states = states
        self._sets: dict[str, list[list[str]] | None] = {}
        self._opened: dict[tuple[str, str], SetPack] = {}  # (directory, pack name) -> the pack, checked
        self._match: dict[object, dict[str, bool]] = {}  # mapping -> set name -> verdict
        self._files: dict[tuple[str, object], list[str]] = {}
        self._bodies: dict[tuple[str, object], str] = {}

    def open(self, directory: str | Path, name: str | None) -> SetPack | None:
        """A pack, its sets this process had not met checked against their names and kept; None
        when it is missing or damaged (looked for again next time: the store may fetch it from its
        remote tier meanwhile)."""
        if name is None or self.problem(directory, name) is not None:
            return None
        return self._opened[(str(directory), name)]

    def problem(self, directory: str | Path, name: str, sids=()) -> str | None:
        """Why a pack cannot be used (missing, not a pack, a set that does not hash to its name, or
        one of sids it lacks), or None, its sets then kept as open() keeps them."""
        key = (str(directory), name)
        if key not in self._opened:
            found = packs.read(directory, name)
            if found is None:
                return "missing, or its bytes do not hash to its name"
            try:
                fresh = packs.checked_pairs(found.frame, known=self._sets.keys())
            except packs.NotAPack as e:
                return str(e)
            self._sets.update(fresh)
            self._opened[key] = found
        for sid in sids:
            if sid not in self._sets:
                return f"its entry names the set {str(sid)[:40]!r}, which it does not hold"
        return None

    def load(self, directory: str | Path, name: str | None, sid: str) -> list[list[str]] | None:
        """A set's (path as observed, state) pairs, from the pack it is in; None when neither this
        process nor the pack has it."""
        if self._sets.get(sid) is None:
            self.open(directory, name)
        return self._sets.get(sid)

    def keep(self, directory: str | Path, name: str, to: str | Path) -> None:
        """Keep a pack this process read from directory in another directory too, as the bytes read."""
        found = self.open(directory, name)
        if found is None:
            raise ValueError(f"set pack {name} is missing or damaged in {directory}")
        packs.link(to, found, directory)

    def matches(self, directory: str | Path, name: str | None, sid: str, mapping) -> bool:
        """mapping: a hashable object with real(path) (pp4.execution.root.Root), or None when the
        paths are this machine's."""
        return self.all_match(directory, name, (sid,), mapping)

    def all_match(self, directory: str | Path, name: str | None, sids, mapping) -> bool:
        """Whether every observation of every named set (in the pack name) holds, at the mapping's
        paths. (A restore asks this of 200-300 sets per unit, most of them shared by every unit of
        a build.)"""
        verdicts = self._match.get(mapping)
        if verdicts is None:
            verdicts = self._match[mapping] = {}
        for sid in sids:
            verdict = verdicts.get(sid)
            if verdict is None:
                entries = self.load(directory, name, sid)
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

    def files(self, directory: str | Path, name: str | None, sid: str, mapping) -> list[str]:
        """The regular files of a set, where they are on this machine: a dependency file's list."""
        key = (sid, mapping)
        found = self._files.get(key)
        if found is None:
            to_real = mapping.real if mapping is not None else (lambda p: p)
            found = []
            for path, state in self.load(directory, name, sid) or []:
                real = to_real(path)
                if real is not None and is_file(state):
                    found.append(real)
            found = self._files[key] = sorted(set(found))
        return found


    def depfile_body(self, directory: str | Path, name: str | None, sid: str, mapping) -> str:
        """The set's files, escaped for a dependency file: every restored object of a build that
        shares the set writes the same names (5,500 a unit that includes torch/extension.h)."""
        key = (sid, mapping)
        found = self._bodies.get(key)
        if found is None:
            found = self._bodies[key] = depfile_body(self.files(directory, name, sid, mapping))
        return found


def collect(directory: str | Path, keep: set[str], older_than_s: float) -> int:
    """Remove the packs nothing names (not in keep) once they are older_than_s: how many went."""
    return packs.collect(directory, keep, older_than_s)
