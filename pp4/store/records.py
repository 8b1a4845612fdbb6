"""What the store says and keeps about one compile action: its record (checksummed JSON) and the
errors it raises. (The reports of gc, stats and verify: pp4/store/reports.py.)"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import attrs

from pp4.files import canonical_json
from pp4.store import compressed

RECORD_FORMAT = 2  # 2: signatures and disputes (pp4/store/signing.py); 1 reads as unsigned
ACTION_KEY_RE = re.compile(r"[0-9a-f]{16,128}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")


# ---------------------------------------------------------------- errors


class StoreError(Exception):
    """The store cannot do what was asked: unwritable directory, full disk, bad configuration."""


class CorruptObject(StoreError):
    """A stored object's bytes do not hash to the sha256 its record promises.

    The damaged entry has been removed, so the action is now a miss: recompile.
    """


class ObjectMissing(StoreError):
    """The object named by a record vanished between lookup and materialize (gc or repair ran).

    Treat as a miss: recompile.
    """


class InvalidRecord(Exception):
    """A record file that must not be trusted; the message says why."""


# ---------------------------------------------------------------- records


@attrs.frozen
class ActionRecord:
    """What the store knows about one compile action: its key, its output, and caller data."""

    action_key: str
    object_sha256: str
    object_size: int
    # Opaque to the store: command, input hashes, toolchain id, depfile text, compile time...
    payload: dict = attrs.field(hash=False)
    created: float
    # Builders' signatures of the entry's statement, and their disputes of it (each
    # {"signer", "sig"[, "object_sha256"]}: pp4/store/signing.py); the checksum covers them, which
    # proves nothing of who made them: the trust list does.
    signatures: tuple = attrs.field(default=(), converter=tuple, hash=False)
    disputes: tuple = attrs.field(default=(), converter=tuple, hash=False)


def _canonical_json(value: Any) -> str:
    return canonical_json(value).decode()


def _checksum(body: dict) -> str:
    return hashlib.sha256(_canonical_json(body).encode()).hexdigest()


def encode_record(record: ActionRecord) -> bytes:
    """Serialize a record with an embedded sha256 of its canonical JSON."""
    body = {"format": RECORD_FORMAT, **attrs.asdict(record)}
    body["checksum"] = _checksum(body)
    return (_canonical_json(body) + "\n").encode()


def decode_record(data: bytes, expected_key: str | None = None) -> ActionRecord:
    """Parse and check a record; raises InvalidRecord (internal) for anything not trustworthy."""
    try:
        body = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise InvalidRecord(f"not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise InvalidRecord("not a JSON object")
    stored_checksum = body.pop("checksum", None)
    if not isinstance(stored_checksum, str):
        raise InvalidRecord("no checksum field")
    try:
        actual_checksum = _checksum(body)
    except ValueError as exc:
        raise InvalidRecord(f"cannot canonicalize ({exc})") from None
    if actual_checksum != stored_checksum:
        raise InvalidRecord(f"checksum mismatch: stored {stored_checksum[:16]}..., content hashes to {actual_checksum[:16]}...")
    if body.get("format") not in (1, RECORD_FORMAT):
        raise InvalidRecord(f"unknown record format {body.get('format')!r}")
    key, sha, size = body.get("action_key"), body.get("object_sha256"), body.get("object_size")
    payload, created = body.get("payload"), body.get("created")
    signatures, disputes = body.get("signatures", []), body.get("disputes", [])
    if not (isinstance(signatures, list) and isinstance(disputes, list)
            and all(isinstance(x, dict) for x in signatures + disputes)):
        raise InvalidRecord("signatures or disputes are not lists of objects")
    if not (isinstance(key, str) and ACTION_KEY_RE.fullmatch(key)):
        raise InvalidRecord(f"bad action_key {key!r}")
    if expected_key is not None and key != expected_key:
        raise InvalidRecord(f"record is for action {key}, but is filed under {expected_key}")
    if not (isinstance(sha, str) and SHA256_RE.fullmatch(sha)):
        raise InvalidRecord(f"bad object_sha256 {sha!r}")
    if not (type(size) is int and size >= 0):
        raise InvalidRecord(f"bad object_size {size!r}")
    if not isinstance(payload, dict):
        raise InvalidRecord("payload is not a JSON object")
    if not (isinstance(created, (int, float)) and not isinstance(created, bool)):
        raise InvalidRecord(f"bad created {created!r}")
    return ActionRecord(key, sha, size, payload, float(created), tuple(signatures), tuple(disputes))


# The most a record file may expand to (a record names up to 1,400 sets and carries 1 MiB of warnings).
RECORD_FILE_LIMIT = 64 * 1024 * 1024


def encode_record_file(record: ActionRecord) -> bytes:
    """A record as the local store keeps it: encode_record's bytes as a zstd frame (the set names in
    its payload are hex, half of which is redundancy)."""
    return compressed.compress(encode_record(record), compressed.SETS_LEVEL)


def decode_record_file(data: bytes, expected_key: str | None = None) -> ActionRecord:
    """decode_record of a record file's frame; InvalidRecord for anything not trustworthy."""
    try:
        text = compressed.decompress(data, RECORD_FILE_LIMIT)
    except compressed.NotAFrame as exc:
        raise InvalidRecord(f"not a record file ({exc})") from None
    return decode_record(text, expected_key)
