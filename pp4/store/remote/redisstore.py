"""A remote storage on a Redis server (`redis://[:PASSWORD@]HOST[:PORT][/DB]`, `rediss://` for TLS).

One Redis string per key, under the prefix `pp4:`. A SET is atomic, so a reader sees a whole value
or none; `only_if_missing` is SET NX. Every call is bounded by a timeout (PP4_REMOTE_TIMEOUT
seconds, default 5) and any failure of the server or the connection (down, slow, restarted, out of
memory, wrong password) becomes RemoteUnavailable with a message that names the server without its
password. The password comes from the URL or from PP4_REMOTE_PASSWORD (which wins), and is kept only
in this object.

An optional time to live (`ttl`, seconds) is set on every value written and renewed on every value
read: entries nobody used for that long expire. Without one, the server's own `maxmemory-policy`
decides what goes when it is full (`allkeys-lru` suits a cache).

Needs the redis-py client: `pip install 'pp4[redis]'`.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from pp4.store.remote import RemoteUnavailable, check_key, redact

PREFIX = "pp4:"
DEFAULT_TIMEOUT_S = 5.0


def timeout_from_env() -> float:
    raw = os.environ.get("PP4_REMOTE_TIMEOUT")
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1
    if not 0 < value <= 600:
        raise ValueError(f"PP4_REMOTE_TIMEOUT={raw!r}: seconds per remote call, more than 0 and at most 600")
    return value


class RedisStorage:
    def __init__(self, url: str, *, ttl: int | None = None, timeout: float | None = None):
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ValueError(f"remote store {redact(url)}: the Redis client is not installed "
                             "(pip install 'pp4[redis]', or pip install redis)") from None
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(f"remote store {redact(url)}: not a redis:// or rediss:// URL")
        if not parts.hostname:
            raise ValueError(f"remote store {redact(url)}: no host (redis://HOST:PORT/DB)")
        path = parts.path.strip("/")
        if path and not path.isdigit():
            raise ValueError(f"remote store {redact(url)}: the path is the database number (redis://HOST:PORT/0), "
                             f"not {path!r}")
        try:
            port = parts.port or 6379
        except ValueError:
            raise ValueError(f"remote store {redact(url)}: the port is not a number") from None
        self._errors = (redis.RedisError, OSError)
        self.url = redact(url)
        self.ttl = ttl
        password = os.environ.get("PP4_REMOTE_PASSWORD") or (unquote(parts.password) if parts.password else None)
        timeout = timeout_from_env() if timeout is None else timeout
        self._client = redis.Redis(
            host=parts.hostname, port=port, db=int(path or 0), username=unquote(parts.username) if parts.username else None,
            password=password, ssl=parts.scheme == "rediss", socket_timeout=timeout,
            socket_connect_timeout=timeout, health_check_interval=0,
            retry=Retry(NoBackoff(), 0))  # one attempt: the timeout bounds the call, not four times it

    def describe(self) -> str:
        return self.url

    def _fail(self, doing: str, exc: Exception) -> RemoteUnavailable:
        text = str(exc).strip() or type(exc).__name__
        if "OOM" in text or "maxmemory" in text:
            text = "the server is out of memory (maxmemory) and evicts nothing: " + text
        return RemoteUnavailable(f"{self.url}: cannot {doing}: {text}")

    def get(self, key: str) -> bytes | None:
        name = PREFIX + check_key(key)
        try:
            if self.ttl:
                return self._client.getex(name, ex=self.ttl)
            return self._client.get(name)
        except self._errors as exc:
            raise self._fail(f"read {key}", exc) from None

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """One round trip: MGET, or with a time to live one pipeline of GETEX (renewing each value
        read)."""
        names = [PREFIX + check_key(k) for k in keys]
        if not names:
            return []
        try:
            if not self.ttl:
                return list(self._client.mget(names))
            pipe = self._client.pipeline(transaction=False)
            for name in names:
                pipe.getex(name, ex=self.ttl)
            return list(pipe.execute())
        except self._errors as exc:
            more = f" and {len(keys) - 1} more values" if len(keys) > 1 else ""
            raise self._fail(f"read {keys[0]}{more}", exc) from None

    def put(self, key: str, value: bytes, *, only_if_missing: bool = False) -> bool:
        name = PREFIX + check_key(key)
        try:
            return bool(self._client.set(name, value, nx=only_if_missing, ex=self.ttl or None))
        except self._errors as exc:
            raise self._fail(f"write {key}", exc) from None

    def remove(self, key: str) -> bool:
        name = PREFIX + check_key(key)
        try:
            return bool(self._client.delete(name))
        except self._errors as exc:
            raise self._fail(f"remove {key}", exc) from None

    # -- what `python -m pp4.store remote ...` reports --------------------------------------

    supports_expiry = True

    def keys(self, kind: str):
        """Every key of one kind ("obj", "act", ...), as the interface names them."""
        try:
            for name in self._client.scan_iter(match=f"{PREFIX}{kind}/*", count=1000):
                yield name.decode()[len(PREFIX):]
        except self._errors as exc:
            raise self._fail(f"list the {kind} keys", exc) from None

    def size_of(self, key: str) -> int:
        try:
            return int(self._client.strlen(PREFIX + check_key(key)))
        except self._errors as exc:
            raise self._fail(f"read the size of {key}", exc) from None

    def expire(self, key: str, seconds: int) -> bool:
        try:
            return bool(self._client.expire(PREFIX + check_key(key), seconds))
        except self._errors as exc:
            raise self._fail(f"set the expiry of {key}", exc) from None

    def server_facts(self) -> dict:
        try:
            memory = self._client.info("memory")
            return {"used": memory.get("used_memory"), "limit": memory.get("maxmemory") or None,
                    "policy": memory.get("maxmemory_policy")}
        except self._errors as exc:
            raise self._fail("read the server's memory facts", exc) from None
