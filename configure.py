#!/usr/bin/env python3
"""Configure pp4: choose the compiler, the extensions and the limits, then write build.ninja.

    python configure.py [options] && ninja

Top-down, one named step after another (pp4/configure/steps.py): read the options; get the pinned
toolchain (or the --cuda-home override) and check it against torch; pick the target
architectures; fold the compile environment; choose the extensions and their compilers; plan each
module's compiles; choose the limits and the store; write the build folder's files and build.ninja,
each only when its content changes. build.ninja runs this script again, with the same options, when
anything it was made of changes: this file, build.ninja.in, every pp4 module it imported, a spec,
the toolchain's lock.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pp4 import interrupt  # noqa: E402
from pp4.configure.options import ConfigureError  # noqa: E402
from pp4.configure.steps import main  # noqa: E402
from pp4.plan.modules import PlanError  # noqa: E402
from pp4.sources.exl3 import Exl3Error  # noqa: E402
from pp4.sources.extensions import ExtensionError  # noqa: E402
from pp4.toolchain.compat import CompatError  # noqa: E402
from pp4.toolchain.compilers import CompilerError  # noqa: E402
from pp4.toolchain.locks import LockError  # noqa: E402
from pp4.toolchain.provision import ToolchainError  # noqa: E402
from pp4.toolchain.torchenv import TorchError  # noqa: E402
from pp4.toolchain.wheelcache import WheelError  # noqa: E402

# What a user can act on: said in one line, without a traceback.
USER_ERRORS = (ConfigureError, LockError, WheelError, TorchError, ToolchainError, CompatError, CompilerError,
               ExtensionError, PlanError, Exl3Error, ValueError)

if __name__ == "__main__":
    try:
        sys.exit(interrupt.command("configure.py")(main)(sys.argv[1:]))
    except USER_ERRORS as e:
        print(f"configure.py: error: {e}", file=sys.stderr)
        sys.exit(2)
