"""Whether a provisioned toolchain prefix is complete and unmodified, from its manifest.

Imports nothing beyond the standard library, so that build.ninja's toolchain edge runs it as a
script (`python -S -I prefixcheck.py PREFIX KEY`) in a few milliseconds before every build, and
provisions (`python -m pp4.toolchain provision`) only where it finds something wrong. The fast
check stats the prefix's 2,000 files: what a stamp cannot prove, since a file edited in place
changes no folder's time.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

MANIFEST = ".pp4-toolchain.json"
MANIFEST_VERSION = 1


def _sha256_file(path: Path) -> str:
    from pp4.files import sha256_file  # the deep check runs inside pp4, never as the script

    return sha256_file(path)


def read_manifest(prefix: Path) -> dict | None:
    try:
        doc = json.loads((prefix / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("version") == MANIFEST_VERSION else None


def check_prefix(prefix: Path, key: str | None = None, deep: bool = False) -> list[str]:
    """What is wrong with a prefix; empty when it is complete and unmodified.

    The fast check compares every file's size, mode and mtime with the manifest and looks for
    files that should not be there (a stray header could shadow a real one); deep also rehashes.
    """
    manifest = read_manifest(prefix)
    if manifest is None:
        return [f"{prefix}: no valid {MANIFEST} (not provisioned, or provisioning was interrupted)"]
    if key is not None and manifest.get("key") != key:
        return [f"{prefix}: manifest key {manifest.get('key')} is not the expected {key}"]
    problems = []
    files: dict = manifest["files"]
    links: dict = manifest["links"]
    base = str(prefix) + os.sep  # plain strings: Path objects cost 3x the time over 2,000 files
    for rel, (sha, size, mode, mtime_ns) in files.items():
        p = base + rel
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            problems.append(f"{p}: missing")
            continue
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"{p}: not a regular file")
        elif st.st_size != size or stat.S_IMODE(st.st_mode) != mode or st.st_mtime_ns != mtime_ns:
            problems.append(f"{p}: size, mode or mtime differ from the manifest (modified)")
        elif deep and _sha256_file(Path(p)) != sha:
            problems.append(f"{p}: content does not hash to {sha}")
    for rel, target in links.items():
        p = base + rel
        if not os.path.islink(p) or os.readlink(p) != target:
            problems.append(f"{p}: should be a symbolic link to {target}")
    known = set(files) | set(links) | {MANIFEST}
    for dirpath, dirnames, filenames in os.walk(base):
        inside = dirpath[len(base):]
        inside = inside + os.sep if inside else ""
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            if inside + name not in known:
                problems.append(f"{base}{inside}{name}: not part of the toolchain (an extra file could shadow a header)")
    return problems


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: python -S -I prefixcheck.py PREFIX KEY", file=sys.stderr)
        sys.exit(2)
    sys.exit(1 if check_prefix(Path(sys.argv[1]), sys.argv[2]) else 0)
