#!/usr/bin/env python3
"""Configure pp4: choose the compiler, the extensions and the limits, then write build.ninja.

    python configure.py [options] && ninja

The checkout's way in, the same as `python -m pp4.configure` (which needs no checkout): this script
puts its checkout first on sys.path and runs pp4/configure/command.py's main. Top-down, one named
step after another (pp4/configure/steps.py): read the options; get the pinned toolchain (or the
--cuda-home override) and check it against torch; pick the target architectures; fold the compile
environment; choose the extensions and their compilers; plan each module's compiles; choose the
limits and the store; write the build folder's files and build.ninja, each only when its content
changes. build.ninja runs this script again, with the same options, when anything it was made of
changes: this file, pp4/plan/build.ninja.in, every pp4 module it imported, a spec, the locks.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pp4.configure.command import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], started=(str(Path(__file__).resolve()),)))
