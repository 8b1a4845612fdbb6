"""`python -m pp4.pin`: a module's pin, kept under its documented name (pp4.certify.pin)."""

import sys

from pp4.certify.pin import main

if __name__ == "__main__":
    sys.exit(main())
