"""configure as a command: its steps run (pp4/configure/steps.py), and what a user can act on said in
one line, without a traceback. Both ways of starting it come here: `python -m pp4.configure`
(__main__.py) and a checkout's configure.py."""

from __future__ import annotations

import sys

from pp4 import interrupt
from pp4.configure import MODULE, name_of
from pp4.configure.options import ConfigureError
from pp4.configure import steps
from pp4.plan.modules import PlanError
from pp4.sources.exl3 import Exl3Error
from pp4.sources.extensions import ExtensionError
from pp4.toolchain.compat import CompatError
from pp4.toolchain.compilers import CompilerError
from pp4.toolchain.locks import LockError
from pp4.toolchain.provision import ToolchainError
from pp4.toolchain.torchenv import TorchError
from pp4.toolchain.wheelcache import WheelError

# What a user can act on: said in one line, without a traceback.
USER_ERRORS = (ConfigureError, LockError, WheelError, TorchError, ToolchainError, CompatError, CompilerError,
               ExtensionError, PlanError, Exl3Error, ValueError)


def main(argv: list[str], started: tuple[str, ...] = MODULE) -> int:
    """Configure with argv; `started` is how this run was started after the interpreter (the module,
    or configure.py's path), which build.ninja's regeneration edge repeats."""
    name = name_of(started)
    try:
        return interrupt.command(name)(steps.main)(argv, tuple(started))
    except USER_ERRORS as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2
