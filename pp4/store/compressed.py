"""zstd frames for what the store sends and keeps: one level, one bound on what a frame may expand to.

Level 6: on the store's own objects and observation sets it keeps 4.3x against level 1's 3.8x (what
ccache uses), at 85 MB/s (a 3 MB EXL3 object in 35 ms, next to a compile of 30-110 s), and both
decompress at over 1 GB/s (bench/build/store_compression.py gives the table for any store). A frame's
content size is in its header; a frame that would expand past the caller's bound, or is not a frame,
is refused before any memory is spent on it (a remote value can be anything).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import zstandard

LEVEL = 6
# Manifests and action records (JSON of hex names) lose almost nothing at level 1, and a manifest is
# written again by every compile of its command.
SETS_LEVEL = 1
# Set packs (pp4/store/packs.py) are compressed once, when the compile that observed them is stored,
# and travel as they are, to the remote tier and back: level 15 keeps them in 1/1.07 of level 1's
# bytes, at 18 MB/s (an EXL3 unit's 0.1-0.4 MB of columns in 5-25 ms, next to a compile of 30-110 s;
# bench/build/store_compression.py STORE gives the table).
PACK_LEVEL = 15
_compressors: dict[int, zstandard.ZstdCompressor] = {}


# The most a stored object may expand to where no record gives its size (`python -m pp4.store
# verify`, for the local store and the remote tier); a restore's bound is the size its record names.
VERIFY_OBJECT_LIMIT = 8 << 30


class NotAFrame(ValueError):
    """Bytes that are not one zstd frame within the bound (damaged, forged, or too large)."""


def compress(data: bytes, level: int = LEVEL) -> bytes:
    compressor = _compressors.get(level)
    if compressor is None:
        compressor = _compressors[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return compressor.compress(data)


@contextmanager
def reading(frame: bytes) -> Iterator:
    """A reader of a frame's content from its start (read(n)), expanding no more than is read;
    NotAFrame when the bytes are not a frame."""
    try:
        with zstandard.ZstdDecompressor().stream_reader(frame) as reader:
            yield reader
    except zstandard.ZstdError as e:
        raise NotAFrame(f"not a zstd frame ({e})") from None


def decompress(frame: bytes, limit: int) -> bytes:
    """The frame's content, at most limit bytes; NotAFrame otherwise."""
    try:
        size = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise NotAFrame(f"not a zstd frame ({e})") from None
    if size < 0 or size > limit:
        raise NotAFrame(f"a frame of {'unknown size' if size < 0 else f'{size} bytes'}, more than the {limit} expected")
    try:
        return zstandard.ZstdDecompressor().decompress(frame, max_output_size=limit)
    except zstandard.ZstdError as e:
        raise NotAFrame(f"a damaged zstd frame ({e})") from None
