"""Tests for pp4.store and its CLI, on real stores in tmp_path with real processes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import zstandard

from pp4.sizes import parse_size
from pp4.store.local import PUT_STEPS, Store, default_max_bytes, default_store_dir
from pp4.store.records import (
    ActionRecord, CorruptObject, ObjectMissing, StoreError, decode_record_file, encode_record
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def write_object(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stored(path: Path) -> bytes:
    """A stored object's content: the store keeps each as one zstd frame."""
    return zstandard.ZstdDecompressor().decompress(path.read_bytes())


def flip_byte(path: Path, offset: int) -> None:
    """Bit rot: change one byte in place (same inode), whatever the file's mode."""
    mode = stat.S_IMODE(path.stat().st_mode)
    path.chmod(mode | stat.S_IWUSR)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))
    path.chmod(mode)


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def record_files(store: Store) -> list[Path]:
    return sorted(store.root.glob("actions/*/*.json"))


def object_files(store: Store) -> list[Path]:
    return sorted(store.root.glob("objects/*/*"))


def assert_every_record_has_its_object(store: Store) -> None:
    for path in record_files(store):
        record = decode_record_file(path.read_bytes(), expected_key=path.stem)
        obj = store.object_path(record.object_sha256)
        assert obj.exists(), f"{path} names missing object {obj}"
        assert hashlib.sha256(stored(obj)).hexdigest() == record.object_sha256


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store", max_bytes=10**9)


# ---------------------------------------------------------------- basics


def test_put_lookup_materialize_roundtrip(store: Store, tmp_path: Path) -> None:
    content = os.urandom(50_000)
    source = write_object(tmp_path / "kernel.o", content)
    payload = {"command": ["nvcc", "-c", "kernel.cu"], "inputs": {"kernel.cu": "ab" * 32}, "duration_s": 12.5, "dims": (1, 2)}

    record = store.put(key("a"), source, payload)

    assert record.object_sha256 == hashlib.sha256(content).hexdigest()
    assert record.object_size == len(content)
    assert record.payload["dims"] == [1, 2]  # what lookup will read back, JSON-normalized
    assert store.lookup(key("a")) == record
    assert store.lookup(key("b")) is None

    obj = store.object_path(record.object_sha256)
    assert stat.S_IMODE(obj.stat().st_mode) == 0o444
    assert stored(obj) == content
    assert list((store.root / "tmp").iterdir()) == []

    dest = tmp_path / "build" / "kernel.o"
    dest.parent.mkdir()
    dest.write_bytes(b"stale output from an older build")
    assert store.materialize(record, dest) == dest
    assert dest.read_bytes() == content
    assert dest.stat().st_ino != obj.stat().st_ino  # the build's own file, never the store's inode
    assert list(dest.parent.iterdir()) == [dest]  # no staging file left beside dest


def test_objects_are_kept_compressed(store: Store, tmp_path: Path) -> None:
    content = b"".join(f"symbol_{i} = {i * 7};\n".encode() for i in range(20_000))  # compresses as code does
    record = store.put(key("a"), write_object(tmp_path / "a.o", content), {})
    kept = store.object_path(record.object_sha256).stat().st_size
    assert kept < len(content) / 3
    assert store.stats().bytes < len(content) / 3
    assert store.materialize(record, tmp_path / "out.o").read_bytes() == content


def test_materialize_gives_a_fresh_mtime(store: Store, tmp_path: Path) -> None:
    record = store.put(key("a"), write_object(tmp_path / "a.o", b"x" * 4096), {})
    old = 946684800  # 2000-01-01: the stored inode is old
    os.utime(store.object_path(record.object_sha256), (old, old))

    before = time.time() - 1
    out = store.materialize(record, tmp_path / "out.o")

    # ninja compares output mtimes with its inputs: a reused output must look freshly built.
    assert out.stat().st_mtime >= before
    assert out.read_bytes() == b"x" * 4096


def test_materialize_across_filesystems_copies(store: Store, tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs a second filesystem at /dev/shm")
    record = store.put(key("a"), write_object(tmp_path / "a.o", b"cross" * 1000), {})
    with tempfile.TemporaryDirectory(dir=shm) as other:
        dest = store.materialize(record, Path(other) / "a.o")  # os.link fails with EXDEV
        assert dest.read_bytes() == b"cross" * 1000
        assert dest.stat().st_nlink == 1
        assert os.listdir(other) == ["a.o"]


def test_identical_objects_are_stored_once(store: Store, tmp_path: Path) -> None:
    content = b"same bytes from two different actions" * 100
    first = store.put(key("debug"), write_object(tmp_path / "1.o", content), {"flags": "-g"})
    second = store.put(key("release"), write_object(tmp_path / "2.o", content), {"flags": "-O3"})

    assert first.object_sha256 == second.object_sha256
    stats = store.stats()
    assert (stats.entries, stats.objects) == (2, 1)
    assert len(object_files(store)) == 1

    # Evicting one action keeps the object the other still needs.
    os.utime(store.record_path(key("debug")), (1000, 1000))
    result = store.gc(max_bytes=stats.bytes - store.record_path(key("debug")).stat().st_size)
    assert (result.records_evicted, result.objects_evicted) == (1, 0)
    assert store.lookup(key("debug")) is None
    assert store.materialize(store.lookup(key("release")), tmp_path / "out.o").read_bytes() == content


def test_same_key_put_twice_last_wins(store: Store, tmp_path: Path) -> None:
    store.put(key("a"), write_object(tmp_path / "1.o", b"first"), {"n": 1})
    second = store.put(key("a"), write_object(tmp_path / "2.o", b"second"), {"n": 2})
    assert store.lookup(key("a")) == second
    assert store.verify().ok
    # The first object is now unreferenced; gc reclaims it.
    assert store.gc().orphan_objects_removed == 1


def test_put_heals_a_truncated_object(store: Store, tmp_path: Path) -> None:
    content = b"y" * 10_000
    record = store.put(key("a"), write_object(tmp_path / "a.o", content), {})
    obj = store.object_path(record.object_sha256)
    obj.chmod(0o644)
    os.truncate(obj, 10)

    store.put(key("b"), write_object(tmp_path / "b.o", content), {})
    assert stored(obj) == content
    assert store.materialize(store.lookup(key("a")), tmp_path / "out.o").read_bytes() == content


def test_bad_arguments_touch_nothing(store: Store, tmp_path: Path) -> None:
    source = write_object(tmp_path / "a.o", b"z")
    with pytest.raises(ValueError, match="action key"):
        store.put("../../etc/passwd", source, {})
    with pytest.raises(ValueError, match="action key"):
        store.lookup("ABCDEF0123456789")
    with pytest.raises(TypeError):
        store.put(key("a"), source, {"not json": object()})
    with pytest.raises(FileNotFoundError):
        store.put(key("a"), tmp_path / "missing.o", {})
    assert list((store.root / "tmp").iterdir()) == []
    assert object_files(store) == []


def test_materialize_after_object_vanished(store: Store, tmp_path: Path) -> None:
    record = store.put(key("a"), write_object(tmp_path / "a.o", b"q" * 100), {})
    store.object_path(record.object_sha256).unlink()
    with pytest.raises(ObjectMissing):
        store.materialize(record, tmp_path / "out.o")
    assert not (tmp_path / "out.o").exists()


# ---------------------------------------------------------------- corruption


def test_flipped_byte_in_object_raises_and_removes(store: Store, tmp_path: Path) -> None:
    record = store.put(key("a"), write_object(tmp_path / "a.o", os.urandom(20_000)), {})
    obj = store.object_path(record.object_sha256)
    flip_byte(obj, 12_345)
    dest = tmp_path / "out" / "a.o"
    dest.parent.mkdir()

    with pytest.raises(CorruptObject, match=f"{obj}.*corrupt"):
        store.materialize(record, dest)

    assert list(dest.parent.iterdir()) == []  # neither dest nor a staging file
    assert not obj.exists()
    assert not store.record_path(key("a")).exists()
    assert store.lookup(key("a")) is None
    assert store.verify().ok


def test_verify_reports_and_repairs_corrupt_object(store: Store, tmp_path: Path) -> None:
    good = store.put(key("good"), write_object(tmp_path / "g.o", b"g" * 5000), {})
    bad = store.put(key("bad"), write_object(tmp_path / "b.o", b"b" * 5000), {})
    bad_object = store.object_path(bad.object_sha256)
    flip_byte(bad_object, 0)

    report = store.verify(repair=False)
    assert not report.ok
    kinds = {(Path(d.path), d.kind) for d in report.damage}
    assert kinds == {(bad_object, "object-hash-mismatch"), (store.record_path(key("bad")), "record-object-corrupt")}
    assert not any(d.repaired for d in report.damage)
    assert bad_object.exists()

    report = store.verify()
    assert all(d.repaired for d in report.damage) and len(report.damage) == 2
    assert not bad_object.exists()
    assert store.lookup(key("bad")) is None
    assert store.lookup(key("good")) == good
    assert store.verify().ok


def test_flipped_byte_in_record_is_a_miss(store: Store, tmp_path: Path) -> None:
    store.put(key("a"), write_object(tmp_path / "a.o", b"a" * 100), {"command": "nvcc -c kernel.cu"})
    path = store.record_path(key("a"))
    text = bytearray(encode_record(store.lookup(key("a"))))
    text[text.index(b"kernel.cu")] ^= 0x01  # still valid JSON, in a valid frame: only the checksum can tell
    path.chmod(0o644)
    path.write_bytes(zstandard.ZstdCompressor().compress(bytes(text)))

    assert store.lookup(key("a")) is None

    report = store.verify(repair=False)
    assert [(Path(d.path), d.kind) for d in report.damage] == [(path, "record-invalid")]
    assert "checksum mismatch" in report.damage[0].detail
    assert path.exists()

    assert not store.verify().ok
    assert not path.exists()
    assert store.verify().ok
    assert report.orphan_objects == 1  # its object is now unreferenced; gc will take it


def test_truncated_record_is_a_miss(store: Store, tmp_path: Path) -> None:
    store.put(key("a"), write_object(tmp_path / "a.o", b"a"), {})
    path = store.record_path(key("a"))
    path.chmod(0o644)
    os.truncate(path, 40)
    assert store.lookup(key("a")) is None
    assert "not a record file" in store.verify().damage[0].detail


# ---------------------------------------------------------------- eviction


def test_gc_evicts_least_recently_used_first(store: Store, tmp_path: Path) -> None:
    keys = [key(f"entry{i}") for i in range(5)]
    for i, k in enumerate(keys):
        store.put(k, write_object(tmp_path / f"{i}.o", bytes([i]) * 10_000), {"i": i})
    now = time.time()
    for i, k in enumerate(keys):
        os.utime(store.record_path(k), (now - 1000 + 10 * i, now - 1000 + 10 * i))
    assert store.lookup(keys[0]) is not None  # a hit makes the oldest the most recent

    def entry_bytes(k: str) -> int:
        record = store.lookup(k)
        return store.record_path(k).stat().st_size + store.object_path(record.object_sha256).stat().st_size

    target = store.stats().bytes - entry_bytes(keys[1]) - entry_bytes(keys[2])
    for k in keys:  # entry_bytes' lookups made every record recent again
        os.utime(store.record_path(k), (now - 1000 + 10 * keys.index(k), now - 1000 + 10 * keys.index(k)))
    os.utime(store.record_path(keys[0]), (now, now))
    result = store.gc(max_bytes=target)

    assert (result.records_evicted, result.objects_evicted) == (2, 2)
    assert result.bytes_after == target == store.stats().bytes
    assert [store.lookup(k) is not None for k in keys] == [True, False, False, True, True]
    assert store.verify().ok


def test_gc_collects_the_manifest_entries_and_set_packs_of_evicted_actions(store: Store, tmp_path: Path) -> None:
    """Manifests and set packs are bounded with the records they serve: an evicted action's entries
    go, a manifest left empty goes, a pack no remaining entry names goes once it is an hour old (a
    writer names a pack only after writing it), and what a live entry names stays."""
    from pp4.store import hashed, packs
    from pp4.store.manifests import ManifestEntry, Manifests

    sets, names = {}, {}
    for name in ("shared", "old-only", "young-only"):
        data = json.dumps([[f"/usr/include/{name}.h", "0" * 64]], separators=(",", ":")).encode()
        sets[name] = hashlib.sha256(data).hexdigest()
        pack = packs.pack({sets[name]: data})
        packs.write(store.root / "setpacks", pack)
        names[name] = pack.name
    keys = [key(f"gc{i}") for i in range(3)]
    for i, k in enumerate(keys):
        store.put(k, write_object(tmp_path / f"{i}.o", bytes([i]) * 10_000), {})
        os.utime(store.record_path(k), (1000 + i, 1000 + i))  # keys[0] is the least recently used
    manifests = Manifests(store.root)
    m_evicted, m_mixed = "a" * 64, "b" * 64
    manifests.add(m_evicted, ManifestEntry(keys[0], [sets["old-only"]], names["old-only"]), 8, lambda e: True)
    manifests.add(m_mixed, ManifestEntry(keys[0], [sets["young-only"]], names["young-only"]), 8, lambda e: True)
    manifests.add(m_mixed, ManifestEntry(keys[1], [sets["shared"]], names["shared"]), 8, lambda e: True)
    hour_ago = time.time() - 7200
    for name in ("shared", "old-only"):
        os.utime(hashed.path_of(store.root / "setpacks", names[name]), (hour_ago, hour_ago))

    result = store.gc(max_bytes=store.stats().bytes - 1)  # evicts keys[0] alone

    assert (result.records_evicted, result.manifest_entries_removed, result.manifests_removed) == (1, 2, 1)
    assert not manifests.path(m_evicted).exists()
    assert [e.action_key for e in manifests.read(m_mixed)] == [keys[1]]
    assert result.input_sets_removed == 1, "only the hour-old pack no entry names"
    assert packs.read(store.root / "setpacks", names["old-only"]) is None
    assert packs.read(store.root / "setpacks", names["shared"]) is not None, "a live entry names it"
    assert packs.read(store.root / "setpacks", names["young-only"]) is not None, "young: its writer may name it yet"
    assert manifests.verify(repair=False) == []


def test_put_evicts_when_over_bound(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", max_bytes=50_000)
    keys = [key(f"k{i}") for i in range(12)]
    for i, k in enumerate(keys):
        store.put(k, write_object(tmp_path / f"{i}.o", os.urandom(10_000)), {})
        os.utime(store.record_path(k), (1000 + i, 1000 + i))  # strict put order, whatever the clock resolution
    assert store.stats().bytes <= 50_000
    assert store.lookup(keys[-1]) is not None
    assert store.lookup(keys[0]) is None
    assert store.verify().ok


def test_gc_removes_stale_tmp_and_orphans(store: Store, tmp_path: Path) -> None:
    store.put(key("a"), write_object(tmp_path / "a.o", b"a" * 100), {})
    stale = store.root / "tmp" / "12345-deadbeef.obj"
    fresh = store.root / "tmp" / "12346-deadbeef.obj"
    stale.write_bytes(b"partial")
    fresh.write_bytes(b"in progress")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    orphan = store.object_path("ff" * 32)
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(b"nobody references me")

    result = store.gc()
    assert (result.tmp_files_removed, result.orphan_objects_removed, result.records_evicted) == (1, 1, 0)
    assert not stale.exists() and fresh.exists() and not orphan.exists()
    assert store.lookup(key("a")) is not None


# ---------------------------------------------------------------- concurrency and crashes

CONCURRENT_WORKER = textwrap.dedent(
    """
    import hashlib, os, sys, time
    from pathlib import Path
    from pp4.store.local import Store
    from pp4.store.records import CorruptObject, ObjectMissing

    root, worker, bound, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    store = Store(root, max_bytes=bound)
    scratch = Path(root).parent / f"scratch-{worker}"
    scratch.mkdir()
    while not go.exists():
        time.sleep(0.001)
    for i in range(60):
        kind = ("same-key-same-bytes", "same-key-own-bytes", "own-key")[i % 3]
        k = hashlib.sha256(f"{kind}-{i}-{worker if kind == 'own-key' else ''}".encode()).hexdigest()
        content = (f"{kind} {i} " + (str(worker) if kind != "same-key-same-bytes" else "")).encode() * 500
        source = scratch / "src.o"
        source.write_bytes(content)
        store.put(k, source, {"worker": worker, "i": i})
        record = store.lookup(k)
        if record is not None:
            try:
                out = store.materialize(record, scratch / "out.o")
                assert hashlib.sha256(out.read_bytes()).hexdigest() == record.object_sha256
                out.unlink()
            except ObjectMissing:
                pass  # evicted by another worker between lookup and materialize: a miss
    print("done")
    """
)


@pytest.mark.parametrize("bound", [10**9, 60_000], ids=["roomy", "evicting"])
def test_concurrent_puts_from_four_processes(tmp_path: Path, bound: int) -> None:
    root = tmp_path / "store"
    Store(root)
    go = tmp_path / "go"
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT_WORKER, str(root), str(n), str(bound), str(go)],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    time.sleep(0.3)  # let them all import and reach the start line
    go.touch()
    for worker in workers:
        out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        assert out.strip() == "done"

    store = Store(root, max_bytes=bound)
    assert_every_record_has_its_object(store)
    report = store.verify(repair=False)
    assert report.ok, report.damage
    assert list((root / "tmp").iterdir()) == []
    if bound == 10**9:
        # 20 shared-same + 20 shared-own + 4 * 20 own keys, none lost.
        assert store.stats().entries == 120
        for i in range(1, 60, 3):  # same key, different bytes per worker: one complete winner
            record = store.lookup(key(f"same-key-own-bytes-{i}-"))
            assert record is not None and record.payload["worker"] in range(4)
            data = store.materialize(record, tmp_path / "check.o").read_bytes()
            assert data == f"same-key-own-bytes {i} {record.payload['worker']}".encode() * 500
    else:
        assert store.stats().bytes <= bound * 1.5  # automatic eviction kept up, give or take in-flight puts


PUT_ONE = textwrap.dedent(
    """
    import sys
    from pp4.store.local import Store
    Store(sys.argv[1]).put(sys.argv[2], sys.argv[3], {"command": "nvcc -c k.cu"})
    """
)


@pytest.mark.parametrize("step", PUT_STEPS)
def test_sigkill_during_put_leaves_no_broken_entry(tmp_path: Path, step: str) -> None:
    root = tmp_path / "store"
    Store(root)
    content = os.urandom(30_000)
    source = write_object(tmp_path / "k.o", content)
    marker = tmp_path / "paused"
    child = subprocess.Popen(
        [sys.executable, "-c", PUT_ONE, str(root), key("k"), str(source)],
        env=child_env(PP4_STORE_TEST_PAUSE=step, PP4_STORE_TEST_PAUSE_MARKER=str(marker)),
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 20
    while not marker.exists():
        assert child.poll() is None, child.stderr.read()
        assert time.monotonic() < deadline, "child never reached the pause point"
        time.sleep(0.005)
    assert int(marker.read_text()) == child.pid
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL

    store = Store(root)
    assert_every_record_has_its_object(store)
    expect_visible = step == "record-placed"
    assert (store.lookup(key("k")) is not None) == expect_visible
    report = store.verify(repair=False)
    assert report.ok, report.damage
    assert report.orphan_objects == (1 if step in ("object-placed", "record-tmp-written") else 0)

    # The killed put may have held the shared lock; the kernel released it, so gc must not hang.
    for leftover in (root / "tmp").iterdir():
        os.utime(leftover, (time.time() - 7200, time.time() - 7200))
    gc = subprocess.run(
        [sys.executable, "-m", "pp4.store", "--store", str(root), "gc"], env=child_env(), capture_output=True, text=True, timeout=20
    )
    assert gc.returncode == 0, gc.stderr
    assert list((root / "tmp").iterdir()) == []
    assert len(object_files(store)) == (1 if expect_visible else 0)

    record = store.put(key("k"), source, {"command": "nvcc -c k.cu"})
    assert store.materialize(record, tmp_path / "out.o").read_bytes() == content
    assert store.verify().ok


# ---------------------------------------------------------------- unwritable and full filesystems


def _namespaces_available() -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = subprocess.run(["unshare", "-Urm", "true"], capture_output=True)
    return probe.returncode == 0


needs_namespaces = pytest.mark.skipif(
    not _namespaces_available(), reason="needs unprivileged user+mount namespaces (unshare -Urm) for a real tmpfs"
)


def run_on_private_tmpfs(tmp_path: Path, size: str, body: str) -> dict:
    """Run python `body` in a private mount namespace with a fresh tmpfs at MNT; returns its printed JSON."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = textwrap.dedent(
        f"""
        import json, os, subprocess, sys
        from pathlib import Path
        from pp4.store.local import Store
        from pp4.store.records import StoreError
        MNT = Path({str(mnt)!r})
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size={size}", "tmpfs", str(MNT)], check=True)
        def remount_read_only():
            # The per-mount flag (bind): unprivileged namespaces may set it, though not remount the tmpfs itself.
            subprocess.run(["mount", "-o", "remount,bind,ro", str(MNT)], check=True)
        result = {{}}
        """
    ) + textwrap.dedent(body) + "\nprint(json.dumps(result))\n"
    proc = subprocess.run(["unshare", "-Urm", sys.executable, "-c", script], env=child_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_namespaces
def test_read_only_filesystem_gives_clear_store_error(tmp_path: Path) -> None:
    source = write_object(tmp_path / "a.o", b"a" * 1000)
    result = run_on_private_tmpfs(
        tmp_path,
        "1m",
        f"""
        store = Store(MNT / "store")
        store.put({key("a")!r}, {str(source)!r}, {{}})
        remount_read_only()
        store = Store(MNT / "store")  # an existing store still serves hits when read-only
        result["lookup_ok"] = store.lookup({key("a")!r}) is not None
        try:
            store.put({key("b")!r}, {str(source)!r}, {{}})
        except StoreError as exc:
            result["put_error"] = str(exc)
        try:
            Store(MNT / "fresh")
        except StoreError as exc:
            result["create_error"] = str(exc)
        """,
    )
    mnt = tmp_path / "mnt"
    assert result["lookup_ok"]
    for message, directory in ((result["put_error"], mnt / "store"), (result["create_error"], mnt / "fresh")):
        assert str(directory) in message
        assert "not writable" in message
        assert "re-run configure with --store DIR (or, without --store, set PP4_STORE_DIR)" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions; the tmpfs test covers this")
def test_unwritable_directory_gives_clear_store_error(tmp_path: Path) -> None:
    parent = tmp_path / "locked"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        with pytest.raises(StoreError, match=r"not writable.*PP4_STORE_DIR") as info:
            Store(parent / "store")
        assert str(parent / "store") in str(info.value)
    finally:
        parent.chmod(0o755)


@needs_namespaces
def test_full_disk_cleans_up_and_says_so(tmp_path: Path) -> None:
    big = write_object(tmp_path / "big.o", os.urandom(1024 * 1024))
    small = write_object(tmp_path / "small.o", b"s" * 1000)
    result = run_on_private_tmpfs(
        tmp_path,
        "256k",
        f"""
        store = Store(MNT / "store")
        try:
            store.put({key("big")!r}, {str(big)!r}, {{}})
        except StoreError as exc:
            result["error"] = str(exc)
        result["tmp_after"] = os.listdir(MNT / "store" / "tmp")
        result["objects_after"] = [str(p) for p in (MNT / "store" / "objects").rglob("*") if p.is_file()]
        result["records_after"] = [str(p) for p in (MNT / "store" / "actions").rglob("*") if p.is_file()]
        store.put({key("small")!r}, {str(small)!r}, {{}})  # still usable once the big put failed
        result["small_ok"] = store.lookup({key("small")!r}) is not None
        result["verify_ok"] = store.verify().ok
        """,
    )
    assert "disk full" in result["error"]
    assert str(tmp_path / "mnt" / "store") in result["error"]
    assert result["tmp_after"] == [] and result["objects_after"] == [] and result["records_after"] == []
    assert result["small_ok"] and result["verify_ok"]


# ---------------------------------------------------------------- configuration


def test_default_store_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("PP4_STORE_DIR", "PP4_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_store_dir() == tmp_path / "home" / ".cache" / "pp4" / "store"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_store_dir() == tmp_path / "xdg" / "pp4" / "store"
    monkeypatch.setenv("PP4_CACHE_DIR", str(tmp_path / "pp4cache"))
    assert default_store_dir() == tmp_path / "pp4cache" / "store"
    monkeypatch.setenv("PP4_STORE_DIR", str(tmp_path / "explicit"))
    assert default_store_dir() == tmp_path / "explicit"


def test_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_size("1048576") == 1048576
    assert parse_size("512K") == 512 * 1024
    assert parse_size("10G") == 10 * 1024**3
    assert parse_size("1.5GiB") == int(1.5 * 1024**3)
    assert parse_size("2t") == 2 * 1024**4
    with pytest.raises(ValueError, match="10X"):
        parse_size("10X")
    monkeypatch.delenv("PP4_STORE_MAX_BYTES", raising=False)
    assert default_max_bytes() == 20 * 1024**3
    monkeypatch.setenv("PP4_STORE_MAX_BYTES", "3G")
    assert default_max_bytes() == 3 * 1024**3
    monkeypatch.setenv("PP4_STORE_MAX_BYTES", "lots")
    with pytest.raises(StoreError, match="PP4_STORE_MAX_BYTES"):
        default_max_bytes()


def test_store_path_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "store").write_text("oops")
    with pytest.raises(StoreError, match="not a directory"):
        Store(tmp_path / "store")


def test_record_is_frozen_and_hashable(store: Store, tmp_path: Path) -> None:
    record = store.put(key("a"), write_object(tmp_path / "a.o", b"a"), {"x": 1})
    assert isinstance(record, ActionRecord)
    with pytest.raises(AttributeError):
        record.object_size = 2  # type: ignore[misc]
    assert hash(record) == hash(store.lookup(key("a")))


# ---------------------------------------------------------------- CLI


def cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pp4.store", "--store", str(root), *args],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_cli_stats_gc_verify(store: Store, tmp_path: Path) -> None:
    b = os.urandom(3000)
    first = store.put(key("a"), write_object(tmp_path / "a.o", os.urandom(3000)), {})
    store.put(key("b"), write_object(tmp_path / "b.o", b), {})
    store.put(key("c"), write_object(tmp_path / "c.o", b), {})

    stats = cli(store.root, "stats")
    assert stats.returncode == 0, stats.stderr
    assert f"store:    {store.root}" in stats.stdout
    assert "entries:  3 action records" in stats.stdout
    assert "objects:  2 distinct objects" in stats.stdout
    assert f"({store.stats().bytes} bytes)" in stats.stdout

    clean = cli(store.root, "verify")
    assert clean.returncode == 0
    assert "checked 2 objects and 3 records" in clean.stdout and "no damage found" in clean.stdout

    bad_object = store.object_path(first.object_sha256)
    flip_byte(bad_object, 7)
    report_only = cli(store.root, "verify", "--no-repair")
    assert report_only.returncode == 1
    assert f"DAMAGE object-hash-mismatch: {bad_object}" in report_only.stdout
    assert "left in place" in report_only.stdout and bad_object.exists()

    repaired = cli(store.root, "verify")
    assert repaired.returncode == 1
    assert "found and removed" in repaired.stdout and not bad_object.exists()
    assert cli(store.root, "verify").returncode == 0

    gc = cli(store.root, "gc", "--max-bytes", "1K")
    assert gc.returncode == 0, gc.stderr
    assert "evicted 2 least-recently-used action records and 1 object" in gc.stdout
    assert "entries:  0 action records" in cli(store.root, "stats").stdout


def test_cli_errors(tmp_path: Path) -> None:
    missing = cli(tmp_path / "nowhere", "stats")
    assert missing.returncode == 0 and "no store at" in missing.stdout
    assert not (tmp_path / "nowhere").exists()

    Store(tmp_path / "store")
    bad_size = cli(tmp_path / "store", "gc", "--max-bytes", "10X")
    assert bad_size.returncode == 2 and "not a size" in bad_size.stderr

    (tmp_path / "file").write_text("x")
    not_dir = cli(tmp_path / "file", "stats")
    assert not_dir.returncode == 2 and "not a directory" in not_dir.stderr


def test_a_store_of_the_earlier_layout_is_refused_with_what_to_do(tmp_path: Path) -> None:
    """A store written by an earlier pp4 kept objects uncompressed: read as frames they would all be
    damage, and every lookup would remove an entry. It is refused whole, with the way out."""
    old = tmp_path / "old"
    (old / "objects" / "ab").mkdir(parents=True)
    (old / "objects" / "ab" / ("ab" + "0" * 62)).write_bytes(b"\x7fELF uncompressed")
    with pytest.raises(StoreError, match=r"layout 1.*remove it .*rm -r .*or use another store"):
        Store(old)
    assert cli(old, "stats").returncode != 0
    assert (old / "objects" / "ab" / ("ab" + "0" * 62)).exists(), "nothing is removed"

    fresh = Store(tmp_path / "new")
    assert (fresh.root / "format").read_text() == "3\n"
    (fresh.root / "format").write_text("2\n")
    with pytest.raises(StoreError, match="layout 2, and this pp4 reads layout 3"):
        Store(fresh.root)
