"""`python -m pp4.audit`: the audit, kept under its documented name (pp4.certify.audit)."""

import sys

from pp4.certify.audit import main

if __name__ == "__main__":
    sys.exit(main())
