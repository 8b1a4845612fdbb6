"""verify: expand and rehash every object of a store and check every record, and with repair remove what
is broken, judged again under the store's exclusive lock so that concurrent eviction is never
mistaken for damage."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from pp4.store import compressed
from pp4.store.layout import iter_shard_files, unlink_quietly
from pp4.store.records import ACTION_KEY_RE, SHA256_RE, ActionRecord, StoreError, InvalidRecord, decode_record_file
from pp4.store.reports import Damage, VerifyReport
from pp4.store.usage import STALE_TMP_SECONDS, stale_tmp_entries

if TYPE_CHECKING:
    from pp4.store.local import Store


def verify(store: Store, repair: bool = True) -> VerifyReport:
    """Rehash every object and check every record; with repair, remove what is broken.

    Hashing runs without a lock (it can take minutes on a big store) and only
    collects suspects.  Each suspect is then judged again under the exclusive
    lock, when no put or gc is half-way through, so that an entry gc evicted
    mid-scan is not mistaken for damage; removals happen under the same lock.
    """
    suspects: list[str] = []
    bad_objects: dict[str, tuple[int, str]] = {}  # sha -> (inode, what is wrong) as read
    sizes: dict[str, int] = {}  # sha -> the size its frame expands to
    objects_seen: set[str] = set()
    objects_checked = 0
    for entry in iter_shard_files(store.objects_dir):
        name = entry.name
        if not (SHA256_RE.fullmatch(name) and Path(entry.path).parent.name == name[:2]):
            suspects.append(entry.path)
            continue
        try:
            with open(entry.path, "rb", buffering=0) as f:
                inode = os.fstat(f.fileno()).st_ino  # the inode we judge, whatever the path holds later
                frame = f.read()
        except FileNotFoundError:
            continue  # removed by a concurrent gc
        objects_checked += 1
        objects_seen.add(name)
        try:
            data = compressed.decompress(frame, compressed.VERIFY_OBJECT_LIMIT)
            digest = hashlib.sha256(data).hexdigest()
            wrong = None if digest == name else f"bytes hash to {digest}"
            sizes[name] = len(data)
        except compressed.NotAFrame as e:
            wrong = str(e)
        if wrong is not None:
            bad_objects[name] = (inode, wrong)
            suspects.append(entry.path)

    referenced: set[str] = set()
    records_checked = 0
    for entry in iter_shard_files(store.actions_dir):
        try:
            data = Path(entry.path).read_bytes()
        except FileNotFoundError:
            continue
        records_checked += 1
        problem, record = _record_problem(store, entry.path, data, bad_objects, sizes)
        if record is not None:
            referenced.add(record.object_sha256)
        if problem is not None:
            suspects.append(entry.path)

    orphans = len(objects_seen - referenced)
    stale_tmp = len(stale_tmp_entries(store, time.time() - STALE_TMP_SECONDS))

    damage: list[Damage] = []
    if suspects:
        with _lock_for_verify(store, repair):
            for path in suspects:
                judged = _judge_again(store, path, bad_objects, sizes)
                if judged is not None:  # None: changed under us (evicted, replaced, healed)
                    damage.append(Damage(path, judged[0], judged[1], repaired=repair))
            # Judge everything before removing anything, so a record is reported for
            # its corrupt object, not for the object this repair just removed.
            if repair:
                for item in damage:
                    unlink_quietly(Path(item.path))
    return VerifyReport(str(store.root), objects_checked, records_checked, tuple(damage), orphans, stale_tmp, repair)

def _record_problem(
    store: Store, path: str, data: bytes, bad_objects: dict[str, tuple[int, str]], sizes: dict[str, int]
) -> tuple[tuple[str, str] | None, ActionRecord | None]:
    """((kind, detail) or None, the record if it parsed) for one record file's bytes."""
    name, shard = Path(path).name, Path(path).parent.name
    key = name[: -len(".json")] if name.endswith(".json") else ""
    if not (ACTION_KEY_RE.fullmatch(key) and shard == key[:2]):
        return ("stray-file", "not named <action key>.json in its <2 hex> shard"), None
    try:
        record = decode_record_file(data, expected_key=key)
    except InvalidRecord as exc:
        return ("record-invalid", str(exc)), None
    object_file = store.object_path(record.object_sha256)
    try:
        object_stat = os.stat(object_file)
    except FileNotFoundError:
        return ("record-object-missing", f"object {object_file} does not exist"), record
    bad = bad_objects.get(record.object_sha256)
    if bad is not None and bad[0] == object_stat.st_ino:
        return ("record-object-corrupt", f"object {object_file} is corrupt ({bad[1]})"), record
    size = sizes.get(record.object_sha256)
    if size is not None and size != record.object_size:
        return ("record-object-size", f"object {object_file} expands to {size} bytes, record says {record.object_size}"), record
    return None, record

def _judge_again(store: Store, path: str, bad_objects: dict[str, tuple[int, str]],
                 sizes: dict[str, int]) -> tuple[str, str] | None:
    p = Path(path)
    if p.parent.parent == store.objects_dir:
        name = p.name
        if not (SHA256_RE.fullmatch(name) and p.parent.name == name[:2]):
            return ("stray-file", "not named <sha256> in its <2 hex> shard") if p.exists() else None
        try:
            inode = os.stat(p).st_ino
        except FileNotFoundError:
            return None
        bad = bad_objects.get(name)
        # Objects are never rewritten in place: the same inode still has the bad bytes.
        return ("object-hash-mismatch", bad[1]) if bad and bad[0] == inode else None
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return None
    return _record_problem(store, path, data, bad_objects, sizes)[0]

@contextlib.contextmanager
def _lock_for_verify(store: Store, repair: bool) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(store.flock(store.lock_path, fcntl.LOCK_EX))
        except StoreError:
            if repair:
                raise
            # Report-only verify must work on a read-only store, where the lock file may be uncreatable.
        yield
