#!/usr/bin/env python3
"""What the time-macro scan (pp4/reuse/timemacros.py) adds to the file hasher, at EXL3 scale.

Every file of a tree (default: torch's include folder, 9,500 files and 40 MB, beside EXL3's 6,369
files and 35 MB) is hashed by a FileHasher with no cache (cold: every file read, hashed and now
scanned; the page cache is warm, so this is the CPU's part), against the sha256 alone as the hasher
did it before (pp4.files.sha256_fd); then by a FileHasher that answers from a cache file by each
file's identity (warm: what a restore does; neither reads nor scans); then the question a stored
compile asks (time_macros of each sha256). Best of ROUNDS for each, as this process's CPU time, in
one process, one machine.

    python bench/build/hash_scan.py [--tree DIR] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pp4.files import sha256_fd  # noqa: E402
from pp4.reuse import actionkey  # noqa: E402
from pp4.reuse.actionkey import FileHasher  # noqa: E402


def best(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.process_time()  # this process's CPU: on a shared machine wall time swings by 2x
        fn()
        times.append(time.process_time() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if a.tree is None:
        import torch

        a.tree = Path(torch.__file__).parent / "include"
    files = [os.path.join(d, f) for d, _, fs in os.walk(a.tree) for f in fs if os.path.isfile(os.path.join(d, f))]
    size = sum(os.path.getsize(f) for f in files)

    def sha_only():
        for f in files:
            fd = os.open(f, os.O_RDONLY | os.O_CLOEXEC)
            try:
                sha256_fd(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)

    def cold():
        h = FileHasher()
        for f in files:
            h.sha256(f, os.stat(f))

    def cold_unscanned():  # the hasher as it was: the sha256 alone
        kept = actionkey._hash_and_scan
        actionkey._hash_and_scan = lambda fd, size: (sha256_fd(fd, size), "")
        try:
            cold()
        finally:
            actionkey._hash_and_scan = kept

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "hashes.json"
        h = FileHasher(cache)
        h.STAMP_SLACK_S = -1e9  # keep every file, however new
        shas = [h.sha256(f, os.stat(f)) for f in files]
        h.save()
        named = {s: h.time_macros(s) for s in shas if h.time_macros(s)}

        def warm():
            w = FileHasher(cache)
            for f in files:
                w.sha256(f, os.stat(f))

        def asked():
            w = FileHasher(cache)
            for s in shas:
                w.time_macros(s)

        result = {"tree": str(a.tree), "files": len(files), "mb": round(size / 1e6, 1),
                  "files_naming_a_time_macro": len(named),
                  "cold_sha256_only_ms": round(best(sha_only, a.rounds) * 1000, 1),
                  "cold_hasher_unscanned_ms": round(best(cold_unscanned, a.rounds) * 1000, 1),
                  "cold_hash_and_scan_ms": round(best(cold, a.rounds) * 1000, 1),
                  "warm_from_cache_ms": round(best(warm, a.rounds) * 1000, 1),
                  "time_macros_of_every_file_ms": round(best(asked, a.rounds) * 1000, 1)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
