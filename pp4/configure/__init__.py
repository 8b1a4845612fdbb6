"""configure.py's work, step by step (pp4/configure/steps.py): the options and their checks
(options.py), whether build.ninja here is another build's (guard.py), the choices of toolchain,
architectures, extensions, compilers, limits and store (choices.py), the cost estimates (costs.py),
and the files configure writes besides build.ninja (writing.py)."""

from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]  # configure.py, build.ninja.in and pp4/ are here
