"""Set packs: the observation sets of one manifest entry, kept together as one zstd frame.

A compile observes 30-1,400 folders, each an input set named by the sha256 of its canonical text
(pp4/reuse/inputsets.py). Kept one file per set, a P2P unit's 232 sets took 232 disk blocks and
the store 8.7x ccache's bytes; kept per entry and compressed they take one file of about a fifth
of their text. A pack is a hashed file (pp4/store/hashed.py): named by the sha256 of its frame, so
the store and a build's state folder share it by a hard link, and verify needs no knowledge of it.
Inside, each set is named by its own sha256; a set is used only after its bytes are checked
against that name (checked_sets), so a pack forged under a right name cannot pass one set off as
another.

    <sid> <length>\\n<the set's canonical bytes>     for each set, by name, in one zstd frame
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import attrs

from pp4.store import compressed, hashed

# The most a pack may expand to: an EXL3 unit's 1,400 headers are about 1.3 MB of text.
PACK_LIMIT = 256 * 1024 * 1024


class NotAPack(ValueError):
    """Bytes that are not a set pack (damaged or forged)."""


@attrs.frozen
class SetPack:
    """One entry's sets: name (the frame's sha256) and frame, as written to every folder that keeps it."""
    name: str
    frame: bytes


def pack(sets: dict[str, bytes]) -> SetPack:
    """The pack of these sets (name -> canonical bytes); the same sets give the same pack."""
    body = b"".join(f"{sid} {len(data)}\n".encode() + data for sid, data in sorted(sets.items()))
    frame = compressed.compress(body, compressed.SETS_LEVEL)
    return SetPack(hashlib.sha256(frame).hexdigest(), frame)


def unpack(frame: bytes) -> dict[str, bytes]:
    """The sets a pack holds, by name, NOT checked against their names (checked_sets does that).
    NotAPack when the bytes are not a pack."""
    try:
        body = compressed.decompress(frame, PACK_LIMIT)
    except compressed.NotAFrame as e:
        raise NotAPack(str(e)) from None
    sets: dict[str, bytes] = {}
    at = 0
    while at < len(body):
        end = body.find(b"\n", at, at + 100)
        try:
            sid, length = body[at:end].decode("ascii").split(" ")
            size = int(length)
        except (UnicodeDecodeError, ValueError):
            raise NotAPack(f"no set header at byte {at}") from None
        if end < 0 or len(sid) != 64 or size < 0 or end + 1 + size > len(body):
            raise NotAPack(f"a damaged set header at byte {at}")
        sets[sid] = body[end + 1:end + 1 + size]
        at = end + 1 + size
    return sets


def checked_sets(frame: bytes, known=frozenset()) -> dict[str, bytes]:
    """The sets of a pack that are not in known, each checked against its name. NotAPack when the
    bytes are not a pack or a set's bytes do not hash to its name."""
    sets = {sid: data for sid, data in unpack(frame).items() if sid not in known}
    for sid, data in sets.items():
        if hashlib.sha256(data).hexdigest() != sid:
            raise NotAPack(f"its set {sid[:16]} does not hash to its name")
    return sets


def write(folder: str | Path, found: SetPack) -> None:
    """Keep a pack in a folder (a store's, a build's state folder), unless an intact copy is there."""
    hashed.write(folder, found.name, found.frame)


def read(folder: str | Path, name: str) -> SetPack | None:
    """The pack kept under a name; None when missing or when its bytes do not hash to the name."""
    frame = hashed.read(folder, name)
    return SetPack(name, frame) if frame is not None else None


def link(folder: str | Path, found: SetPack, source_folder: str | Path) -> None:
    """Keep in folder the pack just read from source_folder: a hard link where they share a
    filesystem (one per restored object), a copy elsewhere."""
    hashed.link(folder, found.name, hashed.path_of(source_folder, found.name), found.frame)


def verify(folder: str | Path, repair: bool) -> list[tuple[str, str, bool]]:
    """Damaged packs: (path, what is wrong, removed): bytes that do not hash to the file's name, or
    a set that does not hash to its own. Removing one only turns what names it into a miss."""
    damage = hashed.verify(folder, repair)
    judged = {path for path, _, _ in damage}
    for path in sorted(hashed.named_files(folder)):
        if str(path) in judged:
            continue
        try:
            checked_sets(path.read_bytes())
        except FileNotFoundError:
            continue
        except NotAPack as e:
            if repair:
                path.unlink(missing_ok=True)
            damage.append((str(path), f"not a set pack: {e}", repair))
    return damage


def collect(folder: str | Path, keep: set[str], older_than_s: float) -> int:
    """Remove the packs nothing names (not in keep) once they are older_than_s: how many went."""
    return hashed.collect(folder, keep, older_than_s)
