"""A compile command taken apart (its source, object and dependency file), and the hasher that reads
each file once per process.

What makes two compiles the same is decided in pp4/reuse/wrapper.py (the keys) and
pp4/reuse/observations.py (what a compile observed) and pp4/reuse/pathstates.py (whether it holds now); this module only reads commands and files.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from pathlib import Path

import attrs

from pp4.files import READ_CHUNK, sha256_fd, write_whole
from pp4.reuse import timemacros

# The hasher's cache file. Format 2: `time_macros` (a file's sha256 -> the time macros its bytes
# name, pp4/reuse/timemacros.py; files that name none are left out) beside `sha256`; a cache of
# format 1 was kept without them, so it is read as empty.
HASHES_FORMAT = 2


class CommandError(Exception):
    """A compile command pp4 cannot take apart (no -o, no -c source, no -MF)."""


@attrs.frozen
class CompileArgs:
    argv: tuple[str, ...]
    compiler: str
    language: str  # "cuda" (nvcc) or "cxx"
    source: str
    output: str
    depfile: str


def parse_compile(argv: list[str]) -> CompileArgs:
    output = depfile = source = None
    i = 1
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if a == "-o":
            output, i = nxt, i + 2
            continue
        if a == "-MF":
            depfile, i = nxt, i + 2
            continue
        if a == "-c" and nxt is not None and not nxt.startswith("-"):
            source, i = nxt, i + 2
            continue
        i += 1
    if source is None:  # nvcc and gcc also take `-c` alone with the source elsewhere
        cands = [a for a in argv[1:] if a.endswith((".cu", ".cpp", ".cc", ".cxx", ".c")) and not a.startswith("-")]
        source = cands[0] if len(cands) == 1 else None
    missing = [n for n, v in (("-o OUTPUT", output), ("-MF DEPFILE", depfile), ("a source after -c", source)) if v is None]
    if missing:
        raise CommandError(f"the compile command has no {', '.join(missing)}: {' '.join(argv)}")
    nvcc = os.path.basename(argv[0]) == "nvcc"
    return CompileArgs(tuple(argv), argv[0], "cuda" if nvcc or source.endswith(".cu") else "cxx", source, output,
                       depfile)


class FileHasher:
    """sha256 of files, each read once per process; a missing file hashes to None.

    Once per path, and once per file: two paths to one file (a hard link, a folder reached through
    a symbolic link, as /usr/local/cuda/include is) are hashed once, keyed by device, inode, size,
    mtime and ctime as fstat gives them for the file just opened, so a file replaced or written
    since is hashed again. With a cache file, what earlier processes hashed is kept the same way
    (every compile observes nvcc, cicc, cc1plus and 1,400 headers: 250 MB a compile to read again
    otherwise); a file whose ctime is within STAMP_SLACK_S of when it was hashed is not kept, since
    a write in the same clock tick could leave its stamp as it was.

    Each file read is also scanned for the time macros it names (pp4/reuse/timemacros.py), and what
    it names is kept with its sha256, here and in the cache file."""

    STAMP_SLACK_S = 2.0

    def __init__(self, cache: Path | None = None):
        self._hashes: dict[str, str | None] = {}
        self._by_file: dict[tuple, str] = {}
        self.cache = cache
        self._known: dict[str, str] = {}
        self._new: dict[str, str] = {}
        self._macros: dict[str, str] = {}  # sha256 -> the time macros its bytes name, where any
        self._scanned: set[str] | None = None  # every sha256 scanned, by this process or an earlier one
        if cache is not None:
            try:
                doc = json.loads(cache.read_text())
                if (isinstance(doc, dict) and doc.get("format") == HASHES_FORMAT and isinstance(doc.get("sha256"), dict)
                        and isinstance(doc.get("time_macros"), dict)):
                    self._known = doc["sha256"]
                    self._macros = {k: v for k, v in doc["time_macros"].items() if isinstance(v, str)}
            except (OSError, ValueError):
                pass

    def sha256(self, path: str, st: os.stat_result | None = None) -> str | None:
        """st: what os.stat(path) just gave, when the caller has it: a regular file already known
        by that identity is answered without opening it (a warm restore asks of 5,000 files)."""
        h = self._hashes.get(path, ...)
        if h is ... and st is not None and stat.S_ISREG(st.st_mode):
            ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            h = self._by_file.get(ident) or self._known.get("%d:%d:%d:%d:%d" % ident) or ...
            if h is not ...:
                self._by_file[ident] = self._hashes[path] = h
        if h is ...:
            try:
                # Non-blocking, and regular files only: an input named by a stored or remote entry
                # could be a FIFO or /dev/zero, which would hang the build; no compile reads one.
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
                try:
                    st = os.fstat(fd)
                    ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                    h = self._by_file.get(ident)
                    if not stat.S_ISREG(st.st_mode):
                        h = None
                    elif h is None:
                        key = "%d:%d:%d:%d:%d" % ident
                        h = self._known.get(key)
                        if h is None:
                            h, macros = _hash_and_scan(fd, st.st_size)
                            if macros:
                                self._macros[h] = macros
                            if self._scanned is not None:
                                self._scanned.add(h)
                            if st.st_ctime < time.time() - self.STAMP_SLACK_S:
                                self._new[key] = h
                        self._by_file[ident] = h
                finally:
                    os.close(fd)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError):
                h = None
            self._hashes[path] = h
        return h

    def time_macros(self, sha: str) -> str | None:
        """The time macros the bytes of a file this hasher hashed name, comma-separated ("" none);
        None for a sha256 it never met."""
        if self._scanned is None:  # only after a compile: a restore never asks
            self._scanned = set(self._known.values()) | set(self._by_file.values())
        return self._macros.get(sha, "") if sha in self._scanned else None

    def save(self) -> None:
        """Keep what this process hashed for the next one (only a cache: a failure loses nothing).
        The file keeps what earlier processes found unless it grew to four times what this one used."""
        if self.cache is None or not self._new:
            return
        kept = {**self._known, **self._new}
        if len(kept) > 4 * max(len(self._by_file), 20000):
            kept = {k: v for k, v in kept.items() if k in self._new or k in {"%d:%d:%d:%d:%d" % i for i in self._by_file}}
        try:
            shas = set(kept.values())
            macros = {sha: m for sha, m in self._macros.items() if sha in shas}
            write_whole(self.cache, json.dumps({"format": HASHES_FORMAT, "sha256": kept, "time_macros": macros},
                                               separators=(",", ":")))
        except OSError:
            pass
        self._known, self._new = kept, {}

    def files_hashed(self) -> int:
        """How many distinct files this process has read and hashed."""
        return len(self._by_file)


def _hash_and_scan(fd: int, size: int) -> tuple[str, str]:
    """An open file's sha256, and the time macros its bytes name. A file as big as READ_CHUNK is
    read whole to be scanned, a program or library (ELF) excepted, which is hashed as it is read."""
    if size >= READ_CHUNK and os.pread(fd, 4, 0) == timemacros.ELF:
        return sha256_fd(fd, size), ""
    chunks = [os.read(fd, size)] if size else []
    while chunk := os.read(fd, 1 << 16):  # to the end, which a file grown since its stat moved
        chunks.append(chunk)
    data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return hashlib.sha256(data).hexdigest(), timemacros.scan(data)
