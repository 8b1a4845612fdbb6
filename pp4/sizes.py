"""Sizes as people write them: "48G", "512M", "1.5GiB", "1048576", read and written. Powers of 1024.
And durations as people read them: "45 s", "12 min", "2.4 h"."""

from __future__ import annotations

import re

_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(?:i?b)?\s*", re.IGNORECASE)


def parse_size(text: str, positive: bool = False) -> int:
    """Bytes; exact for whole numbers, even beyond float precision. positive: 0 is refused too."""
    match = _SIZE_RE.fullmatch(str(text))
    if not match:
        raise ValueError(f"not a size: {text!r} (write a byte count or a number with K, M, G, T or P: "
                         "48G, 512M, 1.5GiB, 1048576)")
    number, unit = match.groups()
    scale = 1024 ** ("KMGTP".index(unit.upper()) + 1) if unit else 1
    value = int(float(number) * scale) if "." in number else int(number) * scale
    if positive and value <= 0:
        raise ValueError(f"not a size: {text!r} (it must be more than 0 bytes)")
    return value


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_duration(seconds: float) -> str:
    if seconds < 9.95:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """"1 module", "2 modules": a count and its noun, agreeing."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
