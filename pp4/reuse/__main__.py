"""`python -m pp4.reuse`: the per-compile wrapper and the prepass (pp4/reuse/wrapper.py)."""

import sys

from pp4.reuse.wrapper import main

if __name__ == "__main__":
    sys.exit(main())
