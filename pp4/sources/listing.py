"""The names in the folders a setup.py's sources sit in, kept as one stamp file.

A setup.py often finds its sources by glob, so a file added to or removed from such a folder must
make ninja read the setup.py again. The folders' mtimes say too much: build.ninja, the build
folder, `ninja wheel`'s dist/, setuptools' egg-info or a log written beside the sources change
them too, and each change would cost a configure (the setup.py's run, with torch's import) at the
next ninja. This stamp's content is the names; its edge has restat, so configure runs only when a
name came or went, apart from the ones pp4, ninja and setuptools write (IGNORED and --ignore).

    python -m pp4.sources.listing STAMP [--ignore NAME]... FOLDER...
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
from pathlib import Path

from pp4.files import write_if_changed

# Written beside a project's sources by pp4 (build.ninja, `ninja compdb`), ninja (its log when the
# build folder is the project's) and a setup.py's run (bytecode, egg-info): never sources.
IGNORED = ("build.ninja", "compile_commands.json", ".ninja_log", ".ninja_deps", "__pycache__", "*.egg-info")


def names(folders, ignore=()) -> dict[str, list[str] | None]:
    """Each folder's names, sorted, without the ignored ones; None for a folder that is not there."""
    patterns = (*IGNORED, *ignore)
    listing: dict[str, list[str] | None] = {}
    for folder in folders:
        try:
            entries = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            listing[str(folder)] = None
            continue
        listing[str(folder)] = sorted(n for n in entries if not any(fnmatch.fnmatchcase(n, p) for p in patterns))
    return listing


def write(stamp: Path, folders, ignore=()) -> bool:
    """The stamp for these folders as they are now; True when its content changed."""
    return write_if_changed(Path(stamp), json.dumps(names(folders, ignore), indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pp4.sources.listing", description=__doc__.split("\n\n")[0])
    ap.add_argument("stamp", type=Path)
    ap.add_argument("folders", nargs="*")
    ap.add_argument("--ignore", action="append", default=[], metavar="NAME",
                    help="a name (or fnmatch pattern) that is not a source, e.g. the wheels' folder")
    args = ap.parse_intermixed_args(argv)
    write(args.stamp, args.folders, args.ignore)
    return 0


if __name__ == "__main__":
    sys.exit(main())
