"""zstd frames for what the store sends and keeps: one level, one bound on what a frame may expand to.

Level 6: on the store's own objects and observation sets it keeps 4.3x against level 1's 3.8x (what
ccache uses), at 85 MB/s (a 3 MB EXL3 object in 35 ms, next to a compile of 30-110 s), and both
decompress at over 1 GB/s (bench/build/store_compression.py gives the table for any store). A frame's
content size is in its header; a frame that would expand past the caller's bound, or is not a frame,
is refused before any memory is spent on it (a remote value can be anything).
"""

from __future__ import annotations

import zstandard

LEVEL = 6
# Observation sets (text of paths and digests) lose almost nothing at level 1: an EXL3-sized pack of
# 1.2 MB gives 279 KB at level 1 and 276 KB at level 6, in 2 ms against 11 ms. A restore from the
# remote tier packs each entry's sets, so the faster level is the one for them.
SETS_LEVEL = 1
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
