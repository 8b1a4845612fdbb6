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
import logging
import os
import secrets
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Iterator, NoReturn

import attrs

from pp4 import paths
from pp4.files import canonical_json, fsync_dir, sha256_and_size, sha256_fd
from pp4.sizes import parse_size
from pp4.store.records import (
    _ACTION_KEY_RE, _SHA256_RE, ActionRecord, CorruptObject, Damage, GcResult, ObjectMissing, StoreError, StoreStats,
    VerifyReport, _InvalidRecord, decode_record, encode_record
)

__all__ = ["Store", "default_max_bytes", "default_store_dir"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 20 * 1024**3
# A put finishes in well under a second; an hour-old staging file belongs to a dead process.
STALE_TMP_SECONDS = 3600
# Automatic eviction goes below the bound, so that the next few puts do not each trigger a full scan.
AUTO_EVICT_LOW_WATER = 0.9
# Once this many bytes of usage.log pile up, the next put recounts the store (a gc pass),
# which keeps the per-put read of the log small.
USAGE_LOG_FOLD_BYTES = 64 * 1024
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


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _unlink_quietly(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


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
    if not (isinstance(action_key, str) and _ACTION_KEY_RE.fullmatch(action_key)):
        raise ValueError(f"action key must be 16-128 lowercase hex characters, got {action_key!r}")


def _iter_shard_files(top: Path) -> Iterator[os.DirEntry]:
    """Files in top/<shard>/; tolerates directories vanishing under a concurrent gc."""
    try:
        shards = list(os.scandir(top))
    except FileNotFoundError:
        return
    for shard in shards:
        if not shard.is_dir(follow_symlinks=False):
            continue
        try:
            entries = list(os.scandir(shard.path))
        except FileNotFoundError:
            continue
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                yield entry


@attrs.frozen
class _LiveRecord:
    path: str
    mtime: float
    nbytes: int
    object_sha256: str


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
        self._lock_path = self.root / "lock"
        self._gc_lock_path = self.root / "gc.lock"
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
            raise StoreError(f"the pp4 store path {self.root} exists but is not a directory; remove it or set PP4_STORE_DIR to a directory")
        for directory in (self._objects_dir, self._actions_dir, self._tmp_dir):
            if directory.is_dir():
                continue
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise self._os_error(exc, "creating the store layout") from exc
        # A read-only but complete store still serves lookups, so a lock file we cannot create is not fatal here.
        if not self._lock_path.exists():
            with contextlib.suppress(OSError):
                os.close(os.open(self._lock_path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))

    def _os_error(self, exc: OSError, doing: str) -> StoreError:
        where = exc.filename or self.root
        if exc.errno in _DISK_FULL_ERRNOS:
            return StoreError(
                f"disk full while {doing} in the pp4 store at {self.root} ({exc.strerror}: {where}). "
                f"Free space on that filesystem, shrink the store with `python -m pp4.cache gc --max-bytes 5G`, "
                f"or set PP4_STORE_DIR to a directory on a filesystem with room."
            )
        if exc.errno in _NOT_WRITABLE_ERRNOS:
            return StoreError(
                f"the pp4 store directory {self.root} is not writable ({exc.strerror}: {where}) while {doing}. "
                f"Fix its permissions, or set PP4_STORE_DIR to a writable directory."
            )
        return StoreError(f"{doing} in the pp4 store at {self.root} failed: {exc}")

    @contextlib.contextmanager
    def _store_writes(self, doing: str) -> Iterator[None]:
        """Turn OSErrors from writing into the store into StoreErrors that say what to do."""
        try:
            yield
        except OSError as exc:
            raise self._os_error(exc, doing) from exc

    @contextlib.contextmanager
    def _flock(self, path: Path, mode: int) -> Iterator[None]:
        # A fresh descriptor per use: flock locks belong to the open file description, which
        # a forked child would otherwise share (and could unlock for its parent).
        with self._store_writes("opening the store lock"):
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)  # releases the lock; the kernel does the same if we are killed

    @contextlib.contextmanager
    def _try_flock(self, path: Path) -> Iterator[bool]:
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

    def _new_tmp_file(self, suffix: str) -> tuple[int, Path]:
        # pid + random: unique across processes, and O_EXCL makes sure.
        path = self._tmp_dir / f"{os.getpid()}-{secrets.token_hex(8)}{suffix}"
        with self._store_writes("creating a staging file"):
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
            raise StoreError(f"cannot read action record {path}: {exc}. Check permissions, or set PP4_STORE_DIR to another store.") from exc
        try:
            record = decode_record(data, expected_key=action_key)
        except _InvalidRecord:
            return None  # never trust it; verify removes it
        if _size_or_none(self.object_path(record.object_sha256)) != record.object_size:
            return None
        # The record's mtime is its last use, which is what gc's LRU order reads. One syscall.
        with contextlib.suppress(OSError):
            os.utime(path)
        return record

    # ------------------------------------------------------------ put

    def put(self, action_key: str, object_path: str | os.PathLike, payload: dict) -> ActionRecord:
        """Store the file at object_path as the output of action_key; returns the published record.

        Steps, each made visible by one atomic operation (see docs/store.md):
        stage object in tmp/ -> link into objects/ -> stage record in tmp/ -> rename into actions/.
        """
        _require_action_key(action_key)
        payload = _json_roundtrip(payload)  # reject non-JSON payloads before touching the disk
        staged_object, sha256, size = self._stage_object(Path(object_path))
        staged_record: Path | None = None
        try:
            self._pause_for_test("object-tmp-written")
            with self._flock(self._lock_path, fcntl.LOCK_SH):
                added_bytes = self._place_object(staged_object, sha256, size)
                staged_object = None  # _place_object linked-and-unlinked or renamed it
                self._pause_for_test("object-placed")
                record = ActionRecord(action_key, sha256, size, payload, time.time())
                data = encode_record(record)
                staged_record = self._stage_bytes(data, ".json")
                self._pause_for_test("record-tmp-written")
                destination = self.record_path(action_key)
                with self._store_writes("publishing an action record"):
                    destination.parent.mkdir(exist_ok=True)
                    # Last writer wins; both candidates are complete, valid records.
                    os.replace(staged_record, destination)
                staged_record = None
                self._pause_for_test("record-placed")
                self._note_usage(added_bytes + len(data))
        finally:
            _unlink_quietly(staged_object)
            _unlink_quietly(staged_record)
        self._evict_if_over_bound()
        return record

    def _stage_object(self, source: Path) -> tuple[Path, str, int]:
        """Copy source into tmp/ while hashing it; the copy is fsynced and read-only."""
        hasher = hashlib.sha256()
        size = 0
        buffer = bytearray(HASH_CHUNK_BYTES)
        view = memoryview(buffer)
        # Opened first and outside _store_writes: a bad source path is the caller's error, not the store's.
        with open(source, "rb", buffering=0) as src:
            fd, staged = self._new_tmp_file(".obj")
            try:
                with self._store_writes("writing an object"):
                    while n := src.readinto(buffer):
                        hasher.update(view[:n])
                        _write_all(fd, view[:n])
                        size += n
                    os.fsync(fd)
                    os.fchmod(fd, 0o444)
            except BaseException:
                os.close(fd)
                _unlink_quietly(staged)
                raise
            os.close(fd)
        return staged, hasher.hexdigest(), size

    def _stage_bytes(self, data: bytes, suffix: str) -> Path:
        fd, staged = self._new_tmp_file(suffix)
        try:
            with self._store_writes("writing an action record"):
                _write_all(fd, data)
                # No fsync: a record torn by power loss fails its checksum and is a miss, so
                # durability here would buy nothing but a few milliseconds per put.
                os.fchmod(fd, 0o444)
        except BaseException:
            os.close(fd)
            _unlink_quietly(staged)
            raise
        os.close(fd)
        return staged

    def _place_object(self, staged: Path, sha256: str, size: int) -> int:
        """Publish a staged object under its hash unless an intact copy is there; returns bytes added."""
        destination = self.object_path(sha256)
        with self._store_writes("publishing an object"):
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
        staged = dest.with_name(f".{dest.name}.{os.getpid()}-{secrets.token_hex(6)}.pp4tmp")
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
            _unlink_quietly(staged)
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
        _unlink_quietly(staged)
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
            f"this action is now a miss (recompile). Run `python -m pp4.cache verify` to check the rest of the store."
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
            except _InvalidRecord:
                current = None
            if current is None or current.object_sha256 == record.object_sha256:
                os.unlink(record_path)

    # ------------------------------------------------------------ size accounting and eviction

    def _note_usage(self, nbytes: int) -> None:
        # One O_APPEND write per put: atomic, lock-free between puts; gc folds it into `usage`.
        with contextlib.suppress(OSError):
            fd = os.open(self._usage_log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, f"{nbytes}\n".encode())
            finally:
                os.close(fd)

    def _usage_estimate(self) -> tuple[int | None, int]:
        """(estimated store bytes or None if unknown, size of usage.log)."""
        try:
            base = int(self._usage_path.read_text())
        except (OSError, ValueError):
            base = None
        try:
            log_text = self._usage_log_path.read_bytes()
        except OSError:
            log_text = b""
        added = sum(int(line) for line in log_text.split() if line.isdigit())
        return (None if base is None else base + added), len(log_text)

    def _evict_if_over_bound(self) -> None:
        estimate, log_bytes = self._usage_estimate()
        if estimate is not None and estimate <= self.max_bytes and log_bytes < USAGE_LOG_FOLD_BYTES:
            return
        try:
            with self._try_flock(self._gc_lock_path) as got_it:
                if not got_it:
                    return  # another process is already collecting
                with self._flock(self._lock_path, fcntl.LOCK_EX):
                    self._collect(trigger_bytes=self.max_bytes, target_bytes=int(self.max_bytes * AUTO_EVICT_LOW_WATER))
        except (OSError, StoreError) as exc:
            # The put itself succeeded; a failed eviction must not turn it into an error.
            log.warning("pp4 store %s: automatic eviction failed: %s", self.root, exc)

    def gc(self, max_bytes: int | None = None) -> GcResult:
        """Evict least-recently-used entries until the store is at most max_bytes (default: its bound).

        Also removes invalid records, records whose object is gone, unreferenced objects and
        staging files older than an hour.
        """
        bound = self.max_bytes if max_bytes is None else int(max_bytes)
        if bound < 0:
            raise ValueError(f"max_bytes must not be negative, got {bound}")
        with self._flock(self._gc_lock_path, fcntl.LOCK_EX), self._flock(self._lock_path, fcntl.LOCK_EX):
            return self._collect(trigger_bytes=bound, target_bytes=bound)

    def _collect(self, trigger_bytes: int, target_bytes: int) -> GcResult:
        """Must run under the exclusive lock: then no put is between publishing an object and its record."""
        with self._store_writes("collecting garbage"):
            tmp_removed = self._remove_stale_tmp(time.time() - STALE_TMP_SECONDS)
            # Lock-free removers still exist (materialize discarding a corrupt entry), so
            # every stat and unlink here tolerates a file that has just gone.
            objects: dict[str, tuple[str, int]] = {}
            for entry in _iter_shard_files(self._objects_dir):
                with contextlib.suppress(FileNotFoundError):
                    objects[entry.name] = (entry.path, entry.stat(follow_symlinks=False).st_size)
            live: list[_LiveRecord] = []
            invalid_removed = 0
            bytes_before = sum(size for _, size in objects.values())
            for entry in _iter_shard_files(self._actions_dir):
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                bytes_before += st.st_size
                record = self._read_record_entry(entry)
                obj = objects.get(record.object_sha256) if record else None
                if record is None or obj is None or obj[1] != record.object_size:
                    _unlink_quietly(Path(entry.path))  # a miss either way; stop it costing space
                    invalid_removed += 1
                    continue
                live.append(_LiveRecord(entry.path, st.st_mtime, st.st_size, record.object_sha256))

            references = Counter(r.object_sha256 for r in live)
            orphans_removed = 0
            for sha256, (path, _) in list(objects.items()):
                if references[sha256] == 0:
                    _unlink_quietly(Path(path))
                    del objects[sha256]
                    orphans_removed += 1

            total = sum(size for _, size in objects.values()) + sum(r.nbytes for r in live)
            records_evicted = objects_evicted = 0
            if total > trigger_bytes:
                for record in sorted(live, key=lambda r: r.mtime):
                    if total <= target_bytes:
                        break
                    _unlink_quietly(Path(record.path))
                    total -= record.nbytes
                    records_evicted += 1
                    references[record.object_sha256] -= 1
                    if references[record.object_sha256] == 0:
                        path, size = objects.pop(record.object_sha256)
                        _unlink_quietly(Path(path))
                        total -= size
                        objects_evicted += 1
            self._reset_usage(total)
        return GcResult(
            root=str(self.root),
            bound=trigger_bytes,
            bytes_before=bytes_before,
            bytes_after=total,
            records_evicted=records_evicted,
            objects_evicted=objects_evicted,
            invalid_records_removed=invalid_removed,
            orphan_objects_removed=orphans_removed,
            tmp_files_removed=tmp_removed,
        )

    def _read_record_entry(self, entry: os.DirEntry) -> ActionRecord | None:
        key = entry.name[: -len(".json")] if entry.name.endswith(".json") else None
        if key is None or not _ACTION_KEY_RE.fullmatch(key) or Path(entry.path).parent.name != key[:2]:
            return None
        try:
            return decode_record(Path(entry.path).read_bytes(), expected_key=key)
        except (_InvalidRecord, FileNotFoundError):
            return None

    def _remove_stale_tmp(self, older_than: float) -> int:
        removed = 0
        for entry in self._stale_tmp_entries(older_than):
            _unlink_quietly(Path(entry.path))
            removed += 1
        return removed

    def _stale_tmp_entries(self, older_than: float) -> list[os.DirEntry]:
        stale = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self._tmp_dir):
                with contextlib.suppress(FileNotFoundError):
                    if entry.stat(follow_symlinks=False).st_mtime < older_than:
                        stale.append(entry)
        return stale

    def _reset_usage(self, total: int) -> None:
        # usage first, then truncate the log: a crash between them double-counts, which only
        # makes the next put recount early.
        fd, staged = self._new_tmp_file(".usage")
        try:
            _write_all(fd, f"{total}\n".encode())
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
        os.replace(staged, self._usage_path)
        with open(self._usage_log_path, "wb"):
            pass

    # ------------------------------------------------------------ stats

    def stats(self) -> StoreStats:
        """Counts and sizes from a directory scan; no lock, no hashing."""
        entries = objects = total = 0
        for entry in _iter_shard_files(self._actions_dir):
            with contextlib.suppress(FileNotFoundError):
                total += entry.stat(follow_symlinks=False).st_size
                entries += 1
        for entry in _iter_shard_files(self._objects_dir):
            with contextlib.suppress(FileNotFoundError):
                total += entry.stat(follow_symlinks=False).st_size
                objects += 1
        try:
            tmp_files = sum(1 for _ in os.scandir(self._tmp_dir))
        except FileNotFoundError:
            tmp_files = 0
        return StoreStats(str(self.root), entries, objects, total, self.max_bytes, tmp_files)

    # ------------------------------------------------------------ verify

    def verify(self, repair: bool = True) -> VerifyReport:
        """Rehash every object and check every record; with repair, remove what is broken.

        Hashing runs without a lock (it can take minutes on a big store) and only
        collects suspects.  Each suspect is then judged again under the exclusive
        lock, when no put or gc is half-way through, so that an entry gc evicted
        mid-scan is not mistaken for damage; removals happen under the same lock.
        """
        suspects: list[str] = []
        bad_objects: dict[str, tuple[int, str]] = {}  # sha -> (inode, digest) as hashed
        objects_seen: set[str] = set()
        objects_checked = 0
        for entry in _iter_shard_files(self._objects_dir):
            name = entry.name
            if not (_SHA256_RE.fullmatch(name) and Path(entry.path).parent.name == name[:2]):
                suspects.append(entry.path)
                continue
            try:
                with open(entry.path, "rb", buffering=0) as f:
                    st = os.fstat(f.fileno())  # the inode we judge, whatever the path holds later
                    inode, digest = st.st_ino, sha256_fd(f.fileno(), st.st_size)
            except FileNotFoundError:
                continue  # removed by a concurrent gc
            objects_checked += 1
            objects_seen.add(name)
            if digest != name:
                bad_objects[name] = (inode, digest)
                suspects.append(entry.path)

        referenced: set[str] = set()
        records_checked = 0
        for entry in _iter_shard_files(self._actions_dir):
            try:
                data = Path(entry.path).read_bytes()
            except FileNotFoundError:
                continue
            records_checked += 1
            problem, record = self._record_problem(entry.path, data, bad_objects)
            if record is not None:
                referenced.add(record.object_sha256)
            if problem is not None:
                suspects.append(entry.path)

        orphans = len(objects_seen - referenced)
        stale_tmp = len(self._stale_tmp_entries(time.time() - STALE_TMP_SECONDS))

        damage: list[Damage] = []
        if suspects:
            with self._lock_for_verify(repair):
                for path in suspects:
                    judged = self._judge_again(path, bad_objects)
                    if judged is not None:  # None: changed under us (evicted, replaced, healed)
                        damage.append(Damage(path, judged[0], judged[1], repaired=repair))
                # Judge everything before removing anything, so a record is reported for
                # its corrupt object, not for the object this repair just removed.
                if repair:
                    for item in damage:
                        _unlink_quietly(Path(item.path))
        return VerifyReport(str(self.root), objects_checked, records_checked, tuple(damage), orphans, stale_tmp, repair)

    def _record_problem(
        self, path: str, data: bytes, bad_objects: dict[str, tuple[int, str]]
    ) -> tuple[tuple[str, str] | None, ActionRecord | None]:
        """((kind, detail) or None, the record if it parsed) for one record file's bytes."""
        name, shard = Path(path).name, Path(path).parent.name
        key = name[: -len(".json")] if name.endswith(".json") else ""
        if not (_ACTION_KEY_RE.fullmatch(key) and shard == key[:2]):
            return ("stray-file", "not named <action key>.json in its <2 hex> shard"), None
        try:
            record = decode_record(data, expected_key=key)
        except _InvalidRecord as exc:
            return ("record-invalid", str(exc)), None
        object_file = self.object_path(record.object_sha256)
        try:
            object_stat = os.stat(object_file)
        except FileNotFoundError:
            return ("record-object-missing", f"object {object_file} does not exist"), record
        bad = bad_objects.get(record.object_sha256)
        if bad is not None and bad[0] == object_stat.st_ino:
            return ("record-object-corrupt", f"object {object_file} is corrupt (hashes to {bad[1]})"), record
        if object_stat.st_size != record.object_size:
            return ("record-object-size", f"object {object_file} has {object_stat.st_size} bytes, record says {record.object_size}"), record
        return None, record

    def _judge_again(self, path: str, bad_objects: dict[str, tuple[int, str]]) -> tuple[str, str] | None:
        p = Path(path)
        if p.parent.parent == self._objects_dir:
            name = p.name
            if not (_SHA256_RE.fullmatch(name) and p.parent.name == name[:2]):
                return ("stray-file", "not named <sha256> in its <2 hex> shard") if p.exists() else None
            try:
                inode = os.stat(p).st_ino
            except FileNotFoundError:
                return None
            bad = bad_objects.get(name)
            # Objects are never rewritten in place: the same inode still has the bad bytes.
            return ("object-hash-mismatch", f"bytes hash to {bad[1]}") if bad and bad[0] == inode else None
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            return None
        return self._record_problem(path, data, bad_objects)[0]

    @contextlib.contextmanager
    def _lock_for_verify(self, repair: bool) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self._flock(self._lock_path, fcntl.LOCK_EX))
            except StoreError:
                if repair:
                    raise
                # Report-only verify must work on a read-only store, where the lock file may be uncreatable.
            yield
