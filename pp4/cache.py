"""`python -m pp4.cache`: the store's command line, kept under its documented name (pp4.store.cli)."""

import sys

from pp4.store.cli import main

if __name__ == "__main__":
    sys.exit(main())
