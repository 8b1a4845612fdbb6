"""`python -m pp4.configure [options] && ninja`: configure from any pp4, an installed wheel included,
which has no checkout and no configure.py. build.ninja re-runs it this way."""

import sys

from pp4.configure.command import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
