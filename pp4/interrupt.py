"""Ctrl-C ends every pp4 command the same way: one line that names it, exit status 130 (128 + SIGINT,
as a shell reports it), no traceback. Cleanup in `finally` blocks still runs on the way out."""

from __future__ import annotations

import functools
import sys

EXIT_INTERRUPTED = 130


def command(name: str):
    """Decorate a command's main(): a KeyboardInterrupt becomes "NAME: interrupted" and 130."""
    def wrap(main):
        @functools.wraps(main)
        def run(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt:
                print(f"{name}: interrupted", file=sys.stderr, flush=True)
                return EXIT_INTERRUPTED
        return run
    return wrap
