"""Twins: files of the same bytes that one compile read, and whether their modification times
agree.

gcc takes a once-only header (`#pragma once`, `#import`) for one it has already included when the
two have the same size, the same modification time (in whole seconds) and the same bytes, and
then leaves the second out; with other times it includes both. So which of a compile's same-bytes
files share a time is an input, wherever they are: torch's own headers hold such groups (eleven
`ATen/ops/_nested_*_native.h` of one content, two `python_stub.h`), and pip gives every file the
time it was unpacked, so whether they fold differs from one install to another.

Which files are once-only is not decided here: no look at a file's text can tell (a byte-order
mark, a comment inside the directive, `_Pragma("once")` from a macro another header defines), and
gcc cannot say it of a header read on its own, whose includes it cannot find. So every group of
two or more files of the same non-empty bytes that a compile read is keyed (an empty file holds no
directive), on its first member by path:

    twins:<other members>|<class of each member's time, the first's first: 0,0,1>
"""

from __future__ import annotations

import hashlib
import os

PREFIX = "twins:"
_EMPTY = hashlib.sha256(b"").hexdigest()


def observe(ran, pairs: dict, is_file) -> None:
    """Add a twins observation for each group of files of the same bytes a finished compile read
    (pairs: (path, kind) -> state, as observations.from_run builds them; is_file(state): whether a state
    is a regular file's, pathstates.is_file, which imports this module)."""
    groups: dict[str, list[str]] = {}
    for (path, kind), found in pairs.items():
        if kind == "f" and is_file(found) and found[:64] != _EMPTY:
            groups.setdefault(found[:64], []).append(path)
    for members in groups.values():
        if len(members) < 2:
            continue
        members.sort()
        reals = [ran.real(m) for m in members]
        if None not in reals:
            pairs[(members[0], PREFIX)] = state(members[1:], reals)


def state(others: list[str], reals: list[str]) -> str:
    """The twins state of a group: the other members as recorded, then for each member (this one
    first) the class of its modification time, numbered by first appearance ('0,0,1')."""
    classes: dict[object, int] = {}
    labels = []
    for real in reals:
        try:
            when: object = int(os.stat(real).st_mtime)
        except OSError as e:
            when = f"!{e.errno}"
        labels.append(str(classes.setdefault(when, len(classes))))
    return PREFIX + "\0".join(others) + "|" + ",".join(labels)


def others(recorded: str) -> list[str]:
    return recorded[len(PREFIX):].split("|", 1)[0].split("\0")


def describe(recorded: str) -> str:
    members, _, classes = recorded[len(PREFIX):].rpartition("|")
    return f"{len(members.split(chr(0))) + 1} files of the same bytes with modification times {classes}"
