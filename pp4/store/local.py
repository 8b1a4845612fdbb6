"""Content-addressed store of compiled objects, looked up by action key.

The store answers one question for the reuse wrapper: "has this exact compile
action (the action key) been run before, and if so, give me its output".

Layout under the root (see docs/store.md for the full argument):

    objects/<2 hex>/<sha256>          object bytes, mode 0o444, never rewritten
    actions/<2 hex>/<action_key>.json one ActionRecord, checksummed JSON, mode 0o444
    tmp/                              staging; every file is born here and renamed out
    lock                              flock: put holds it shared, gc and repair exclusive
    gc.lock                           flock: at most one automatic eviction at a time
    usage, usage.log                  size estimate: total at the last gc + bytes added since
    manifests/, inputsets/, locks/    the reuse rule's index, observation sets and compile locks
                                      (pp4/store/manifests.py, hashed.py); gc keeps them in step

Crash safety rests on two rules: every file becomes visible by one atomic
rename/link from tmp/, and an object is published (and its directory entry
fsynced) before any record that names it.  So a process killed at any instant
leaves at worst a stale tmp file or an unreferenced object, both invisible to
lookups and removed by gc.

This module is POSIX only (fcntl.flock, hard links, atomic rename).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, NoReturn

from pp4 import paths
from pp4.files import canonical_json, fsync_dir, sha256_and_size
from pp4.sizes import parse_size
from pp4.store.layout import unlink_quietly, write_all
from pp4.store.records import (
    ACTION_KEY_RE, ActionRecord, CorruptObject, ObjectMissing, StoreError, InvalidRecord, decode_record, encode_record
)

if TYPE_CHECKING:
    from pp4.store.reports import GcResult, StoreStats, VerifyReport

__all__ = ["Store", "default_max_bytes", "default_store_dir"]


DEFAULT_MAX_BYTES = 20 * 1024**3
HASH_CHUNK_BYTES = 1 << 20

TEST_PAUSE_ENV = "PP4_STORE_TEST_PAUSE"
TEST_PAUSE_MARKER_ENV = "PP4_STORE_TEST_PAUSE_MARKER"
PUT_STEPS = ("object-tmp-written", "object-placed", "record-tmp-written", "record-placed")

_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_NOT_WRITABLE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}
# A hard link can fail for reasons that a plain copy does not share.
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
        raise StoreError(f"PP4_STORE_MAX_BYTES={raw!r} is not a size: {exc}") from None


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
        self._objects_dir = self.root / "objects"
        self._actions_dir = self.root / "actions"
        self._tmp_dir = self.root / "tmp"
        self.lock_path = self.root / "lock"
        self.gc_lock_path = self.root / "gc.lock"
        self._usage_path = self.root / "usage"
        self._usage_log_path = self.root / "usage.log"
        self._ensure_layout()

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r}, max_bytes={self.max_bytes})"

    # ------------------------------------------------------------ paths

    def object_path(self, sha256: str) -> Path:
        return self._objects_dir / sha256[:2] / sha256

    def record_path(self, action_key: str) -> Path:
        _require_action_key(action_key)
        return self._actions_dir / action_key[:2] / f"{action_key}.json"

    # ------------------------------------------------------------ setup and errors

    def _ensure_layout(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"the pp4 store path {self.root} exists but is not a directory; remove it or {ANOTHER_STORE}")
        for directory in (self._objects_dir, self._actions_dir, self._tmp_dir):
            if directory.is_dir():
                continue
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise self.os_error(exc, "creating the store layout") from exc
        # A read-only but complete store still serves lookups, so a lock file we cannot create is not fatal here.
        if not self.lock_path.exists():
            with contextlib.suppress(OSError):
                os.close(os.open(self.lock_path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))

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
        path = self._tmp_dir / f"{os.getpid()}-{os.urandom(8).hex()}{suffix}"
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
            record = decode_record(data, expected_key=action_key)
        except InvalidRecord:
            return None  # never trust it; verify removes it
        if _size_or_none(self.object_path(record.object_sha256)) != record.object_size:
            return None
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
        data = encode_record(record)
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
        stage object in tmp/ -> link into objects/ -> stage record in tmp/ -> rename into actions/.
        """
        from pp4.store import usage  # here, not at the top: a compile edge that restores never needs it

        _require_action_key(action_key)
        payload = _json_roundtrip(payload)  # reject non-JSON payloads before touching the disk
        staged_object, sha256, size = self._stage_object(Path(object_path))
        staged_record: Path | None = None
        try:
            self._pause_for_test("object-tmp-written")
            with self.flock(self.lock_path, fcntl.LOCK_SH):
                added_bytes = self._place_object(staged_object, sha256, size)
                staged_object = None  # _place_object linked-and-unlinked or renamed it
                self._pause_for_test("object-placed")
                record = ActionRecord(action_key, sha256, size, payload, time.time(), tuple(signatures))
                data = encode_record(record)
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

    def _stage_object(self, source: Path) -> tuple[Path, str, int]:
        """Copy source into tmp/ while hashing it; the copy is fsynced and read-only."""
        hasher = hashlib.sha256()
        size = 0
        buffer = bytearray(HASH_CHUNK_BYTES)
        view = memoryview(buffer)
        # Opened first and outside store_writes: a bad source path is the caller's error, not the store's.
        with open(source, "rb", buffering=0) as src:
            fd, staged = self.new_tmp_file(".obj")
            try:
                with self.store_writes("writing an object"):
                    while n := src.readinto(buffer):
                        hasher.update(view[:n])
                        write_all(fd, view[:n])
                        size += n
                    os.fsync(fd)
                    os.fchmod(fd, 0o444)
            except BaseException:
                os.close(fd)
                unlink_quietly(staged)
                raise
            os.close(fd)
        return staged, hasher.hexdigest(), size

    def _stage_bytes(self, data: bytes, suffix: str) -> Path:
        fd, staged = self.new_tmp_file(suffix)
        try:
            with self.store_writes("writing an action record"):
                write_all(fd, data)
                # No fsync: a record torn by power loss fails its checksum and is a miss, so
                # durability here would buy nothing but a few milliseconds per put.
                os.fchmod(fd, 0o444)
        except BaseException:
            os.close(fd)
            unlink_quietly(staged)
            raise
        os.close(fd)
        return staged

    def _place_object(self, staged: Path, sha256: str, size: int) -> int:
        """Publish a staged object under its hash unless an intact copy is there; returns bytes added."""
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

    def materialize(self, record: ActionRecord, dest: str | os.PathLike, *, allow_link: bool = True) -> Path:
        """Put the record's object at dest, verified, replacing dest atomically.

        Hard-links when possible (same filesystem), else copies.  A hard link shares
        the stored inode: never write into dest in place; unlink it before compiling
        to that path again.  dest's mtime is set to now, as a fresh compile would.
        Raises CorruptObject (entry removed) or ObjectMissing; both mean: recompile.
        """
        dest = Path(dest)
        source = self.object_path(record.object_sha256)
        staged = dest.with_name(f".{dest.name}.{os.getpid()}-{os.urandom(6).hex()}.pp4tmp")
        try:
            linked = allow_link and self._link_fresh(source, staged)
            if linked:
                source_inode = os.stat(staged).st_ino
            else:
                source_inode = self._copy_object(source, staged)
            digest, _ = sha256_and_size(staged)
            if digest != record.object_sha256:
                self._reject_corrupt(record, source, dest, staged, digest, source_inode, linked)
            os.replace(staged, dest)
            staged = None
        finally:
            unlink_quietly(staged)
        return dest

    def _link_fresh(self, source: Path, staged: Path) -> bool:
        """Hard-link source to staged and give it a fresh mtime; False when a copy is needed instead."""
        try:
            os.link(source, staged)
        except FileNotFoundError:
            if not staged.parent.is_dir():
                raise
            raise ObjectMissing(f"object {source} disappeared (a concurrent gc or repair removed it); recompile") from None
        except OSError as exc:
            if exc.errno in _NO_HARDLINK_ERRNOS:
                return False
            raise
        try:
            # ninja compares output and input mtimes; the stored inode may be weeks old.
            os.utime(staged)
        except PermissionError:
            # Shared store owned by another user: we may link but not touch. Copy instead.
            os.unlink(staged)
            return False
        return True

    def _copy_object(self, source: Path, staged: Path) -> int:
        try:
            src = open(source, "rb")
        except FileNotFoundError:
            raise ObjectMissing(f"object {source} disappeared (a concurrent gc or repair removed it); recompile") from None
        with src:
            source_inode = os.fstat(src.fileno()).st_ino
            fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            with open(fd, "wb") as out:
                shutil.copyfileobj(src, out, HASH_CHUNK_BYTES)
        return source_inode

    def _reject_corrupt(
        self, record: ActionRecord, source: Path, dest: Path, staged: Path, digest: str, source_inode: int, linked: bool
    ) -> NoReturn:
        unlink_quietly(staged)
        stored_is_bad = linked
        if not linked:
            try:
                stored_is_bad = sha256_and_size(source)[0] != record.object_sha256
            except FileNotFoundError:
                stored_is_bad = True
        if not stored_is_bad:
            raise CorruptObject(
                f"copying {source} to {dest} produced bytes hashing to {digest}, not {record.object_sha256}; "
                f"the stored object itself verified fine and was kept. Check the destination filesystem."
            )
        self._discard_corrupt_entry(record, source, source_inode)
        raise CorruptObject(
            f"stored object {source} for action {record.action_key} is corrupt: expected sha256 "
            f"{record.object_sha256}, its bytes hash to {digest}. Removed it and its record; "
            f"this action is now a miss (recompile). Run `python -m pp4.store verify` to check the rest of the store."
        )

    def _discard_corrupt_entry(self, record: ActionRecord, source: Path, source_inode: int) -> None:
        # Best effort: if the store is read-only the corruption is still reported by the raise.
        with contextlib.suppress(OSError):
            # Only the inode we hashed; a concurrent put may already have healed the path.
            if os.stat(source).st_ino == source_inode:
                os.unlink(source)
        record_path = self.record_path(record.action_key)
        with contextlib.suppress(OSError):
            try:
                current = decode_record(record_path.read_bytes(), expected_key=record.action_key)
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
