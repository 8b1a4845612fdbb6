"""The audit hashes each file once, even when two paths name it, and still catches every changed
byte. Real files: a small build made by bench/audit_scale.py (real torch headers as inputs, objects
stored through the Reuser, certificate and pins written by pp4 itself), no compiler."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import REPO

from pp4.certify import audit
from pp4.reuse.actionkey import FileHasher

sys.path.insert(0, str(REPO / "bench"))
import audit_scale  # noqa: E402


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("audit")
    shape = audit_scale.make_build(work, units=3, nsets=2, families=1, shared_n=40, object_kib=64)
    assert shape["reused"] == 3  # every facc unit restored from its stock twin: the same bytes
    return work


def run_audit(work: Path, capsys) -> tuple[int, str]:
    rc = audit.main([str(work / "build" / "certificate.json.gz")])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_two_paths_to_one_object_are_hashed_once_and_a_change_is_caught_for_both(build, capsys):
    stock = build / "build" / "exl3" / "obj" / "unit0.cu.o"
    facc = build / "build" / "exl3-facc" / "obj" / "unit0.cu.o"
    assert stock.read_bytes() == facc.read_bytes()
    rc, out = run_audit(build, capsys)
    assert rc == 0, out
    files_before = int(out.split(" files hashed")[0].rsplit(" ", 1)[1])
    saved = facc.read_bytes()
    facc.unlink()
    os.link(stock, facc)  # one inode, two objects of the certificate
    try:
        rc, out = run_audit(build, capsys)
        assert rc == 0, out
        assert int(out.split(" files hashed")[0].rsplit(" ", 1)[1]) == files_before - 1
        with open(stock, "r+b") as f:  # changed in place, behind the audit's back: both must fail
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 1]))
        rc, out = run_audit(build, capsys)
        assert rc == 1
        assert f"{stock}: object sha256 is" in out and f"{facc}: object sha256 is" in out
    finally:
        facc.unlink()
        stock.unlink()
        stock.write_bytes(saved)
        facc.write_bytes(saved)
    rc, out = run_audit(build, capsys)
    assert rc == 0, out


def test_a_file_written_after_it_was_hashed_is_hashed_again_through_another_path(tmp_path):
    a, b = tmp_path / "a.h", tmp_path / "b.h"
    a.write_bytes(b"one\n")
    os.link(a, b)
    h = FileHasher()
    first = h.sha256(str(a))
    with open(b, "r+b") as f:
        f.write(b"two\n")
    st = os.stat(b)
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # however coarse the clock
    assert h.sha256(str(b)) != first
    assert h.files_hashed() == 2


def test_large_files_hash_as_small_ones_do(tmp_path):
    import hashlib

    from pp4.files import READ_CHUNK, sha256_file
    for size in (0, 1, READ_CHUNK - 1, READ_CHUNK, 3 * READ_CHUNK + 17):
        p = tmp_path / f"f{size}"
        data = os.urandom(size)
        p.write_bytes(data)
        assert sha256_file(p) == hashlib.sha256(data).hexdigest()
        assert FileHasher().sha256(str(p)) == hashlib.sha256(data).hexdigest()
    assert FileHasher().sha256(str(tmp_path)) is None, "a folder is not an input"
    assert json.dumps(FileHasher().sha256(str(tmp_path / "missing"))) == "null"
