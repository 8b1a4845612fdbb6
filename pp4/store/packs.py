"""Set packs: the observation sets of one manifest entry, kept together as one zstd frame.

A compile observes 30-1,400 folders, each an input set: sorted (path, state) pairs, named by the
sha256 of their canonical JSON (pp4/reuse/inputsets.py). Kept one file per set, a P2P unit's 232
sets took 232 disk blocks; kept per entry, they take one file. A pack is a hashed file
(pp4/store/hashed.py): named by the sha256 of its frame, so the store and a build's state folder
share it by a hard link, and verify needs no knowledge of it. Inside, each set is named by its own
sha256, and a set is used only after the canonical JSON its pairs give hashes to that name
(checked_pairs), so a pack forged under a right name cannot pass one set off as another.

The frame holds the sets in columns, not as their JSON: a path is written as what it shares with
the one before it in its set and what it adds, a file's sha256 as 32 bytes, and the states most
paths have ("-" absent, "Lf" a file not followed) as one byte. An EXL3 unit's pack is about 1/1.3
of its JSON's frame and an EXL3 unit's 5,000 pairs decode in about 4 ms.

    PACK_MAGIC, then 9 little-endian uint32 column lengths, then the columns:
    sids        32 bytes per set, by name
    counts      uint32 per set: its pairs
    shared      uint32 per pair: characters its path shares with the previous path of its set
    added       uint32 per pair: characters it adds
    suffixes    those added characters (UTF-8, surrogates passed)
    tags        1 byte per pair: how its state is kept (TAG_*)
    digests     32 bytes per TAG_DIGEST or TAG_EXECUTABLE state
    text_sizes  uint32 per TAG_TEXT state
    texts       those states' bytes
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from array import array
from pathlib import Path

import attrs

from pp4.files import canonical_json
from pp4.store import compressed, hashed

# The most a pack may expand to: an EXL3 unit's 1,400 headers are about 0.4 MB of columns.
PACK_LIMIT = 256 * 1024 * 1024
PACK_MAGIC = b"pp4 setpack 2\n"
COLUMNS = 9
_HEAD = struct.Struct("<%dI" % COLUMNS)
# How a state is kept. A file's state is its sha256 in hex (pathstates: with "+x" when it may be run).
TAG_NULL, TAG_DIGEST, TAG_EXECUTABLE, TAG_TEXT = 0, 1, 2, 3
COMMON_STATES = ("-", "Lf", "Ld", "d", "f")  # tags 4.. : one byte for the states most paths have
_COMMON_TAG = {state: 4 + i for i, state in enumerate(COMMON_STATES)}
_HEX = frozenset("0123456789abcdef")
EXECUTABLE = "+x"
_NO_STATE = object()  # a tag whose state is not the same for every pair (digests, texts)


class NotAPack(ValueError):
    """Bytes that are not a set pack (damaged or forged)."""


@attrs.frozen
class SetPack:
    """One entry's sets: name (the frame's sha256) and frame, as written to every folder that keeps it."""
    name: str
    frame: bytes


def _uint32s(values) -> bytes:
    column = array("I", values)
    if sys.byteorder != "little":
        column.byteswap()
    return column.tobytes()


def _read_uint32s(data: bytes) -> array:
    if len(data) % 4:
        raise NotAPack("a column of uint32 with a partial value")
    column = array("I")
    column.frombytes(data)
    if sys.byteorder != "little":
        column.byteswap()
    return column


def _is_digest(text: str) -> bool:
    return len(text) == 64 and _HEX.issuperset(text)


def pack(sets: dict[str, bytes]) -> SetPack:
    """The pack of these sets (name -> canonical bytes); the same sets give the same pack.
    ValueError when a set's bytes are not the canonical JSON of (path, state) pairs."""
    sids, counts, shared, added, tag_column, text_sizes = bytearray(), [], [], [], bytearray(), []
    suffixes, digests, texts = [], [], []
    for sid, data in sorted(sets.items()):
        pairs = json.loads(data)
        if canonical_json(pairs) != data:
            raise ValueError(f"set {sid[:16]} is not in canonical form")
        sids += bytes.fromhex(sid)
        counts.append(len(pairs))
        previous = ""
        for path, state in pairs:
            common, most = 0, min(len(path), len(previous))
            while common < most and path[common] == previous[common]:
                common += 1
            shared.append(common)
            added.append(len(path) - common)
            suffixes.append(path[common:])
            previous = path
            if state is None:
                tag_column.append(TAG_NULL)
            elif state in _COMMON_TAG:
                tag_column.append(_COMMON_TAG[state])
            elif _is_digest(state):
                tag_column.append(TAG_DIGEST)
                digests.append(bytes.fromhex(state))
            elif state.endswith(EXECUTABLE) and _is_digest(state[:-len(EXECUTABLE)]):
                tag_column.append(TAG_EXECUTABLE)
                digests.append(bytes.fromhex(state[:-len(EXECUTABLE)]))
            else:
                tag_column.append(TAG_TEXT)
                texts.append(state.encode("utf-8", "surrogatepass"))
                text_sizes.append(len(texts[-1]))
    columns = [bytes(sids), _uint32s(counts), _uint32s(shared), _uint32s(added),
               "".join(suffixes).encode("utf-8", "surrogatepass"),
               bytes(tag_column), b"".join(digests), _uint32s(text_sizes), b"".join(texts)]
    body = PACK_MAGIC + _HEAD.pack(*map(len, columns)) + b"".join(columns)
    frame = compressed.compress(body, compressed.PACK_LEVEL)
    return SetPack(hashlib.sha256(frame).hexdigest(), frame)


def _columns(frame: bytes) -> list[bytes]:
    try:
        body = compressed.decompress(frame, PACK_LIMIT)
    except compressed.NotAFrame as e:
        raise NotAPack(str(e)) from None
    if not body.startswith(PACK_MAGIC) or len(body) < len(PACK_MAGIC) + _HEAD.size:
        raise NotAPack("not a set pack of this layout")
    sizes = _HEAD.unpack_from(body, len(PACK_MAGIC))
    at = len(PACK_MAGIC) + _HEAD.size
    if at + sum(sizes) != len(body):
        raise NotAPack("its columns do not fill it")
    columns = []
    for size in sizes:
        columns.append(body[at:at + size])
        at += size
    return columns


def names(frame: bytes) -> list[str]:
    """The names of the sets a pack holds, NOT checked, from the start of its content alone (a
    manifest's lookup reads them for every entry; the sets are expanded where they are used).
    NotAPack when the bytes are not a pack."""
    try:
        with compressed.reading(frame) as reader:
            found = reader.read(len(PACK_MAGIC) + _HEAD.size)
            if not found.startswith(PACK_MAGIC) or len(found) < len(PACK_MAGIC) + _HEAD.size:
                raise NotAPack("not a set pack of this layout")
            size = _HEAD.unpack_from(found, len(PACK_MAGIC))[0]
            if size % 32 or size > PACK_LIMIT:
                raise NotAPack("a damaged list of set names")
            sids = reader.read(size)
    except compressed.NotAFrame as e:
        raise NotAPack(str(e)) from None
    if len(sids) != size:
        raise NotAPack("a damaged list of set names")
    return [sids[i:i + 32].hex() for i in range(0, len(sids), 32)]


def _decode(frame: bytes, known) -> dict[str, list[list]]:
    """The pairs of each set not in known, NOT checked against their names (a pack whose columns
    say something else than its sets' names gives pairs that do not hash to them)."""
    sid_column, count_bytes, shared_bytes, added_bytes, suffix_bytes, tags, digest_bytes, size_bytes, text_bytes \
        = _columns(frame)
    counts, shared, added = _read_uint32s(count_bytes), _read_uint32s(shared_bytes), _read_uint32s(added_bytes)
    text_sizes = _read_uint32s(size_bytes)
    try:
        suffixes = suffix_bytes.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise NotAPack("a path or state that is not UTF-8") from None
    digests = digest_bytes.hex()
    pairs_in_all = len(tags)
    if (len(sid_column) != 32 * len(counts) or sum(counts) != pairs_in_all or len(shared) != pairs_in_all
            or len(added) != pairs_in_all or sum(added) != len(suffixes) or sum(text_sizes) != len(text_bytes)
            or len(digest_bytes) % 32):
        raise NotAPack("its columns disagree on how many sets and pairs it holds")
    by_tag: list = [_NO_STATE] * 256  # the state of each one-byte tag
    by_tag[TAG_NULL] = None
    for state, tag in _COMMON_TAG.items():
        by_tag[tag] = state
    found: dict[str, list[list]] = {}
    pair = at = digest_at = text_at = text_index = 0
    for index, count in enumerate(counts):
        sid = sid_column[32 * index:32 * index + 32].hex()
        end = pair + count
        if sid in known:  # skipped: only the columns that vary per pair need walking
            at += sum(added[pair:end])
            for tag in tags[pair:end]:
                if tag == TAG_DIGEST or tag == TAG_EXECUTABLE:
                    digest_at += 64
                elif tag == TAG_TEXT:
                    text_at += text_sizes[text_index]
                    text_index += 1
            pair = end
            continue
        pairs, previous = [], ""
        for common, size, tag in zip(shared[pair:end], added[pair:end], tags[pair:end]):
            previous = previous[:common] + suffixes[at:at + size]
            at += size
            state = by_tag[tag]
            if state is _NO_STATE:
                if tag == TAG_DIGEST or tag == TAG_EXECUTABLE:
                    state = digests[digest_at:digest_at + 64] + (EXECUTABLE if tag == TAG_EXECUTABLE else "")
                    digest_at += 64
                elif tag == TAG_TEXT and text_index < len(text_sizes):
                    state = text_bytes[text_at:text_at + text_sizes[text_index]].decode("utf-8", "surrogatepass")
                    text_at += text_sizes[text_index]
                    text_index += 1
                else:
                    raise NotAPack(f"a state of unknown kind {tag}, or more texts than it holds")
            pairs.append([previous, state])
        found[sid] = pairs
        pair = end
    if digest_at != len(digests) or text_index != len(text_sizes):
        raise NotAPack("more or fewer digests or texts than its states name")
    return found


def checked_pairs(frame: bytes, known=frozenset()) -> dict[str, list[list]]:
    """The (path, state) pairs of each set of a pack that is not in known, each set checked: the
    canonical JSON of its pairs hashes to its name. NotAPack when the bytes are not a pack or a
    set does not hash to its name."""
    try:
        found = _decode(frame, known)
    except UnicodeDecodeError:
        raise NotAPack("a state that is not UTF-8") from None
    for sid, pairs in found.items():
        if hashlib.sha256(canonical_json(pairs)).hexdigest() != sid:
            raise NotAPack(f"its set {sid[:16]} does not hash to its name")
    return found


def checked_sets(frame: bytes, known=frozenset()) -> dict[str, bytes]:
    """As checked_pairs, each set as its canonical bytes (what inputsets names it by)."""
    return {sid: canonical_json(pairs) for sid, pairs in checked_pairs(frame, known).items()}


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
