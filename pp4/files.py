"""Writing generated files: only when their content changes, and atomically.

A re-run that produces the same content touches nothing, so ninja sees no new mtimes and a second
`python configure.py && ninja` does no work.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_if_changed(path: Path, content: str | bytes) -> bool:
    """Write content to path unless it already holds exactly that; True when it wrote."""
    data = content.encode() if isinstance(content, str) else content
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return True
