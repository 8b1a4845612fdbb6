"""The remote storage contract (pp4/store/remote): whole values or none, first writer wins with
only_if_missing, keys that cannot escape, clear errors. Every backend runs the same tests."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import RedisServer

from pp4.store.remote import RemoteStorage, RemoteUnavailable
from pp4.store.remote.backend import open_remote

KEY = "obj/" + "ab" * 32


@pytest.fixture(params=["file", "redis"])
def remote(request, tmp_path) -> RemoteStorage:
    if request.param == "redis":
        pytest.importorskip("redis", reason="the Redis client (pip install 'pp4[redis]')")
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server is not installed (.ci/run installs Debian's package)")
        server = RedisServer(tmp_path / "redis")
        request.addfinalizer(server.stop)
        return open_remote(server.url())
    folder = tmp_path / "shared"
    folder.mkdir()
    return open_remote(f"file://{folder}")


def test_values_round_trip_and_only_if_missing_keeps_the_first(remote):
    assert isinstance(remote, RemoteStorage)
    assert remote.get(KEY) is None
    assert remote.put(KEY, b"one")
    assert remote.get(KEY) == b"one"
    assert not remote.put(KEY, b"two", only_if_missing=True)
    assert remote.get(KEY) == b"one"
    assert remote.put(KEY, b"three")
    assert remote.get(KEY) == b"three"
    assert remote.put(KEY, b"") and remote.get(KEY) == b""  # empty is a value, not an absence
    assert remote.remove(KEY) and not remote.remove(KEY)
    assert remote.get(KEY) is None


@pytest.mark.parametrize("key", ["obj/../../etc", "obj/AB" + "0" * 30, "/abs/" + "0" * 32, "obj", "x/" + "0" * 8,
                                 "obj/" + "0" * 32 + "/x"])
def test_a_key_that_could_escape_or_is_not_a_digest_is_refused(remote, key):
    for call in (lambda: remote.get(key), lambda: remote.put(key, b"x"), lambda: remote.remove(key)):
        with pytest.raises(ValueError, match="remote key"):
            call()


def _race(url: str, value: bytes, start: float, results) -> None:
    storage = open_remote(url)
    while time.time() < start:
        pass
    results.put((value[:1], storage.put(KEY, value, only_if_missing=True)))


def test_concurrent_writers_one_wins_and_its_value_is_whole(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    url = f"file://{folder}"
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    values = [bytes([65 + i]) * (8 << 20) for i in range(4)]  # 8 MiB each, all different
    start = time.time() + 2
    procs = [ctx.Process(target=_race, args=(url, v, start, results)) for v in values]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    outcomes = [results.get(timeout=5) for _ in procs]
    winners = [first for first, stored in outcomes if stored]
    assert len(winners) == 1, outcomes
    assert open_remote(url).get(KEY) == winners[0] * (8 << 20)
    assert sorted(os.listdir(folder / "obj")) == [KEY.split("/")[1]]  # no staging file left behind


WRITER = """
import sys
from pp4.store.remote.backend import open_remote
open_remote(sys.argv[1]).put(sys.argv[2], b"x" * (1 << 30))
"""


def test_a_writer_killed_mid_write_leaves_no_value(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    url = f"file://{folder}"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, url, KEY])
    try:
        deadline = time.time() + 60
        while not any(p.name.endswith(".tmp") for p in folder.glob("obj/*")):
            assert proc.poll() is None and time.time() < deadline, "the writer never started staging"
            time.sleep(0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert open_remote(url).get(KEY) is None  # the staging file is there, but no key names it


def test_bad_urls_and_missing_folders_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="unknown scheme 'ftp'"):
        open_remote("ftp://host/x")
    with pytest.raises(ValueError, match="not host 'server'"):
        open_remote("file://server/x")
    with pytest.raises(RemoteUnavailable, match="does not exist.*mount"):
        open_remote(f"file://{tmp_path / 'nowhere'}")


def test_a_folder_that_cannot_take_the_value_is_unavailable_not_a_crash(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    remote = open_remote(f"file://{folder}")
    (folder / "obj").write_text("a file where the kind's folder belongs")  # fails for root too
    with pytest.raises(RemoteUnavailable, match=f"file://{folder}: cannot write obj/"):
        remote.put(KEY, b"x")
    with pytest.raises(RemoteUnavailable, match="cannot read"):
        remote.get(KEY)


def test_rediss_talks_tls_to_a_server_whose_certificate_is_trusted_and_refuses_one_that_is_not(tmp_path, monkeypatch):
    """A real redis-server listening on TLS only, with a self-signed certificate made by openssl:
    trusted through SSL_CERT_FILE (how a team points OpenSSL at its CA), rediss:// stores and reads;
    untrusted, every call is RemoteUnavailable saying why; plain redis:// against it is refused too."""
    pytest.importorskip("redis", reason="the Redis client (pip install 'pp4[redis]')")
    if shutil.which("redis-server") is None or shutil.which("openssl") is None:
        pytest.skip("redis-server or openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([shutil.which("redis-server"), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                               "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
                               "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        monkeypatch.setenv("PP4_REMOTE_TIMEOUT", "2")
        with pytest.raises(RemoteUnavailable, match="certificate verify failed"):
            open_remote(f"rediss://127.0.0.1:{port}/0").get(KEY)
        with pytest.raises(RemoteUnavailable):
            open_remote(f"redis://127.0.0.1:{port}/0").get(KEY)
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        trusted = open_remote(f"rediss://127.0.0.1:{port}/0")
        trusted.put(KEY, b"over TLS")
        assert trusted.get(KEY) == b"over TLS"
    finally:
        server.kill()
        server.wait()


def test_many_values_come_back_in_their_order_in_one_call(remote):
    keys = [f"set/{i:064x}" for i in range(5)]
    for i, key in enumerate(keys):
        if i != 2:
            remote.put(key, bytes([i]) * (i + 1))
    assert remote.get_many(keys) == [b"\x00", b"\x01\x01", None, b"\x03" * 4, b"\x04" * 5]
    assert remote.get_many([]) == []
    with pytest.raises(ValueError, match="remote key"):
        remote.get_many(["set/../x"])
