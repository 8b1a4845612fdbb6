"""Make-style dependency files, as gcc -MD writes them and ninja reads them (deps = gcc).

A compile's or link's dependency file is written from what the observer saw it read (every regular
file, this machine's paths), so ninja runs it again when any of them changes: a header, a data file
an `.incbin` pulls in, a library a link resolved, the compiler's own programs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path



def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a make-style dependency file (gcc -MD, nvcc -MD), unescaped."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    colon = re.search(r"(?<!\\):(\s|$)", text)
    body = text[colon.end():] if colon else ""
    deps, cur, i = [], [], 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body) and body[i + 1] in " #\\":
            cur.append(body[i + 1])
            i += 2
            continue
        if c == "$" and i + 1 < len(body) and body[i + 1] == "$":
            cur.append("$")
            i += 2
            continue
        if c.isspace():
            if cur:
                deps.append("".join(cur))
                cur = []
        else:
            cur.append(c)
        i += 1
    if cur:
        deps.append("".join(cur))
    return list(dict.fromkeys(deps))


def _depfile_escape(p: str) -> str:
    return p.replace("\\", "\\\\").replace(" ", "\\ ").replace("#", "\\#").replace("$", "$$")


def depfile_body(deps: list[str]) -> str:
    """The prerequisites part of a dependency file; bodies of several lists join with DEPFILE_JOIN."""
    return DEPFILE_JOIN.join(_depfile_escape(d) for d in deps)


DEPFILE_JOIN = " \\\n  "


def format_depfile(output: str, deps: list[str] | None = None, bodies: list[str] | None = None) -> str:
    parts = ([depfile_body(deps)] if deps else []) + [b for b in bodies or [] if b]
    return _depfile_escape(output) + ": " + DEPFILE_JOIN.join(parts) + "\n"


def files_read(ran) -> list[str]:
    """Every regular file an observed command read, where it is on this machine (pp4.execution.run.Ran)."""
    out = []
    for (path, follow), result in ran.trace.reads.items():
        if result != "ok" or not follow or os.path.normpath(path) in ran.trace.writes:
            continue
        real = ran.real(path)
        if real is not None and os.path.isfile(real):
            out.append(real)
    return sorted(set(out))


def write(path: str, output: str, files: list[str] | None = None, bodies: list[str] | None = None) -> None:
    """A dependency file of files and of bodies already escaped (depfile_body). Written in place:
    ninja reads it only after the command that writes it has ended."""
    Path(path).write_text(format_depfile(output, files, bodies))
