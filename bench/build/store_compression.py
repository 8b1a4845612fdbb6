#!/usr/bin/env python3
"""What zstd's levels do to a store's own bytes: the table behind pp4/store/compressed.py's level.

    python bench/build/store_compression.py STORE [--levels 1,3,6,9,19]

For every object and every observation set in a local store (STORE/objects, STORE/setpacks: both kept
compressed, expanded here first), each level's ratio (all bytes in, all bytes out), compression speed and expansion speed (CPU time of this
process, expansion averaged over five passes), objects and sets apart.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import zstandard

from pp4.store import hashed, packs
from pp4.store.layout import SETS_FOLDER


def table(name: str, blobs: list[bytes], levels: list[int]) -> None:
    total = sum(map(len, blobs))
    print(f"{name}: {len(blobs)} files, {total / 1e6:.2f} MB")
    for level in levels:
        c = zstandard.ZstdCompressor(level=level)
        t = time.process_time()
        frames = [c.compress(b) for b in blobs]
        spent = time.process_time() - t
        d = zstandard.ZstdDecompressor()
        t = time.process_time()
        for _ in range(5):
            for f in frames:
                d.decompress(f)
        expand = (time.process_time() - t) / 5
        out = sum(map(len, frames))
        print(f"  level {level:2}: {total / out:.2f}x, compress {total / 1e6 / max(spent, 1e-9):.0f} MB/s, "
              f"expand {total / 1e6 / max(expand, 1e-9):.0f} MB/s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--levels", default="1,3,6,9,19")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    d = zstandard.ZstdDecompressor()
    objects = [d.decompress(p.read_bytes()) for p in (args.store / "objects").glob("*/*")]
    sets = [data for p in hashed.named_files(args.store / SETS_FOLDER)
            for data in packs.checked_sets(p.read_bytes()).values()]
    for name, blobs in (("objects", objects), ("observation sets", sets), ("packs (a compile's sets together)",
                        [d.decompress(p.read_bytes()) for p in hashed.named_files(args.store / SETS_FOLDER)])):
        if blobs:
            table(name, blobs, levels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
