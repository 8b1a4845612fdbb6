"""Input sets on disk: named by their content, never used when damaged, checked once per process."""

from __future__ import annotations

from pp4.reuse import inputsets
from pp4.reuse.actionkey import FileHasher


def _files(tmp_path, n=3):
    paths = []
    for i in range(n):
        p = tmp_path / "inc" / f"h{i}.h"
        p.parent.mkdir(exist_ok=True)
        p.write_text(f"#define H{i} {i}\n")
        paths.append(str(p))
    h = FileHasher()
    return [[p, h.sha256(p)] for p in paths]


def test_split_keeps_own_inputs_inline_in_order():
    inputs = [["$SRC/b.cu", "1"], ["/usr/include/x.h", "2"], ["$SRC/a.h", "3"], ["/t/torch.h", "4"]]
    own, shared = inputsets.split(inputs)
    assert own == [["$SRC/b.cu", "1"], ["$SRC/a.h", "3"]]
    assert shared == [["/usr/include/x.h", "2"], ["/t/torch.h", "4"]]


def test_name_is_the_content_hash_whatever_the_order(tmp_path):
    entries = _files(tmp_path)
    d = tmp_path / "sets"
    sid = inputsets.write(d, entries)
    assert sid == inputsets.set_id(list(reversed(entries)))
    assert inputsets.read(d, sid) == sorted(entries)
    mtime = inputsets.path_of(d, sid).stat().st_mtime_ns
    assert inputsets.write(d, entries) == sid
    assert inputsets.path_of(d, sid).stat().st_mtime_ns == mtime, "an intact set is not written again"


def test_a_damaged_set_is_never_read_and_verify_removes_it(tmp_path):
    entries = _files(tmp_path)
    d = tmp_path / "sets"
    sid = inputsets.write(d, entries)
    path = inputsets.path_of(d, sid)
    data = bytearray(path.read_bytes())
    data[10] ^= 0x01
    path.write_bytes(bytes(data))
    assert inputsets.read(d, sid) is None
    assert inputsets.verify(d, repair=False) == [(str(path), "its bytes do not hash to its name", False)]
    assert path.exists()
    assert inputsets.verify(d, repair=True)[0][2] is True
    assert not path.exists()
    assert inputsets.write(d, entries) == sid and inputsets.read(d, sid) == sorted(entries)


def test_checker_sees_a_changed_file(tmp_path):
    entries = _files(tmp_path)
    d = tmp_path / "sets"
    sid = inputsets.write(d, entries)
    assert inputsets.SetChecker(FileHasher()).matches(d, sid)
    with open(entries[1][0], "a") as f:
        f.write("// edited\n")
    assert not inputsets.SetChecker(FileHasher()).matches(d, sid)
    assert not inputsets.SetChecker(FileHasher()).matches(d, "0" * 64), "a missing set never matches"
