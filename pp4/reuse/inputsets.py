"""Input sets: the inputs of a compile that lie outside its extension's tree, stored once by hash.

An EXL3 unit names about 1,400 inputs, nearly all of them the same torch, CUDA, Python and system
headers as its neighbours'. Written out in full into every manifest entry, store record, event and
certificate object, those lists made a restore, a variant's reuse checks and an audit parse, hash
and compare some 270,000 entries per variant. Kept as a set, named by the sha256 of its canonical
text, each distinct list is written once, and read, checked against the files and probed
(pp4.probes) once per process. An action key still covers every byte of every input: it
hashes the set's name, which is the hash of the set's content, which holds every input's sha256.

Sets live in a directory of their own in the store (for manifests) and in the build's state
directory (for events and the certificate). A set whose bytes do not hash to its name is never used.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pp4.files import canonical_json
from pp4.reuse.actionkey import FileHasher, depfile_body
from pp4.reuse.relocate import NONE, Relocation
from pp4.store import hashed

SRC = "$SRC"  # inputs under the extension's own source root; they stay inline


def split(inputs: list[list[str]]) -> tuple[list[list[str]], list[list[str]]]:
    """(own, shared): inputs under the extension's root ($SRC paths) keep their order; the rest
    form the shared set."""
    own = [list(i) for i in inputs if i[0].startswith(SRC)]
    shared = [list(i) for i in inputs if not i[0].startswith(SRC)]
    return own, shared


def canonical(shared: list[list[str]]) -> bytes:
    return canonical_json(sorted(map(list, shared)))


def set_id(shared: list[list[str]]) -> str:
    return hashlib.sha256(canonical(shared)).hexdigest()


def directory(root: str | Path) -> Path:
    """Where the sets of a store or of a build's state directory live."""
    return Path(root) / "inputsets"


def path_of(directory: str | Path, sid: str) -> Path:
    return hashed.path_of(directory, sid)


def encode(shared: list[list[str]]) -> tuple[str, bytes]:
    """(name, canonical bytes) of a set: encoded once, written to as many directories as needed."""
    data = canonical(shared)
    return hashlib.sha256(data).hexdigest(), data


def write(directory: str | Path, shared: list[list[str]]) -> str:
    """Store a set (once: an existing file with this name has these bytes) and return its name."""
    sid, data = encode(shared)
    write_canonical(directory, sid, data)
    return sid


def write_canonical(directory: str | Path, sid: str, data: bytes) -> None:
    """Store a set's canonical bytes, as read from another directory: a restore copies the store's
    sets into the build's state directory without encoding 1,400 entries again. The bytes must hash
    to the name (ValueError otherwise)."""
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
    """Per-process answers about sets: their content and whether every file still has its recorded
    bytes. Each is worked out once per set. A set names files portably ($TORCH/..., pp4/reuse/relocate.py);
    what this class answers names them where they are on this machine, except pairs(), which gives both."""

    def __init__(self, hasher: FileHasher, relocation: Relocation = NONE):
        self.hasher = hasher
        self.relocation = relocation
        self._portable: dict[str, list[str]] = {}
        self._sets: dict[str, list[list[str]] | None] = {}
        self._bytes: dict[str, bytes | None] = {}
        self._match: dict[str, bool] = {}
        self._depfile_bodies: dict[str, str] = {}
        self._paths: dict[str, list[str]] = {}

    def load(self, directory: str | Path, sid: str) -> list[list[str]] | None:
        """The set's entries, their paths as on this machine."""
        if sid not in self._sets:
            data, entries = _read(directory, sid)
            self._bytes[sid] = data
            self._portable[sid] = [p for p, _ in entries or []]
            local = self.relocation.local
            self._sets[sid] = None if entries is None else [[local(p), sha] for p, sha in entries]
        return self._sets[sid]

    def pairs(self, directory: str | Path, sid: str) -> list[tuple[str, str]]:
        """(path on this machine, path as the set names it) of each file."""
        return list(zip(self.paths(directory, sid), self._portable.get(sid, [])))

    def copy(self, directory: str | Path, sid: str, to: str | Path) -> None:
        """Write a set this process read from directory into another directory, as the bytes read."""
        self.load(directory, sid)
        data = self._bytes[sid]
        if data is None:
            raise ValueError(f"input set {sid} is missing or damaged in {directory}")
        write_canonical(to, sid, data)

    def forget(self, sid: str) -> None:
        """Read a set again next time (it was just written where it was missing)."""
        for memo in (self._sets, self._bytes, self._match, self._depfile_bodies, self._paths, self._portable):
            memo.pop(sid, None)

    def matches(self, directory: str | Path, sid: str) -> bool:
        if sid not in self._match:
            entries = self.load(directory, sid)
            self._match[sid] = entries is not None and self.hasher.all_match(entries)
        return self._match[sid]

    def loaded(self) -> int:
        """How many distinct sets this process has read."""
        return len(self._sets)

    def paths(self, directory: str | Path, sid: str) -> list[str]:
        found = self._paths.get(sid)
        if found is None:
            found = self._paths[sid] = [p for p, _ in self.load(directory, sid) or []]
        return found

    def depfile_body(self, directory: str | Path, sid: str) -> str:
        """The set's paths, escaped for a dependency file: every restored object of a build that
        shares the set writes the same 1,400 names."""
        if sid not in self._depfile_bodies:
            self._depfile_bodies[sid] = depfile_body(self.paths(directory, sid))
        return self._depfile_bodies[sid]


def verify(directory: str | Path, repair: bool) -> list[tuple[str, str, bool]]:
    """Damaged sets in a directory: (path, what is wrong, removed). A removed set only turns the
    entries that name it into misses."""
    return hashed.verify(directory, repair)
