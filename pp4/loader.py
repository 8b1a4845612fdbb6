"""`from pp4.loader import load_target`: the pin-checking loader, kept under its documented name
(pp4.certify.loader)."""

from pp4.certify.loader import load, load_target  # noqa: F401
