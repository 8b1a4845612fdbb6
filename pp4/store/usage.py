"""How big a store is and what to evict: the usage estimate each put appends to, the
least-recently-used eviction that keeps the store under its bound, gc and stats.

These are functions over one Store's folders (pp4/store/local.py owns the layout and the locks);
eviction runs under the store's exclusive lock, so no put is between publishing an object and
the record that names it."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from pp4.store import packs
from pp4.store.layout import SETS_FOLDER, iter_shard_files, unlink_quietly, write_all
from pp4.store.manifests import Manifests
from pp4.store.records import ACTION_KEY_RE, ActionRecord, StoreError, InvalidRecord, decode_record_file
from pp4.store.reports import GcResult, StoreStats

if TYPE_CHECKING:
    from pp4.store.local import Store

log = logging.getLogger("pp4.store.local")

# A put finishes in well under a second; an hour-old staging file belongs to a dead process.
STALE_TMP_SECONDS = 3600
# Automatic eviction goes below the bound, so that the next few puts do not each trigger a full scan.
AUTO_EVICT_LOW_WATER = 0.9
# Once this many bytes of usage.log pile up, the next put recounts the store (a gc pass),
# which keeps the per-put read of the log small.
USAGE_LOG_FOLD_BYTES = 64 * 1024


@attrs.frozen
class _LiveRecord:
    path: str
    mtime: float
    nbytes: int
    object_sha256: str

def note_usage(store: Store, nbytes: int) -> None:
    # One O_APPEND write per put: atomic, lock-free between puts; gc folds it into `usage`.
    with contextlib.suppress(OSError):
        fd = os.open(store.usage_log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, f"{nbytes}\n".encode())
        finally:
            os.close(fd)

def _usage_estimate(store: Store) -> tuple[int | None, int]:
    """(estimated store bytes or None if unknown, size of usage.log)."""
    try:
        base = int(store.usage_path.read_text())
    except (OSError, ValueError):
        base = None
    try:
        log_text = store.usage_log_path.read_bytes()
    except OSError:
        log_text = b""
    added = sum(int(line) for line in log_text.split() if line.isdigit())
    return (None if base is None else base + added), len(log_text)

def evict_if_over_bound(store: Store) -> None:
    estimate, log_bytes = _usage_estimate(store)
    if estimate is not None and estimate <= store.max_bytes and log_bytes < USAGE_LOG_FOLD_BYTES:
        return
    try:
        with store.try_flock(store.gc_lock_path) as got_it:
            if not got_it:
                return  # another process is already collecting
            with store.flock(store.lock_path, fcntl.LOCK_EX):
                _collect(store, trigger_bytes=store.max_bytes, target_bytes=int(store.max_bytes * AUTO_EVICT_LOW_WATER))
    except (OSError, StoreError) as exc:
        # The put itself succeeded; a failed eviction must not turn it into an error.
        log.warning("pp4 store %s: automatic eviction failed: %s", store.root, exc)

def gc(store: Store, max_bytes: int | None = None) -> GcResult:
    """Evict least-recently-used entries until the store is at most max_bytes (default: its bound).

    Also removes invalid records, records whose object is gone, unreferenced objects and
    staging files older than an hour.
    """
    bound = store.max_bytes if max_bytes is None else int(max_bytes)
    if bound < 0:
        raise ValueError(f"max_bytes must not be negative, got {bound}")
    with store.flock(store.gc_lock_path, fcntl.LOCK_EX), store.flock(store.lock_path, fcntl.LOCK_EX):
        return _collect(store, trigger_bytes=bound, target_bytes=bound)

def _collect(store: Store, trigger_bytes: int, target_bytes: int) -> GcResult:
    """Must run under the exclusive lock: then no put is between publishing an object and its record."""
    with store.store_writes("collecting garbage"):
        tmp_removed = _remove_stale_tmp(store, time.time() - STALE_TMP_SECONDS)
        # Lock-free removers still exist (materialize discarding a corrupt entry), so
        # every stat and unlink here tolerates a file that has just gone.
        objects: dict[str, tuple[str, int]] = {}
        for entry in iter_shard_files(store.objects_dir):
            with contextlib.suppress(FileNotFoundError):
                objects[entry.name] = (entry.path, entry.stat(follow_symlinks=False).st_size)
        live: list[_LiveRecord] = []
        invalid_removed = 0
        bytes_before = sum(size for _, size in objects.values())
        for entry in iter_shard_files(store.actions_dir):
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            bytes_before += st.st_size
            record = _read_record_entry(store, entry)
            obj = objects.get(record.object_sha256) if record else None
            if record is None or obj is None or not obj[1]:
                unlink_quietly(Path(entry.path))  # a miss either way; stop it costing space
                invalid_removed += 1
                continue
            live.append(_LiveRecord(entry.path, st.st_mtime, st.st_size, record.object_sha256))

        references = Counter(r.object_sha256 for r in live)
        orphans_removed = 0
        for sha256, (path, _) in list(objects.items()):
            if references[sha256] == 0:
                unlink_quietly(Path(path))
                del objects[sha256]
                orphans_removed += 1

        total = sum(size for _, size in objects.values()) + sum(r.nbytes for r in live)
        records_evicted = objects_evicted = 0
        evicted: set[str] = set()
        if total > trigger_bytes:
            for record in sorted(live, key=lambda r: r.mtime):
                if total <= target_bytes:
                    break
                unlink_quietly(Path(record.path))
                evicted.add(record.path)
                total -= record.nbytes
                records_evicted += 1
                references[record.object_sha256] -= 1
                if references[record.object_sha256] == 0:
                    path, size = objects.pop(record.object_sha256)
                    unlink_quietly(Path(path))
                    total -= size
                    objects_evicted += 1
        alive = {Path(r.path).name[: -len(".json")] for r in live if r.path not in evicted}
        entries_removed, manifests_removed, named = Manifests(store.root).collect(alive.__contains__)
        sets_removed = packs.collect(store.root / SETS_FOLDER, named, STALE_TMP_SECONDS)
        _reset_usage(store, total)
    return GcResult(
        root=str(store.root),
        bound=trigger_bytes,
        bytes_before=bytes_before,
        bytes_after=total,
        records_evicted=records_evicted,
        objects_evicted=objects_evicted,
        invalid_records_removed=invalid_removed,
        orphan_objects_removed=orphans_removed,
        tmp_files_removed=tmp_removed,
        manifest_entries_removed=entries_removed,
        manifests_removed=manifests_removed,
        input_sets_removed=sets_removed,
    )

def _read_record_entry(store: Store, entry: os.DirEntry) -> ActionRecord | None:
    key = entry.name[: -len(".json")] if entry.name.endswith(".json") else None
    if key is None or not ACTION_KEY_RE.fullmatch(key) or Path(entry.path).parent.name != key[:2]:
        return None
    try:
        return decode_record_file(Path(entry.path).read_bytes(), expected_key=key)
    except (InvalidRecord, FileNotFoundError):
        return None

def _remove_stale_tmp(store: Store, older_than: float) -> int:
    removed = 0
    for entry in stale_tmp_entries(store, older_than):
        unlink_quietly(Path(entry.path))
        removed += 1
    return removed

def stale_tmp_entries(store: Store, older_than: float) -> list[os.DirEntry]:
    stale = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(store.tmp_dir):
            with contextlib.suppress(FileNotFoundError):
                if entry.stat(follow_symlinks=False).st_mtime < older_than:
                    stale.append(entry)
    return stale

def _reset_usage(store: Store, total: int) -> None:
    # usage first, then truncate the log: a crash between them double-counts, which only
    # makes the next put recount early.
    fd, staged = store.new_tmp_file(".usage")
    try:
        write_all(fd, f"{total}\n".encode())
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)
    os.replace(staged, store.usage_path)
    with open(store.usage_log_path, "wb"):
        pass

# ------------------------------------------------------------ stats

def stats(store: Store) -> StoreStats:
    """Counts and sizes from a directory scan; no lock, no hashing."""
    entries = objects = total = 0
    for entry in iter_shard_files(store.actions_dir):
        with contextlib.suppress(FileNotFoundError):
            total += entry.stat(follow_symlinks=False).st_size
            entries += 1
    for entry in iter_shard_files(store.objects_dir):
        with contextlib.suppress(FileNotFoundError):
            total += entry.stat(follow_symlinks=False).st_size
            objects += 1
    try:
        tmp_files = sum(1 for _ in os.scandir(store.tmp_dir))
    except FileNotFoundError:
        tmp_files = 0
    return StoreStats(str(store.root), entries, objects, total, store.max_bytes, tmp_files)
