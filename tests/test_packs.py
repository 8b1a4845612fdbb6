"""Set packs keep each set's canonical JSON exactly, whatever its paths and states hold, and refuse
bytes that are not a pack before anything is used."""

from __future__ import annotations

import hashlib
import json

import pytest
import zstandard

from pp4.store import packs


def canonical(pairs) -> bytes:
    """The oracle: the JSON a set is named by (sorted pairs, no spaces), written here on its own."""
    return json.dumps(sorted(pairs), separators=(",", ":"), sort_keys=True).encode()


def named(*sets) -> dict[str, bytes]:
    return {hashlib.sha256(data).hexdigest(): data for data in map(canonical, sets)}


SETS = named(
    [["/usr/include/c++/12/vector", "a" * 64], ["/usr/include/c++/12/vector", "Lf"],
     ["/usr/include/c++/12/vectors", "-"], ["/usr/include/c++/12/vex", None]],
    [["/pp4/toolchain/bin/nvcc", "0123456789abcdef" * 4 + "+x"], ["/pp4/toolchain/bin", "Ld"],
     ["/pp4/toolchain/bin/ptxas", "twins:/a\0/b|0,0"], ["/pp4/toolchain/bin/\u00e9t\u00e9", "d"]],
    [["/odd/\udcff\udcfe", "f"], ["/odd/quote\"back\\slash\nnewline", "xattr:user.x=" + "b" * 64],
     ["/odd/" + "c" * 64, "C" * 64]],  # a path of 64 hex, and a state that looks like one but is not
    [],
)


def test_every_set_comes_back_as_the_bytes_it_is_named_by() -> None:
    found = packs.pack(SETS)
    assert found.name == hashlib.sha256(found.frame).hexdigest()
    assert packs.checked_sets(found.frame) == SETS
    assert sorted(packs.names(found.frame)) == sorted(SETS)
    assert packs.pack(dict(reversed(list(SETS.items())))) == found, "the same sets give the same pack"
    some = sorted(SETS)[0]
    assert set(packs.checked_pairs(found.frame, known={some})) == set(SETS) - {some}


def test_a_set_not_in_canonical_form_is_not_packed() -> None:
    data = json.dumps([["/x", "-"]]).encode()  # spaces: not the bytes a set is named by
    with pytest.raises(ValueError, match="canonical"):
        packs.pack({hashlib.sha256(data).hexdigest(): data})


def test_bytes_that_are_not_a_pack_are_refused() -> None:
    frame = packs.pack(SETS).frame
    body = zstandard.ZstdDecompressor().decompress(frame)
    recompress = zstandard.ZstdCompressor(write_content_size=True).compress
    for bad in (b"not a frame", recompress(b"[] not a pack"), recompress(body[:-1]),
                recompress(body[:len(packs.PACK_MAGIC) + 4] + b"\xff" + body[len(packs.PACK_MAGIC) + 5:])):
        with pytest.raises(packs.NotAPack):
            packs.checked_pairs(bad)
    for bad in (b"not a frame", recompress(b"[] not a pack"), frame[:len(frame) // 2],
                recompress(body[:len(packs.PACK_MAGIC) + 40])):  # the names read from the start alone
        with pytest.raises(packs.NotAPack):
            packs.names(bad)
    # A set's bytes changed under its name: found by the set's own check.
    one = sorted(SETS)[0]
    forged = packs.pack({one: SETS[sorted(SETS)[1]]})
    with pytest.raises(packs.NotAPack, match="does not hash to its name"):
        packs.checked_pairs(forged.frame)
