"""The store's manifests and compile locks: the store checks their bytes and collects its locks
without knowing what an entry means (pp4.reuse does)."""

from __future__ import annotations

import subprocess
import sys
import time

from pp4.store import hashed, manifests
from pp4.store.manifests import ManifestEntry, Manifests

MKEY = "ab" + "0" * 62


def test_verify_names_a_manifest_whose_content_changed(tmp_path):
    m = Manifests(tmp_path)
    m.add(MKEY, ManifestEntry("1" * 64, ["a" * 64]), keep=16, still_good=lambda e: True)
    assert m.read(MKEY) == [ManifestEntry("1" * 64, ("a" * 64,))]
    assert m.verify(repair=False) == []
    path = m.path(MKEY)
    doc = manifests.decode(path.read_bytes())
    doc["entries"][0]["action_key"] = "2" * 64  # still a manifest, of another action
    path.write_bytes(manifests.encode(doc))
    assert m.verify(repair=False) == [(str(path), "its content does not match its checksum", False)]
    assert path.exists()
    assert m.verify(repair=True)[0][2] is True and not path.exists()


def test_entries_are_kept_newest_last_and_filtered(tmp_path):
    m = Manifests(tmp_path)
    for i in range(5):
        m.add(MKEY, ManifestEntry(str(i), []), keep=3, still_good=lambda e: e.action_key != "1")
    m.add(MKEY, ManifestEntry("3", ["b" * 64]), keep=3, still_good=lambda e: True)  # the same action again: moved last
    assert [e.action_key for e in m.read(MKEY)] == ["2", "4", "3"]


def test_entries_that_are_not_entries_read_as_none(tmp_path):
    m = Manifests(tmp_path)
    m.add(MKEY, ManifestEntry("1" * 64, ["a" * 64]), keep=16, still_good=lambda e: True)
    doc = manifests.decode(m.path(MKEY).read_bytes())
    doc["entries"] = [{"action_key": 7, "input_sets": []}, "x", {"action_key": "2" * 64, "input_sets": "a"},
                      *doc["entries"]]
    m.path(MKEY).write_bytes(manifests.encode(doc))
    assert m.read(MKEY) == [ManifestEntry("1" * 64, ("a" * 64,))]


def test_gc_removes_only_the_locks_no_process_holds(tmp_path):
    m = Manifests(tmp_path)
    held, free = "cd" + "1" * 62, "ef" + "2" * 62
    with m.lock(free, wait=lambda: False) as waited:
        assert waited is False
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time; from pp4.store.manifests import Manifests\n"
        f"m = Manifests({str(tmp_path)!r})\n"
        f"with m.lock({held!r}, wait=lambda: False):\n"
        "    print('held', flush=True); time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with m.lock(held, wait=lambda: False) as waited:  # busy, and told not to wait
            assert waited is False
        assert m.collect_locks() == 1
        assert (m.locks / held[:2] / held).exists() and not (m.locks / free[:2] / free).exists()
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.05)
    assert m.collect_locks() == 1


def test_hashed_files_are_never_written_or_read_under_another_name(tmp_path):
    import hashlib

    data = b'[["/usr/include/x.h","00"]]'
    name = hashlib.sha256(data).hexdigest()
    hashed.write(tmp_path, name, data)
    assert hashed.read(tmp_path, name) == data
    try:
        hashed.write(tmp_path, "f" * 64, data)
        raise AssertionError("bytes written under a name they do not hash to")
    except ValueError:
        pass
    hashed.path_of(tmp_path, name).write_bytes(data + b" ")
    assert hashed.read(tmp_path, name) is None
    assert hashed.verify(tmp_path, repair=True)[0][2] is True
