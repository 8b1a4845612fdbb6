"""Entry point: ``python -m pp4_worker``."""
import sys

from pp4_worker.harness.cli import main

if __name__ == "__main__":
    sys.exit(main())
