"""The interface a remote storage implements: whole values under short keys, nothing more.

A remote is a second tier behind the local store (pp4/store/local.py), shared by a team's
machines. It is deliberately dumb: get, put and remove of opaque bytes. What the bytes mean, how
entries are laid out so that a reader never sees half of one, and the checks that make a
poisoned or truncated value harmless all live in the code that uses a remote, once, so that every
backend (a shared folder here, Redis, ...) inherits them and none has to be trusted.

Backends are chosen by the URL's scheme (``pp4/store/remote/backend.py: open_remote``).  Each call is bounded in time and
either succeeds, answers "absent", or raises ``RemoteUnavailable``: a remote that misbehaves
never fails a build, it only stops being used.
"""

from __future__ import annotations

import re
from typing import Iterator, Protocol, runtime_checkable
from urllib.parse import urlsplit

from pp4.store.records import StoreError

REDACTED = "***"  # a password's place in a URL that messages, build files and certificates show
# Keys are "<kind>/<hex>" (e.g. "obj/<sha256>"): safe as file names and as Redis keys alike.
KEY_RE = re.compile(r"[a-z]{1,16}/[0-9a-f]{16,128}")


class RemoteUnavailable(StoreError):
    """The remote cannot answer now (down, slow, refused, full, wrong password); the message says
    which remote and why, without its password."""


@runtime_checkable
class RemoteStorage(Protocol):
    """What a remote backend provides. ``describe`` names it for messages (no secrets)."""

    def describe(self) -> str: ...

    def get(self, key: str) -> bytes | None:
        """The value stored under key, whole, or None when there is none."""

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """The values of several keys, in their order, in as few round trips as the backend can (one
        for Redis): a restore asks for hundreds of sets and objects at once."""

    def put(self, key: str, value: bytes, *, only_if_missing: bool = False) -> bool:
        """Store value under key so that a reader sees either nothing or all of it. With
        only_if_missing, an existing value is kept. True when this call stored the value."""

    def remove(self, key: str) -> bool:
        """Remove key's value; True when there was one."""

    # What `python -m pp4.store remote ...` needs to report on and maintain a remote.

    supports_expiry: bool  # whether expire() can give a value a time to live

    def keys(self, kind: str) -> Iterator[str]:
        """Every key of one kind ("obj", "act", "man", "set")."""

    def size_of(self, key: str) -> int:
        """The size of key's value in bytes (0 when there is none)."""

    def expire(self, key: str, seconds: int) -> bool:
        """Let key's value live `seconds` more unless read; True when there was one. Only where
        supports_expiry."""

    def server_facts(self) -> dict:
        """What the server says about its room: {"used", "limit", "policy"}, each None when unknown."""


def check_key(key: str) -> str:
    if not (isinstance(key, str) and KEY_RE.fullmatch(key)):
        raise ValueError(f"a remote key is <kind>/<hex digest>, got {key!r}")
    return key


def redact(url: str) -> str:
    """The URL as messages, build files and certificates may show it: any password replaced by ***."""
    parts = urlsplit(url)
    try:
        if parts.password is None:
            return url
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port that is not a number: show no part of the netloc
        return parts._replace(netloc="***").geturl()
    return parts._replace(netloc=f"{parts.username or ''}:{REDACTED}@{parts.hostname or ''}{port}").geturl()
