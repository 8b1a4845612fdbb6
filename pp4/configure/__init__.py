"""configure's work, step by step (pp4/configure/steps.py): the options and their checks
(options.py), whether build.ninja here is another build's (guard.py), the choices of toolchain,
architectures, extensions, compilers, limits and store (choices.py), the cost estimates (costs.py),
and the files configure writes besides build.ninja (writing.py); how it is started and what it says
when it stops (command.py).

configure is started two ways: `python -m pp4.configure` from any pp4, installed or not, and
`python configure.py` in a checkout. build.ninja re-runs it the way it was started: what follows
the interpreter is `started`, the module's two words or the script's path."""

from __future__ import annotations

import shlex

MODULE = ("-m", "pp4.configure")


def script_of(started: tuple[str, ...]) -> str | None:
    """The configure.py this run was started as, or None when it was started as the module."""
    return None if tuple(started) == MODULE else started[0]


def name_of(started: tuple[str, ...]) -> str:
    """How messages name configure: what a user types to run it again."""
    return "configure.py" if script_of(started) else "python -m pp4.configure"


def rerun_of(started: tuple[str, ...]) -> str:
    """The command line that runs this configure again, before its options."""
    return "python " + shlex.join(started)
