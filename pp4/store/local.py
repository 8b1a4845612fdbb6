"""Content-addressed store of compiled objects, looked up by action key.

The store answers one question for the reuse wrapper: "has this exact compile
action (the action key) been run before, and if so, give me its output".

Layout under the root (see docs/store.md for the full argument):

    format                            this layout's number (FORMAT); a store of another is refused
    objects/<2 hex>/<sha256>          the object as one zstd frame (its content's sha256 names it),
                                      mode 0o444, never rewritten
    actions/<2 hex>/<action_key>.json one ActionRecord, checksummed JSON, mode 0o444
    tmp/                              staging; every file is born here and renamed out
    lock                              flock: put holds it shared, gc and repair exclusive
    gc.lock                           flock: at most one automatic eviction at a time
    usage, usage.log                  size estimate: total at the last gc + bytes added since
    manifests/, setpacks/, locks/     the reuse rule's index, observation sets and compile locks
                                      (pp4/store/manifests.py, packs.py); gc keeps them in step

Crash safety rests on two rules: every file becomes visible by one atomic
rename/link from tmp/, and an object is published (and its directory entry
fsynced) before any record that names it.  So a process killed at any instant
leaves at worst a stale tmp file or an unreferenced object, both invisible to
lookups and removed by gc.

Objects are kept compressed (pp4/store/compressed.py: about 4x on compiled objects, at ccache's
bytes) and checked against their sha256 each time they are expanded, so a damaged frame is a miss.

This module is POSIX only (fcntl.flock, hard links, atomic rename).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from pp4 import paths
from pp4.files import canonical_json, fsync_dir, write_whole
from pp4.sizes import parse_size
from pp4.store import compressed
from pp4.store.layout import unlink_quietly, write_all
from pp4.store.records import (
    ACTION_KEY_RE, ActionRecord, CorruptObject, ObjectMissing, StoreError, InvalidRecord, decode_record_file, encode_record_file
)

if TYPE_CHECKING:
    from pp4.store.reports import GcResult, StoreStats, VerifyReport

__all__ = ["Store", "default_max_bytes", "default_store_dir"]


DEFAULT_MAX_BYTES = 20 * 1024**3
# The layout this module writes: 3 keeps objects as zstd frames and observation sets in packs of
# columns (pp4/store/packs.py). Layout 2's packs held each set's JSON, and layout 1 (no format file)
# kept neither in a form this code reads.
FORMAT = 3
FORMAT_FILE = "format"

TEST_PAUSE_ENV = "PP4_STORE_TEST_PAUSE"
TEST_PAUSE_MARKER_ENV = "PP4_STORE_TEST_PAUSE_MARKER"
PUT_STEPS = ("object-tmp-written", "object-placed", "record-tmp-written", "record-placed")

_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_NOT_WRITABLE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}
# A hard link can fail for reasons that a plain rename does not share.
_NO_HARDLINK_ERRNOS = {
    errno.EXDEV,
    errno.EPERM,
    errno.EACCES,
    errno.EMLINK,
    errno.ENOTSUP,
    errno.EOPNOTSUPP,
    errno.ENOSYS,
}


# ---------------------------------------------------------------- configuration

# How a user points pp4 at another store. --store wins over $PP4_STORE_DIR, so advice to set the
# variable alone would change nothing for a build configured with --store.
ANOTHER_STORE = "use another store: re-run configure with --store DIR (or, without --store, set PP4_STORE_DIR)"


def default_store_dir() -> Path:
    """$PP4_STORE_DIR, else <cache dir>/store (pp4.paths.cache_dir)."""
    explicit = os.environ.get("PP4_STORE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    return paths.cache_dir() / "store"


def default_max_bytes() -> int:
    """$PP4_STORE_MAX_BYTES (suffixes allowed), else 20 GiB."""
    raw = os.environ.get("PP4_STORE_MAX_BYTES")
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        return parse_size(raw)
    except ValueError as exc:
        raise StoreError(f"PP4_STORE_MAX_BYTES: {exc}") from None


# ---------------------------------------------------------------- small file helpers


def _size_or_none(path: Path) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def _json_roundtrip(payload: dict) -> dict:
    # What put returns must equal what lookup later reads (tuples become lists, etc.).
    if not isinstance(payload, dict):
        raise TypeError(f"payload must be a dict, not {type(payload).__name__}")
    return json.loads(canonical_json(payload))


def _require_action_key(action_key: str) -> None:
    # The key becomes a file name: anything but lowercase hex could escape the store.
    if not (isinstance(action_key, str) and ACTION_KEY_RE.fullmatch(action_key)):
        raise ValueError(f"action key must be 16-128 lowercase hex characters, got {action_key!r}")


# ---------------------------------------------------------------- the store


class Store:
    """A content-addressed object store, safe for many processes at once.

    Lookups take no lock.  put takes a shared flock while publishing; gc and
    verify's repair step take it exclusively, so they never remove an object a
    put is about to reference.
    """

    def __init__(self, root: str | os.PathLike | None = None, max_bytes: int | None = None):
        self.root = Path(root if root is not None else default_store_dir()).expanduser().absolute()
        self.max_bytes = default_max_bytes() if max_bytes is None else int(max_bytes)
        if self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {self.max_bytes}")
        # The store's folders and files, for its usage and verify modules too.
        self.objects_dir = self.root / "objects"
        self.actions_dir = self.root / "actions"
        self.tmp_dir = self.root / "tmp"
        self.lock_path = self.root / "lock"
        self.gc_lock_path = self.root / "gc.lock"
        self.usage_path = self.root / "usage"
        self.usage_log_path = self.root / "usage.log"
        self._ensure_layout()

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r}, max_bytes={self.max_bytes})"

    # ------------------------------------------------------------ paths

    def object_path(self, sha256: str) -> Path:
        return self.objects_dir / sha256[:2] / sha256

    def record_path(self, action_key: str) -> Path:
        _require_action_key(action_key)
        return self.actions_dir / action_key[:2] / f"{action_key}.json"

    # ------------------------------------------------------------ setup and errors

    def _ensure_layout(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"the pp4 store path {self.root} exists but is not a directory; remove it or {ANOTHER_STORE}")
        self._check_format()
        for directory in (self.objects_dir, self.actions_dir, self.tmp_dir):
            if directory.is_dir():
                continue
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise self.os_error(exc, "creating the store layout") from exc
        format_file = self.root / FORMAT_FILE
        if not format_file.exists():
            with contextlib.suppress(OSError):  # a read-only store: checked again by every open
                write_whole(format_file, f"{FORMAT}\n")
        # A read-only but complete store still serves lookups, so a lock file we cannot create is not fatal here.
        if not self.lock_path.exists():
            with contextlib.suppress(OSError):
                os.close(os.open(self.lock_path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))

    def _check_format(self) -> None:
        """StoreError for a store written in another layout: its objects would read as damage."""
        try:
            text = (self.root / FORMAT_FILE).read_text().strip()
        except FileNotFoundError:
            if not self.objects_dir.is_dir() or not any(self.objects_dir.iterdir()):
                return  # new or empty: this layout's from now on
            text = "1"
        except OSError as exc:
            raise self.os_error(exc, "reading the store's format") from exc
        if text != str(FORMAT):
            raise StoreError(
                f"the pp4 store at {self.root} has layout {text}, and this pp4 reads layout {FORMAT} "
                f"(compressed objects, packed observation sets). Its entries cannot be read: remove it "
                f"(`rm -r {self.root}`; it is a cache, and the next build fills it again) or {ANOTHER_STORE}.")

    def os_error(self, exc: OSError, doing: str) -> StoreError:
        where = exc.filename or self.root
        if exc.errno in _DISK_FULL_ERRNOS:
            return StoreError(
                f"disk full while {doing} in the pp4 store at {self.root} ({exc.strerror}: {where}). "
                f"Free space on that filesystem, shrink the store with `python -m pp4.store gc --max-bytes 5G`, "
                f"or {ANOTHER_STORE} on a filesystem with room."
            )
        if exc.errno in _NOT_WRITABLE_ERRNOS:
            return StoreError(
                f"the pp4 store directory {self.root} is not writable ({exc.strerror}: {where}) while {doing}. "
                f"Fix its permissions, or {ANOTHER_STORE} that you can write."
            )
        return StoreError(f"{doing} in the pp4 store at {self.root} failed: {exc}")

    @contextlib.contextmanager
    def store_writes(self, doing: str) -> Iterator[None]:
        """Turn OSErrors from writing into the store into StoreErrors that say what to do."""
        try:
            yield
        except OSError as exc:
            raise self.os_error(exc, doing) from exc

    @contextlib.contextmanager
    def flock(self, path: Path, mode: int) -> Iterator[None]:
        # A fresh descriptor per use: flock locks belong to the open file description, which
        # a forked child would otherwise share (and could unlock for its parent).
        with self.store_writes("opening the store lock"):
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)  # releases the lock; the kernel does the same if we are killed

    @contextlib.contextmanager
    def try_flock(self, path: Path) -> Iterator[bool]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            yield False
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def new_tmp_file(self, suffix: str) -> tuple[int, Path]:
        # pid + random: unique across processes, and O_EXCL makes sure.
        path = self.tmp_dir / f"{os.getpid()}-{os.urandom(8).hex()}{suffix}"
        with self.store_writes("creating a staging file"):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        return fd, path

    def _pause_for_test(self, step: str) -> None:
        """Test hook: PP4_STORE_TEST_PAUSE=<step> makes put stop here so a test can SIGKILL it."""
        if os.environ.get(TEST_PAUSE_ENV) != step:
            return
        marker = os.environ.get(TEST_PAUSE_MARKER_ENV) or str(self.root / f"test-paused-at-{step}")
        # Written whole, then renamed: a test polling for the marker must never read it half-written.
        Path(marker + ".tmp").write_text(str(os.getpid()))
        os.replace(marker + ".tmp", marker)
        time.sleep(300)

    # ------------------------------------------------------------ lookup

    def lookup(self, action_key: str) -> ActionRecord | None:
        """The record for action_key if it is intact and its object is present; otherwise None (a miss)."""
        path = self.record_path(action_key)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StoreError(f"cannot read action record {path}: {exc}. Check permissions, or {ANOTHER_STORE}.") from exc
        try:
            record = decode_record_file(data, expected_key=action_key)
        except InvalidRecord:
            return None  # never trust it; verify removes it
        if not _size_or_none(self.object_path(record.object_sha256)):
            return None  # a frame's bytes are checked when it is expanded
        # The record's mtime is its last use, which is what gc's LRU order reads. One syscall.
        with contextlib.suppress(OSError):
            os.utime(path)
        return record

    # ------------------------------------------------------------ put

    def amend(self, record: ActionRecord) -> ActionRecord:
        """Replace a record with one for the same action and object that carries other signatures or
        disputes (the object is not touched); returns it. Written whole and renamed into place, so a
        reader sees the old record or the new, each complete."""
        _require_action_key(record.action_key)
        data = encode_record_file(record)
        staged = self._stage_bytes(data, ".json")
        try:
            with self.flock(self.lock_path, fcntl.LOCK_SH), self.store_writes("publishing an action record"):
                destination = self.record_path(record.action_key)
                destination.parent.mkdir(exist_ok=True)
                os.replace(staged, destination)
            staged = None
        finally:
            unlink_quietly(staged)
        return record

    def put(self, action_key: str, object_path: str | os.PathLike, payload: dict, signatures=()) -> ActionRecord:
        """Store the file at object_path as the output of action_key; returns the published record.

        Steps, each made visible by one atomic operation (see docs/store.md):
        stage the object's frame in tmp/ -> link into objects/ -> stage record in tmp/ -> rename
        into actions/.
        """
        _require_action_key(action_key)
        _json_roundtrip(payload)  # reject non-JSON payloads before the work of compressing
        # Read outside store_writes: a bad source path is the caller's error, not the store's.
        data = Path(object_path).read_bytes()
        return self.put_frame(action_key, compressed.compress(data), hashlib.sha256(data).hexdigest(), len(data),
                              payload, signatures)

    def put_frame(self, action_key: str, frame: bytes, sha256: str, size: int, payload: dict,
                  signatures=()) -> ActionRecord:
        """Store an object given as its zstd frame (what the remote tier sends), whose content the
        caller has checked against sha256 and size."""
        from pp4.store import usage  # here, not at the top: a compile edge that restores never needs it

        _require_action_key(action_key)
        payload = _json_roundtrip(payload)
        staged_object = self._stage_bytes(frame, ".obj", durable=True)
        staged_record: Path | None = None
        try:
            self._pause_for_test("object-tmp-written")
            with self.flock(self.lock_path, fcntl.LOCK_SH):
                added_bytes = self._place_object(staged_object, sha256, len(frame))
                staged_object = None  # _place_object linked-and-unlinked or renamed it
                self._pause_for_test("object-placed")
                record = ActionRecord(action_key, sha256, size, payload, time.time(), tuple(signatures))
                data = encode_record_file(record)
                staged_record = self._stage_bytes(data, ".json")
                self._pause_for_test("record-tmp-written")
                destination = self.record_path(action_key)
                with self.store_writes("publishing an action record"):
                    destination.parent.mkdir(exist_ok=True)
                    # Last writer wins; both candidates are complete, valid records.
                    os.replace(staged_record, destination)
                staged_record = None
                self._pause_for_test("record-placed")
                usage.note_usage(self, added_bytes + len(data))
        finally:
            unlink_quietly(staged_object)
            unlink_quietly(staged_record)
        usage.evict_if_over_bound(self)
        return record

    def _stage_bytes(self, data: bytes, suffix: str, durable: bool = False) -> Path:
        """durable: fsynced (an object, which records name). A record is not: one torn by power
        loss fails its checksum and is a miss, so durability would buy nothing but a few
        milliseconds per put."""
        fd, staged = self.new_tmp_file(suffix)
        try:
            with self.store_writes("writing an object" if durable else "writing an action record"):
                write_all(fd, data)
                if durable:
                    os.fsync(fd)
                os.fchmod(fd, 0o444)
        except BaseException:
            os.close(fd)
            unlink_quietly(staged)
            raise
        os.close(fd)
        return staged

    def _place_object(self, staged: Path, sha256: str, size: int) -> int:
        """Publish a staged object (a frame of size bytes) under its hash unless a copy of that size
        is there; returns bytes added."""
        destination = self.object_path(sha256)
        with self.store_writes("publishing an object"):
            destination.parent.mkdir(exist_ok=True)
            try:
                # link, not rename: it refuses to replace, so an existing object's inode (maybe
                # hard-linked into build trees) is left alone.
                os.link(staged, destination)
                os.unlink(staged)
            except FileExistsError:
                if _size_or_none(destination) == size:
                    os.unlink(staged)
                    return 0
                os.replace(staged, destination)  # existing copy is truncated/damaged: heal it
            except OSError as exc:
                if exc.errno not in _NO_HARDLINK_ERRNOS:
                    raise
                if _size_or_none(destination) == size:
                    os.unlink(staged)
                    return 0
                os.replace(staged, destination)
            # The object's directory entry must be durable before any record names it.
            fsync_dir(destination.parent)
        return size

    # ------------------------------------------------------------ materialize

    def materialize(self, record: ActionRecord, dest: str | os.PathLike) -> Path:
        """Put the record's object at dest, expanded and checked against its sha256, replacing dest
        atomically (a new inode: a later compile writing to dest in place never reaches the store).
        Raises CorruptObject (entry removed) or ObjectMissing; both mean: recompile."""
        dest = Path(dest)
        data = self.object_bytes(record)
        staged = dest.with_name(f".{dest.name}.{os.getpid()}-{os.urandom(6).hex()}.pp4tmp")
        try:
            fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            try:
                write_all(fd, data)
            finally:
                os.close(fd)
            os.replace(staged, dest)
            staged = None
        finally:
            unlink_quietly(staged)
        return dest

    def object_bytes(self, record: ActionRecord) -> bytes:
        """The record's object, expanded and checked against its sha256 and size. CorruptObject
        (the entry is removed) or ObjectMissing otherwise."""
        source = self.object_path(record.object_sha256)
        try:
            with open(source, "rb") as f:
                source_inode = os.fstat(f.fileno()).st_ino
                frame = f.read()
        except FileNotFoundError:
            raise ObjectMissing(f"object {source} disappeared (a concurrent gc or repair removed it); recompile") from None
        try:
            data = compressed.decompress(frame, record.object_size)
            digest = hashlib.sha256(data).hexdigest()
            wrong = None if digest == record.object_sha256 else f"its bytes hash to {digest}"
        except compressed.NotAFrame as e:
            data, wrong = b"", str(e)
        if wrong is None:
            return data
        self._discard_corrupt_entry(record, source, source_inode)
        raise CorruptObject(
            f"stored object {source} for action {record.action_key} is corrupt: expected sha256 "
            f"{record.object_sha256}, {wrong}. Removed it and its record; this action is now a miss "
            f"(recompile). Run `python -m pp4.store verify` to check the rest of the store."
        )

    def object_frame(self, sha256: str) -> bytes | None:
        """An object's frame as kept (unchecked: the remote tier's reader checks what it expands)."""
        try:
            return self.object_path(sha256).read_bytes()
        except FileNotFoundError:
            return None

    def _discard_corrupt_entry(self, record: ActionRecord, source: Path, source_inode: int) -> None:
        # Best effort: if the store is read-only the corruption is still reported by the raise.
        with contextlib.suppress(OSError):
            # Only the inode we hashed; a concurrent put may already have healed the path.
            if os.stat(source).st_ino == source_inode:
                os.unlink(source)
        record_path = self.record_path(record.action_key)
        with contextlib.suppress(OSError):
            try:
                current = decode_record_file(record_path.read_bytes(), expected_key=record.action_key)
            except InvalidRecord:
                current = None
            if current is None or current.object_sha256 == record.object_sha256:
                os.unlink(record_path)

    # ------------------------------------------------------------ size, eviction, verification

    def gc(self, max_bytes: int | None = None) -> GcResult:
        """Evict least-recently-used entries until the store is at most max_bytes (default: its
        bound); also remove invalid records, records whose object is gone, unreferenced objects
        and staging files older than an hour."""
        from pp4.store import usage

        return usage.gc(self, max_bytes)

    def stats(self) -> StoreStats:
        """Counts and sizes from a directory scan; no lock, no hashing."""
        from pp4.store import usage

        return usage.stats(self)

    def verify(self, repair: bool = True) -> VerifyReport:
        """Rehash every object and check every record; with repair, remove what is broken."""
        from pp4.store import verify as verification

        return verification.verify(self, repair)
