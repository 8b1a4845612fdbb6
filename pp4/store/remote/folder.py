"""A remote storage in a shared folder (NFS, a cluster file system): one file per key.

A value becomes visible by one rename or hard link of a finished, fsynced file, so a reader on
any machine sees a whole value or none; a writer killed half-way leaves only a hidden staging
file, which no key names.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path

from pp4.store.layout import write_all
from pp4.store.remote import RemoteUnavailable, check_key


class FolderStorage:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().absolute()
        if not self.root.is_dir():
            raise RemoteUnavailable(f"remote store folder {self.root} does not exist or is not a folder "
                                    "(create it, mount the shared file system there, or fix the URL)")

    def describe(self) -> str:
        return f"file://{self.root}"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RemoteUnavailable(f"{self.describe()}: cannot read {key}: {exc.strerror}") from None

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """A shared file system has no round trip to save: one read each."""
        return [self.get(k) for k in keys]

    def put(self, key: str, value: bytes, *, only_if_missing: bool = False) -> bool:
        path = self._path(key)
        staged = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            path.parent.mkdir(exist_ok=True)
            fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
            try:
                write_all(fd, value)
                os.fsync(fd)
            finally:
                os.close(fd)
            if only_if_missing:
                try:
                    os.link(staged, path)  # fails if a value is there: the first writer's stays
                except FileExistsError:
                    return False
            else:
                os.replace(staged, path)
            return True
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise RemoteUnavailable(f"{self.describe()}: the shared folder is full") from None
            raise RemoteUnavailable(f"{self.describe()}: cannot write {key}: {exc.strerror}") from None
        finally:
            with contextlib.suppress(OSError):  # gone (linked or never made), or its folder is unusable
                os.unlink(staged)

    def remove(self, key: str) -> bool:
        path = self._path(key)
        try:
            os.unlink(path)
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise RemoteUnavailable(f"{self.describe()}: cannot remove {key}: {exc.strerror}") from None

    def keys(self, kind: str):
        for path in sorted((self.root / kind).glob("[0-9a-f]*")):
            yield f"{kind}/{path.name}"

    def size_of(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except OSError:
            return 0

    supports_expiry = False  # a folder keeps files until removed (find -mtime)

    def expire(self, key: str, seconds: int) -> bool:
        raise RemoteUnavailable(f"{self.describe()}: a folder has no expiry: remove old files with find -mtime")

    def server_facts(self) -> dict:
        try:
            fs = os.statvfs(self.root)
        except OSError:
            return {"used": None, "limit": None, "policy": None}
        return {"used": (fs.f_blocks - fs.f_bfree) * fs.f_frsize, "limit": fs.f_blocks * fs.f_frsize, "policy": None}
