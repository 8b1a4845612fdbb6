"""A wheel's bytes, the same on every run: sorted entries, one fixed timestamp, fixed modes, a RECORD.

The timestamp is SOURCE_DATE_EPOCH when set (the reproducible-builds convention), else the zip
format's earliest date, 1980-01-01. The .dist-info folder comes last and its RECORD last of all,
as the wheel format recommends.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import time
import zipfile

import attrs

EARLIEST_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
COMPRESS_LEVEL = 6


@attrs.frozen
class Entry:
    name: str  # path inside the wheel, with /
    data: bytes
    executable: bool = False


def record_hash(data: bytes) -> str:
    """A RECORD line's hash field: sha256, urlsafe base64 without padding."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def zip_time() -> tuple[int, int, int, int, int, int]:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if not epoch:
        return EARLIEST_ZIP_TIME
    try:
        stamp = time.gmtime(int(epoch))
    except (ValueError, OverflowError):
        raise ValueError(f"SOURCE_DATE_EPOCH={epoch!r} is not a number of seconds since 1970: unset it or fix it") from None
    return max(EARLIEST_ZIP_TIME, tuple(stamp[:6]))


def wheel_bytes(entries: list[Entry], dist_info: str) -> bytes:
    """The wheel holding entries (package files, and dist_info's files except RECORD) plus RECORD."""
    record_name = f"{dist_info}/RECORD"
    names = [e.name for e in entries]
    if len(set(names)) != len(names) or record_name in names:
        raise ValueError(f"duplicate wheel entries in {sorted(names)}")
    ordered = sorted(entries, key=lambda e: (e.name.startswith(dist_info + "/"), e.name))
    lines = [f"{e.name},{record_hash(e.data)},{len(e.data)}" for e in ordered] + [f"{record_name},,"]
    ordered.append(Entry(record_name, ("\n".join(lines) + "\n").encode()))
    when = zip_time()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for e in ordered:
            info = zipfile.ZipInfo(e.name, date_time=when)
            info.create_system = 3  # unix, so that the modes below are read
            info.external_attr = (0o100755 if e.executable else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, e.data, compresslevel=COMPRESS_LEVEL)
    return out.getvalue()
