"""The time macros a compile could expand, found in the bytes of what it read and of the command
lines its programs were started with, and whether such a compile may be stored.

__DATE__ and __TIME__ are the clock's when the compile runs, unless SOURCE_DATE_EPOCH fixes them
(pp4 passes it always, 0 unless the user's: pp4/toolchain/compilerenv.py, and the environment is in
the key). __TIMESTAMP__ is "the date and time of the last modification of the current source file"
(gcc's manual): of the file being read where it expands, the unit or a header, whichever file
spelled it or the macro it is in. No key covers a modification time, so a compile that could expand
__TIMESTAMP__ is never stored.

"Could expand": a name is in the bytes of a file the compile read, once gcc's line splices are taken
out (a backslash, or the trigraph ??/, before a newline, with blanks between), or in a command line
one of its processes was started with (-DWHEN=__TIMESTAMP__, NVCC_APPEND_FLAGS, a specs file's -D).
The bytes decide whatever the flags or the diagnostics' format (-w, -isystem, `#pragma GCC
system_header`, -fdiagnostics-format=json hide gcc's -Wdate-time warning). A mention in a comment or
a string counts: a false alarm costs a compile, a miss restores a stale object. Programs and shared
libraries (ELF) are not scanned: gcc never preprocesses them, and cc1plus holds all three names. A
precompiled header (.gch) holds all three in its identifier table, whether or not a macro of it
expands one, so a compile that reads one is not stored. A name made by token pasting
(CAT(__TIME, STAMP__)) is in no file's bytes: gcc's warning (pp4/execution/run.py) still reports it
where warnings are shown, and what it reports is taken too.

Each file is scanned when the hasher reads it (pp4/reuse/actionkey.py), and the result is kept with
its sha256: a file known by its identity is neither read nor scanned again. What a finished compile
could expand is gathered in pp4/reuse/observations.py (time_macros).
"""

from __future__ import annotations

import functools
import re

NAMES = ("__DATE__", "__TIME__", "__TIMESTAMP__")
_NAMES = tuple(n.encode() for n in NAMES)
ELF = b"\x7fELF"


@functools.cache
def _patterns() -> tuple[re.Pattern, re.Pattern, re.Pattern]:
    """Compiled on first use, not at import: every compile's wrapper imports this module, and most
    only restore, reading no file."""
    # gcc's phase 2: a backslash (or ??/, which is one where trigraphs are on) and blanks before a
    # newline (\n, \r\n or \r) join two lines, inside an identifier too.
    splice = re.compile(rb"(?:\\|\?\?/)[ \t\f\v]*(?:\r\n?|\n)")
    rare_splice = re.compile(rb"\\(?:[ \t\f\v]*\r|[ \t\f\v]+\n)")
    # One pass over the bytes finds whether any name is there (each search costs about what hashing
    # the bytes does); only then is each name looked for.
    any_name = re.compile(rb"__(?:DATE|TIME)")
    return splice, rare_splice, any_name


def scan(data: bytes) -> str:
    """The time macros a file's bytes name, comma-separated ("" for none or for a program)."""
    if data[:4] == ELF:
        return ""
    splice, rare_splice, any_name = _patterns()
    # A backslash is in one of torch's headers in 20, a question mark in one in 8 (memchr, cheap):
    # only those files are searched for a splice; the common one is taken out as bytes.replace does.
    if b"\\" in data:
        data = data.replace(b"\\\n", b"")
        if rare_splice.search(data):
            data = splice.sub(b"", data)
    if b"?" in data and b"??/" in data:
        data = splice.sub(b"", data)
    if any_name.search(data) is None:
        return ""
    return ",".join(n for n, b in zip(NAMES, _NAMES) if b in data)


def problem(found: list[tuple[str, str]], env: dict[str, str]) -> str | None:
    """Why a compile that could expand a time macro cannot be stored (None: it can)."""
    loose = [(n, where) for n, where in found if n == "__TIMESTAMP__" or "SOURCE_DATE_EPOCH" not in env]
    if not loose:
        return None
    name, where = loose[0]
    more = f" (and {len(loose) - 1} more such mentions)" if len(loose) > 1 else ""
    what = ("the modification time of the file it expands in" if name == "__TIMESTAMP__"
            else "the clock's, SOURCE_DATE_EPOCH being unset")
    return (f"it could expand {name}, named by {where}{more}, which is {what}: no key covers it, "
            "so this unit is compiled every time")
