"""The backend for a remote store's URL: here, not in the package's own module, which every backend
imports for the interface it implements."""

from __future__ import annotations

from urllib.parse import urlsplit

from pp4.store.remote import RemoteStorage, redact


def open_remote(url: str, *, ttl: int | None = None) -> RemoteStorage:
    """The backend for url: ``file:///shared/folder`` (a folder every machine mounts) or
    ``redis://[:PASSWORD@]HOST[:PORT][/DB]`` (``rediss://`` with TLS). ttl: seconds an unused value
    lives (Redis only)."""
    parts = urlsplit(url)
    if parts.scheme in ("redis", "rediss"):
        from pp4.store.remote.redisstore import RedisStorage

        return RedisStorage(url, ttl=ttl)
    if parts.scheme == "file":
        from pp4.store.remote.folder import FolderStorage

        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"remote store {url!r}: a file URL names a local path (file:///path), not host {parts.netloc!r}")
        if ttl:
            raise ValueError(f"remote store {url!r}: a folder has no expiry (remove old files with find -mtime)")
        return FolderStorage(parts.path)
    raise ValueError(f"remote store {redact(url)!r}: unknown scheme {parts.scheme!r} "
                     "(use redis://HOST:PORT/DB, rediss://HOST:PORT/DB or file:///PATH)")
