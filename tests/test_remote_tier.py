"""The remote tier on a real Redis server (Debian's redis-server, started here on a free port).

Oracles independent of the code under test: a restored object is compared byte for byte with a real
compile of the same sources in another folder; what the server holds is read with the server's own
commands (redis-cli semantics through the client, never through pp4); a poisoned value is made by
hand and the build must compile instead of using it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from conftest import RedisServer as Server
from conftest import group_doc, group_frame, unzstd, zstd_frame
from test_build import ninja_bin

pytest.importorskip("redis", reason="the Redis client (pip install 'pp4[redis]'; .ci/run installs it)")
pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed "
                                "(.ci/run installs Debian's package)")

FIXTURE = REPO / "tests" / "fixtures" / "debuginfo"
PASSWORD = "pp4-s3cret-Pa55"


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "redis")
    yield s
    s.stop()


def build(work: Path, *options: str, env: dict | None = None, timeout: float = 300) -> tuple[dict, str]:
    """Configure and build the fixture in work (its own copy of the sources, its own store)."""
    if not (work / "src").exists():
        shutil.copytree(FIXTURE, work / "src")
    env = dict(os.environ, **(env or {}))
    out = ""
    for cmd in ([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", "src/plain.toml",
                 "--store", str(work / "store"), *options], [ninja_bin()]):
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
        out += proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{cmd} failed:\n{out}"
    (obj,) = json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))["objects"]
    return obj, out


def object_bytes(work: Path, obj: dict) -> bytes:
    return (work / obj["output"]).read_bytes()


@pytest.mark.slow
def test_another_clone_restores_from_redis_the_bytes_a_real_compile_gives(tmp_path, server, toolchain):
    first, _ = build(tmp_path / "a", "--remote-store", server.url())
    assert first["status"] == "compiled"
    # Two keys for the object (its bytes, and its group: entries, record, observations, compressed),
    # two for the module its link made.
    assert sorted(k.split("/")[0] for k in server.keys()) == ["pp4:ent", "pp4:ent", "pp4:obj", "pp4:obj"]
    obj_key = f"pp4:obj/{first['object_sha256']}"
    assert obj_key in server.keys("obj")
    assert hashlib.sha256(unzstd(server.client.get(obj_key))).hexdigest() == first["object_sha256"]

    # Another folder, an empty local store, read only: restored from the remote, filling the local store.
    second, out = build(tmp_path / "b", "--remote-store", server.url(), "--remote-store-mode", "read")
    assert second["status"] == "reused" and second["tier"] == "remote", out
    assert "1 from the remote store" in out
    assert list((tmp_path / "b" / "store" / "objects").glob("*/*")), "a remote hit fills the local store"
    real, _ = build(tmp_path / "c", "--no-reuse")
    assert real["status"] == "compiled"
    assert object_bytes(tmp_path / "b", second) == object_bytes(tmp_path / "c", real)

    # Read mode sends nothing: an edited source compiles in b and the server gains no key.
    before = server.keys()
    unit = tmp_path / "b" / "src" / "unit.cpp"
    unit.write_text(unit.read_text() + "int pp4_read_mode_edit() { return 7; }\n")
    subprocess.run([ninja_bin()], cwd=tmp_path / "b", check=True, capture_output=True)
    assert server.keys() == before

    # The same edit in readwrite mode is sent, and a third clone gets it.
    (tmp_path / "d").mkdir()
    shutil.copytree(tmp_path / "b" / "src", tmp_path / "d" / "src")
    edited, _ = build(tmp_path / "d", "--remote-store", server.url())
    assert edited["status"] == "compiled" and len(server.keys("obj")) == 4  # an object and a module more


@pytest.mark.slow
def test_poisoned_truncated_or_mismatched_remote_values_are_refused_and_never_used(tmp_path, server, toolchain):
    good, _ = build(tmp_path / "a", "--remote-store", server.url())
    good_bytes = object_bytes(tmp_path / "a", good)
    obj_key = f"pp4:obj/{good['object_sha256']}"
    # The object's group: the one whose record names it (the other is the module's link).
    ent_key, group = next((k, g) for k in server.keys("ent") if good["action_key"] in (g := group_doc(server.client.get(k)))["records"])
    ((akey, record_text),) = group["records"].items()
    mkey = json.loads(record_text)["payload"]["manifest_key"]
    assert list(group["manifests"]) == [mkey]

    def rewrite(change) -> None:
        doc = group_doc(server.client.get(ent_key))
        change(doc)
        server.client.set(ent_key, group_frame(doc))

    def poisoned_build(name: str, why: str) -> None:
        obj, out = build(tmp_path / name, "--remote-store", server.url())
        assert obj["status"] == "compiled", out  # never the poisoned value
        assert object_bytes(tmp_path / name, obj) == good_bytes
        assert "warning: refused the remote store's" in out and why in out, out
        log = (tmp_path / name / "build" / ".pp4" / "remote" / "refused.log").read_text().splitlines()
        assert len(log) == 1 and why in log[0]

    # Other bytes under the object's digest: the record's sha256 is not theirs.
    server.client.set(obj_key, zstd_frame(good_bytes[:-8] + b"POISONED"))
    poisoned_build("b", "do not hash to the sha256")
    assert unzstd(server.client.get(obj_key)) == good_bytes, "the compile that refused it heals the value"

    # Not a zstd frame at all, or one that claims to expand past the object's size.
    server.client.set(obj_key, good_bytes)
    poisoned_build("b2", "not a zstd frame")
    server.client.set(obj_key, zstd_frame(good_bytes + b"\0" * 4096))
    poisoned_build("b3", "more than the")

    # A truncated record: its checksum fails.
    rewrite(lambda doc: doc["records"].update({akey: doc["records"][akey][:-40]}))
    poisoned_build("c", "not valid JSON")

    # A manifest entry naming another action (a hand-edited action key): its key does not follow
    # from its inputs.
    rewrite(lambda doc: doc["manifests"].update(
        {mkey: [dict(e, action_key=hashlib.sha256(b"another action").hexdigest()) for e in doc["manifests"][mkey]]}))
    poisoned_build("d", "an entry whose action key does not follow from its observations")

    # An entry that names a set pack outside the key space, which the group cannot hold: the group
    # is refused, never a path or a crash.
    from pp4.reuse import inputsets
    from pp4.reuse.wrapper import action_key
    from pp4.store import packs
    doc = group_doc(server.client.get(ent_key))
    rewrite(lambda d: d["manifests"].update({mkey: [dict(doc["manifests"][mkey][0], pack="../../../etc/passwd")]}))
    poisoned_build("e", "which the group lacks")

    def with_pack(entry: dict, sets: dict[str, bytes]) -> None:
        """The group with entry as its command's only entry, naming a pack of these sets."""
        forged = packs.pack(sets)
        entry["pack"] = forged.name
        rewrite(lambda d: (d["manifests"].update({mkey: [entry]}),
                           d["pack_frames"].update({forged.name: forged.frame})))

    # A pack whose set's bytes are not what its name hashes: another set's pairs under the name.
    first = doc["manifests"][mkey][0]
    sets = packs.checked_sets(doc["pack_frames"][first["pack"]])
    some_sid, other_sid = sorted(sets)[:2]
    with_pack(dict(first), dict(sets, **{some_sid: sets[other_sid]}))
    poisoned_build("e2", "does not hash to its name")

    # One whose observations name /dev/zero as a file read: its state is "not a regular file",
    # found without reading it, so a miss, not a hung build.
    sid, data = inputsets.encode([["/dev/zero", "0" * 64]])
    entry = dict(first, action_key=action_key(mkey, sorted([*sets, sid])))
    with_pack(entry, dict(sets, **{sid: data}))
    obj, out = build(tmp_path / "f", "--remote-store", server.url(), timeout=120)
    assert obj["status"] == "compiled" and object_bytes(tmp_path / "f", obj) == good_bytes


@pytest.mark.slow
def test_a_dead_slow_full_or_locked_server_costs_one_warning_and_the_build_goes_on(tmp_path, toolchain):
    # Down: nothing listens on the port.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    obj, out = build(tmp_path / "down", "--remote-store", f"redis://127.0.0.1:{port}/0")
    assert obj["status"] == "compiled"
    warnings = [ln for ln in out.splitlines() if "pp4.reuse: warning" in ln]
    assert len(warnings) == 1 and "Connection refused" in warnings[0] and "local store alone" in warnings[0], out
    assert warnings[0].endswith("to stop trying it, re-run configure without --remote-store)"), out
    told = [ln for ln in out.splitlines() if ln.startswith("configure: warning")]
    assert len(told) == 1 and told[0].endswith("(to stop trying it, re-run configure without --remote-store)"), out

    # A wrong password: refused by the server, said once, built locally; the password is in no file.
    locked = Server(tmp_path / "locked", "--requirepass", PASSWORD)
    try:
        obj, out = build(tmp_path / "wrong", "--remote-store", locked.url("not-the-password"))
        assert obj["status"] == "compiled" and "not-the-password" not in out
        assert len([ln for ln in out.splitlines() if "pp4.reuse: warning" in ln]) == 1, out
        assert locked.keys() == []
        # The right one, in the URL: it works, and appears in no file but the owner-only secret.
        obj, out = build(tmp_path / "right", "--remote-store", locked.url(PASSWORD))
        assert obj["status"] == "compiled" and len(locked.keys("obj")) == 2, out  # the object and the module
        secret = tmp_path / "right" / "build" / ".pp4" / "remote" / "secret"
        assert secret.read_text() == PASSWORD and secret.stat().st_mode & 0o777 == 0o600
        for f in (tmp_path / "right").rglob("*"):
            if f.is_file() and f != secret and "src" not in f.parts:
                assert PASSWORD.encode() not in f.read_bytes(), f
        assert PASSWORD not in out
        # Or from the environment alone.
        obj, _ = build(tmp_path / "env", "--remote-store", locked.url(), env={"PP4_REMOTE_PASSWORD": PASSWORD})
        assert obj["status"] == "reused" and obj["tier"] == "remote"
    finally:
        locked.stop()

    # Out of memory: maxmemory with no eviction refuses every write.
    full = Server(tmp_path / "full", "--maxmemory", "1", "--maxmemory-policy", "noeviction")
    try:
        full.client.config_set("maxmemory", full.client.info("memory")["used_memory"] + 1024)
        obj, out = build(tmp_path / "full", "--remote-store", full.url())
        assert obj["status"] == "compiled"
        warnings = [ln for ln in out.splitlines() if "pp4.reuse: warning" in ln]
        assert len(warnings) == 1 and "out of memory" in warnings[0], out
    finally:
        full.stop()

    # Slow: a server that stops answering mid-build (SIGSTOP) costs one bounded wait per process.
    slow = Server(tmp_path / "slow")
    try:
        os.kill(slow.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        obj, out = build(tmp_path / "slow", "--remote-store", slow.url(), env={"PP4_REMOTE_TIMEOUT": "1"},
                         timeout=120)
        assert obj["status"] == "compiled" and time.monotonic() - t0 < 60
        assert "configure: warning" in out and ("Timeout" in out or "timed out" in out), out
    finally:
        os.kill(slow.proc.pid, signal.SIGCONT)
        slow.stop()


def test_remote_settings_refuse_bad_input_and_keep_no_password(tmp_path):
    from pp4.store.remote import redact
    from pp4.store.remote.tier import settings, url_with_secret

    state = tmp_path / ".pp4"
    doc = settings("redis://:p%40ss@h:7/1", "read", 2, state)
    assert doc == {"url": "redis://:***@h:7/1", "mode": "read", "ttl": 172800}
    assert url_with_secret(doc["url"], state) == "redis://:p%40ss@h:7/1"
    assert redact("rediss://user:pw@h/0") == "rediss://user:***@h/0"
    for url, message in (("redis://h:7/x", "database number"), ("redis://:9/0", "no host"),
                         ("ftp://h/x", "unknown scheme"), ("file://host/x", "local path")):
        with pytest.raises(ValueError, match=message):
            settings(url, "readwrite", None, state)
    with pytest.raises(ValueError, match="read or readwrite"):
        settings("redis://h/0", "write", None, state)
    with pytest.raises(ValueError, match="at most 3650"):
        settings("redis://h/0", "read", 0, state)


def venv_elsewhere(folder: Path) -> Path:
    """A second Python environment at another path with this one's packages (linked, not copied:
    what matters to a key is where torch's headers are, not whose bytes they are)."""
    import sysconfig

    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(folder)],
                   check=True)
    python = folder / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not (site / entry.name).exists():
            (site / entry.name).symlink_to(entry)
    return python


@pytest.mark.slow
def test_clones_with_other_folders_venvs_and_caches_share_objects_a_real_compile_there_gives(tmp_path, server,
                                                                                              wheelhouse):
    """Portable keys: the second clone's checkout, venv (so torch's headers) and pp4 cache (so the
    toolchain) all sit at other paths; its restored objects equal what it compiles itself."""
    two = REPO / "tests" / "fixtures" / "twomodules"

    def build_two(work: Path, python: Path, cache: Path, *options: str) -> list[dict]:
        shutil.copytree(two, work / "proj")
        env = dict(os.environ, PP4_CACHE_DIR=str(cache))
        for cmd in ([str(python), str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", "proj/spec/spec.toml",
                     "--wheel-dir", str(wheelhouse), *options], [ninja_bin()]):
            proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
        return json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))["objects"]

    first = build_two(tmp_path / "one", Path(sys.executable), Path(os.environ.get("PP4_CACHE_DIR", tmp_path / "c1")),
                      "--store", str(tmp_path / "store-one"), "--remote-store", server.url())
    assert {o["status"] for o in first} == {"compiled"} and len(first) == 3
    python = venv_elsewhere(tmp_path / "elsewhere" / "venv")
    other_cache = tmp_path / "elsewhere" / "pp4-cache"
    second = build_two(tmp_path / "elsewhere" / "checkout", python, other_cache,
                       "--store", str(tmp_path / "store-two"), "--remote-store", server.url())
    assert [(o["status"], o["tier"]) for o in second] == [("reused", "remote")] * 3
    config = json.loads((tmp_path / "elsewhere" / "checkout" / "build" / "pp4.json").read_text())
    assert config["reuse"]["relocation"]["$TORCH"].startswith(str(tmp_path / "elsewhere" / "venv"))
    assert config["reuse"]["relocation"]["$TOOLCHAIN"].startswith(str(other_cache))
    real = build_two(tmp_path / "elsewhere" / "real", python, other_cache, "--no-reuse")
    for restored, compiled in zip(second, real):
        assert restored["output"] == compiled["output"]
        a = (tmp_path / "elsewhere" / "checkout" / restored["output"]).read_bytes()
        b = (tmp_path / "elsewhere" / "real" / compiled["output"]).read_bytes()
        assert a == b, f"{restored['output']}: a restored object differs from the real compile in the same place"
    # The objects name no folder of either machine: their headers' paths are mapped (torch/include/...).
    for o in second:
        data = (tmp_path / "elsewhere" / "checkout" / o["output"]).read_bytes()
        for folder in (str(tmp_path), sys.prefix, os.path.realpath(sys.prefix)):
            assert folder.encode() not in data, (o["output"], folder)
        if o["output"].endswith("answer.cpp.o"):
            assert b"torch/include/pybind11/" in data  # pybind11's __FILE__, mapped


def test_cache_cli_reports_verifies_and_expires_the_remote(server):
    good = b"object bytes"
    good_key = "pp4:obj/" + hashlib.sha256(good).hexdigest()
    bad_key = "pp4:obj/" + hashlib.sha256(b"what it should be").hexdigest()
    server.client.set(good_key, zstd_frame(good))
    server.client.set(bad_key, zstd_frame(b"something else"))
    server.client.set("pp4:ent/" + "ab" * 32, zstd_frame(b"not json"))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "pp4.store", "remote", server.url(), *args],
                              capture_output=True, text=True)

    stats = cli("stats")
    assert stats.returncode == 0 and "objects:        2" in stats.stdout and "entry groups:   1" in stats.stdout
    check = cli("verify", "--no-repair")
    assert check.returncode == 1, check.stdout
    assert f"DAMAGE {bad_key[4:]}: its bytes do not hash to its name [left in place]" in check.stdout
    assert "not a group" in check.stdout and server.client.exists(bad_key)
    assert cli("verify").returncode == 1 and not server.client.exists(bad_key) and server.client.exists(good_key)
    assert cli("verify").returncode == 0
    expire = cli("expire", "--days", "2")
    assert expire.returncode == 0 and "1 values" in expire.stdout
    assert 0 < server.client.ttl(good_key) <= 2 * 86400
    down = subprocess.run([sys.executable, "-m", "pp4.store", "remote", "redis://127.0.0.1:1/0", "stats"],
                          capture_output=True, text=True)
    assert down.returncode == 2 and "Connection refused" in down.stderr


def test_a_group_another_pp4_wrote_in_its_own_format_is_a_quiet_miss_and_damage_is_not(tmp_path):
    """After an upgrade, a shared store is full of groups of the earlier format under the same keys:
    each reads as no entries without a warning (every build would otherwise say so once a unit),
    while a damaged group is still refused and logged."""
    from pp4.store.remote.backend import open_remote
    from pp4.store.remote.tier import GROUP_FORMAT, RemoteTier

    (tmp_path / "shared").mkdir()
    storage = open_remote(f"file://{tmp_path / 'shared'}")
    tier = RemoteTier(storage, "readwrite", tmp_path / "state")
    older, damaged = "a" * 64, "b" * 64
    older_group = {"format": GROUP_FORMAT - 1, "group": older, "sets": {}}
    storage.put(f"ent/{older}", zstd_frame(json.dumps(older_group).encode()))
    storage.put(f"ent/{damaged}", zstd_frame(b"{not json"))
    groups = tier.groups([older, damaged])
    assert groups[older].entries() == [] and groups[damaged].entries() == []
    assert tier.refused == 1
    log = (tmp_path / "state" / "remote" / "refused.log").read_text().splitlines()
    assert len(log) == 1 and f"ent/{damaged}" in log[0]
