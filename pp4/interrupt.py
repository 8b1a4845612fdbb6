"""How every pp4 command ends when it is stopped from outside.

Ctrl-C: one line that names the command, exit status 130 (128 + SIGINT, as a shell reports it), no
traceback. The machine (a full or read-only disk, a folder it may not write, memory that ran out):
one line that names the cause, what was measured and what to do (pp4/execution/machine.py), exit
status 1, no traceback: the cause is not in pp4's code, and ninja shows an edge's last line first.
Cleanup in `finally` blocks still runs on the way out."""

from __future__ import annotations

import functools
import sys

EXIT_INTERRUPTED = 130
EXIT_MACHINE = 1


def command(name: str):
    """Decorate a command's main(): a KeyboardInterrupt becomes "NAME: interrupted" and 130; an
    OSError of the machine's, or a step refused for one, its one line and 1."""
    def wrap(main):
        @functools.wraps(main)
        def run(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt:
                print(f"{name}: interrupted", file=sys.stderr, flush=True)
                return EXIT_INTERRUPTED
            except OSError as e:
                from pp4 import ninjarun
                from pp4.execution import machine  # only on the way out: a command's start stays light

                # what to run again: ninja, for the steps it runs; else this command
                line = machine.from_oserror(e, "ninja" if ninjarun.ninja_ancestor() else name)
                if line is None:
                    raise
                print(line, file=sys.stderr, flush=True)  # it names the error and the path
                return EXIT_MACHINE
            except Exception as e:
                from pp4.execution import machine

                if not isinstance(e, machine.MachineError):
                    raise
                print(str(e), file=sys.stderr, flush=True)
                return EXIT_MACHINE
        return run
    return wrap
