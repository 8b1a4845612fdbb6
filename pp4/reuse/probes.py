"""Negative dependencies: every place the preprocessor may look for a file, and which of them hold one.

A dependency file lists the files a compile read, not the ones it looked for and did not find: a
unit that tests `#if __has_include(<probe.h>)`, or includes a header that a file added to an earlier
folder of the search path would shadow, compiles differently once such a file appears, while every
input it read keeps its bytes. So each stored compile also records a *probe digest*: a hash of which
of the places it could look at hold a file. A lookup recomputes it and misses when it differs.

What is fingerprinted, for each input file F of a compile (its own and those of its input sets):
- the names F could make the preprocessor look for: every `<...>` or `"..."` token on an
  `#include`, `#include_next`, `#import`, `#embed`, `#if`, `#elif` or `#define` line of F (so both
  `__has_include(<x>)` and `#define HAS(x) __has_include(x)` ... `HAS(<x>)` are seen), and F's own
  path relative to every search folder that holds it (which covers an `#include MACRO` whose name
  is computed: the file it found is an input);
- for each such name N: for a quote name, whether F's own folder holds N (a quote include looks
  there first), and for each folder D of the compile's search path (-iquote, -I and the compiler's own -I, -isystem
  and the compiler's own, the compiler's built-in folders, and the folders of those that do not
  exist yet), whether D/N exists now.

That suffices because the preprocessor only opens a path made of a search folder (or the folder of
the including file) and a name written in an input; each such name is in the list, each such folder
is in the search path, and every one of those paths is checked. A file appearing anywhere else
cannot be opened by this compile. What is not seen: a name assembled by token pasting or
stringizing that appears nowhere as a token (`#define H(x) <x##.h>`), and names in inputs that are
read through a path outside the search (a `-include` file is an input and is covered).

The cost is per distinct file and per distinct folder, not per compile: names are read once per
file content (and kept by content hash in the build's state for the next process), each folder is listed once per process (membership is a set lookup, so a name is
never stat'ed, and a folder whose parent's listing lacks it is never opened), each file's part of the digest is worked out once per search path, and each
input set's part once per process.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from pp4.files import write_whole
from pp4.reuse.actionkey import FileHasher

NAMES_FORMAT = 2
NAME_LINE = re.compile(rb'#[ \t]*(?:include|import|embed|if|elif|define)[^\n<"]*[<"][^\n]*')
NAME_TOKEN = re.compile(rb'(<|")([^<>"\s]{1,255})[>"]')


def names_in(data: bytes) -> tuple[str, ...]:
    """The names a file's directives could make the preprocessor look up, sorted, each behind the
    character that opened it: `"` for a quote name (searched in the including file's folder first),
    `<` for an angle name (searched only along the search path)."""
    found: set[bytes] = set()
    for line in NAME_LINE.findall(data):
        found.update(opener + name for opener, name in NAME_TOKEN.findall(line))
    return tuple(sorted(os.fsdecode(n) for n in found))


def _load_names(path: Path | None) -> dict[str, list[str]]:
    try:
        doc = json.loads(path.read_text()) if path else {}
        names = doc["names"] if doc.get("format") == NAMES_FORMAT else {}
        return names if isinstance(names, dict) else {}
    except (OSError, ValueError, KeyError, AttributeError):
        return {}


def _kind(entry: os.DirEntry) -> int:
    try:
        if entry.is_dir():
            return 2
        return 1 if not entry.is_symlink() or os.path.exists(entry.path) else 0
    except OSError:
        return 0


class _Unlistable:
    """A folder that can be searched but not read: the preprocessor can still open a file in it,
    so each name is looked up directly."""

    def __init__(self, folder: str):
        self.folder = folder
        self._seen: dict[str, int] = {}

    def get(self, name: str, default=None):
        kind = self._seen.get(name)
        if kind is None:
            path = os.path.join(self.folder, name)
            kind = self._seen[name] = 2 if os.path.isdir(path) else 1 if os.path.exists(path) else 0
        return kind or default


class Prober:
    """Probe digests for one process; every answer is worked out once and kept.

    The work is split by what it depends on: a file's names and whether its own folder holds them
    depend on the file alone; which search folders hold a name depends on the search path (a
    variant's copy of the tree has its own), so it is kept per search path and name."""

    def __init__(self, hasher: FileHasher, names_file: Path | None = None):
        self.hasher = hasher
        self.names_file = names_file
        self._known = _load_names(names_file)  # names by content sha256 from earlier processes
        self._listings: dict[str, dict[str, int] | _Unlistable | None] = {}
        self._names: dict[str, tuple[str, ...]] = {}  # by content sha256
        self._own: dict[str, tuple[tuple[str, str], ...]] = {}  # path -> (name, "1"/"0": its folder holds it)
        self._present_by_chain: dict[int, dict[str, str]] = {}  # per search path: name -> folders holding it
        self._rows: dict[tuple[int, str], list] = {}
        self._file_parts: dict[int, dict[str, str]] = {}  # per search path: input path -> its part
        self._set_parts: dict[tuple[int, str], str] = {}
        self._chains: dict[tuple[str, ...], int] = {}
        self._chain_index: dict[int, dict[str, int]] = {}
        self._anchor_memo: dict[tuple[int, str], tuple[str, ...]] = {}

    def chain_id(self, chain: tuple[str, ...]) -> int:
        cid = self._chains.get(chain)
        if cid is None:
            cid = self._chains[chain] = len(self._chains)
            self._chain_index[cid] = {d: i for i, d in reversed(list(enumerate(chain)))}
            self._file_parts[cid] = {}
            self._present_by_chain[cid] = {}
        return cid

    def listing(self, folder: str):
        """name -> 1 for a file, 2 for a folder, 0 for a symlink that points nowhere, for a folder's
        entries; None when the folder does not exist. Most folders asked about do not (a name's
        subfolder under each search folder), so the parent's listing answers first, which costs no
        system call once the parent is listed."""
        found = self._listings.get(folder, ...)
        if found is ...:
            parent, base = os.path.split(folder)
            if base not in ("", ".", "..") and parent != folder:
                up = self.listing(parent)
                if up is None or (not isinstance(up, _Unlistable) and up.get(base) != 2):
                    self._listings[folder] = None
                    return None
            try:
                with os.scandir(folder) as it:
                    found = {e.name: _kind(e) for e in it}
            except PermissionError:
                found = _Unlistable(folder)
            except OSError:
                found = None
            self._listings[folder] = found
        return found

    def exists(self, path: str) -> bool:
        folder, base = os.path.split(path)
        names = self.listing(folder)
        return bool(names and names.get(base))

    def names(self, path: str) -> tuple[str, ...]:
        sha = self.hasher.sha256(path)
        if sha is None:
            return ()
        found = self._names.get(sha)
        if found is None:
            found = self._known.get(sha)
            if isinstance(found, list) and all(isinstance(n, str) for n in found):
                found = self._names[sha] = tuple(found)
                return found
            try:
                with open(path, "rb") as f:
                    found = names_in(f.read())
            except OSError:
                found = ()
            self._names[sha] = found
        return found

    def save(self) -> None:
        """Keep the names read from file contents for the next process: a content hash names them,
        so they are reused only for the same bytes. The file keeps what earlier processes found
        unless it grew to four times what this one used."""
        if self.names_file is None or all(k in self._known for k in self._names):
            return
        kept = {**self._known, **{k: list(v) for k, v in self._names.items()}}
        if len(kept) > 4 * max(len(self._names), 1000):
            kept = {k: list(v) for k, v in self._names.items()}
        try:
            write_whole(self.names_file, json.dumps({"format": NAMES_FORMAT, "names": kept}, separators=(",", ":")))
        except OSError:
            pass  # only a cache: the next process reads the files again
        self._known = kept

    def own_names(self, path: str) -> tuple[tuple[str, ...], str]:
        """The names a file could look up (without their opening character), and for each whether
        the file's own folder holds it: "1"/"0" for a quote name (a quote include looks there
        first), "<" for an angle name."""
        found = self._own.get(path)
        if found is None:
            own = os.path.dirname(path)
            exists = self.exists
            names = self.names(path)
            bits = "".join(("1" if exists(os.path.join(own, n[1:])) else "0") if n[0] == '"' else "<" for n in names)
            found = self._own[path] = (tuple(n[1:] for n in names), bits)
        return found

    def _anchors(self, cid: int, folder: str) -> tuple[str, ...]:
        """The search folders that hold a folder, itself included."""
        key = (cid, folder)
        found = self._anchor_memo.get(key)
        if found is None:
            index, out, f = self._chain_index[cid], [], folder
            while f and f != os.sep:
                if f in index:
                    out.append(f)
                f = os.path.dirname(f)
            found = self._anchor_memo[key] = tuple(out)
        return found

    def present(self, chain: tuple[str, ...], cid: int, name: str) -> str:
        """Indexes of the search folders that hold a name, as text ("-" for none)."""
        known = self._present_by_chain[cid]
        found = known.get(name)
        if found is None:
            folder, base = os.path.split(name)
            rows = self._rows.get((cid, folder))
            if rows is None:
                rows = self._rows[(cid, folder)] = [self.listing(os.path.join(d, folder)) for d in chain]
            found = known[name] = ",".join(str(i) for i, names in enumerate(rows) if names and names.get(base)) or "-"
        return found

    def file_part(self, path: str, chain: tuple[str, ...], cid: int) -> str:
        """One input's part of a digest: each name it could look up, with the folders holding it;
        then its own name under each search folder that holds it (an earlier folder could shadow it)."""
        cache = self._file_parts[cid]
        part = cache.get(path)
        if part is None:
            present, known = self.present, self._present_by_chain[cid]
            names, bits = self.own_names(path)
            fields = [bits, *names]
            fields += [known.get(n) or present(chain, cid, n) for n in names]
            norm = os.path.normpath(path)
            for folder in self._anchors(cid, os.path.dirname(norm)):
                rel = norm[len(folder) + 1:]
                fields.append(f"@{rel}:{present(chain, cid, rel)}")
            part = cache[path] = "\x00".join(fields)
        return part

    def digest_of(self, files: list[tuple[str, str]], chain: tuple[str, ...]) -> str:
        """Digest of (path, path as recorded) inputs under a search path."""
        cid = self.chain_id(chain)
        cache, compute = self._file_parts[cid], self.file_part
        pieces = []
        for path, shown in files:
            part = cache.get(path)
            pieces += (shown, compute(path, chain, cid) if part is None else part)
        return hashlib.sha256("\x01".join(pieces).encode("utf-8", "surrogateescape")).hexdigest()

    def set_digest(self, sid: str, files: list[tuple[str, str]], chain: tuple[str, ...]) -> str:
        key = (self.chain_id(chain), sid)
        d = self._set_parts.get(key)
        if d is None:
            d = self._set_parts[key] = self.digest_of(files, chain)
        return d

    def unit_digest(self, own: list[tuple[str, str]], sets: list[tuple[str, list[tuple[str, str]]]],
                    chain: tuple[str, ...]) -> str:
        """The probe digest of one compile: its own inputs (path, path as recorded with $SRC), its
        input sets (name, [(path, path as the set records it)]), under its search path."""
        parts = [self.digest_of(own, chain)] + [self.set_digest(sid, files, chain) for sid, files in sets]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def present_paths(self, files: list[str], chain: tuple[str, ...]) -> list[str]:
        """Every existing path the inputs could make the preprocessor find, for explanations."""
        out = set()
        for path in files:
            own = os.path.dirname(path)
            for n in self.names(path):
                for d in ((own, *chain) if n[0] == '"' else chain):
                    cand = os.path.join(d, n[1:])
                    if self.exists(cand):
                        out.add(os.path.normpath(cand))
        return sorted(out)


def search_path(quote: list[str], plain: list[str], system: list[str], after: list[str],
                implicit: dict, cwd: str) -> tuple[str, ...]:
    """A compile's search folders in the order the preprocessor tries them (after the including
    file's own folder): -iquote, -I, the compiler's own -I, -isystem, its own -isystem, -idirafter,
    then its built-in folders. Relative folders are taken from the compile's working folder."""
    dirs = [*quote, *plain, *implicit.get("I", []), *system, *implicit.get("isystem", []), *after,
            *implicit.get("system", [])]
    return tuple(dict.fromkeys(os.path.normpath(os.path.join(cwd, d)) for d in dirs))
