"""Entry point: ``python -m pp4.worker``."""
import sys

from pp4.worker.harness.cli import main

if __name__ == "__main__":
    sys.exit(main())
