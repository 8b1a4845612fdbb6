"""Where this machine keeps what every compile reads, named by a placeholder in keys and records.

Two checkouts of one project, on two machines or in two folders of one, differ in the paths of
their torch (`$TORCH`), of pp4's toolchain in its cache folder (`$TOOLCHAIN`), of the Python
environment (`$PREFIX`) and of Python's headers (`$PYINC`), as they differ in their source root
(`$SRC`, pp4/reuse/actionkey.py). Commands and input sets are keyed with those folders replaced by
their placeholders, so that the same compile has the same key in both; wherever a file is read, the
placeholder is put back with this machine's folder. Soundness does not rest on the mapping: every
input named through a placeholder is hashed here, at this machine's path, before anything is reused.

What the objects themselves embed is made to match too: every compile maps the same folders out of
its `__FILE__` paths (prefix_map_flags, pp4/plan/modules.py). An object compiled with debug
information records absolute paths (DWARF) all the same, so such compiles are keyed with no
placeholder at all (actionkey.embeds_cwd).
"""

from __future__ import annotations

import functools
import os
import re

import attrs

PLACEHOLDERS = ("$TORCH", "$TOOLCHAIN", "$PYINC", "$PREFIX")
_END = r"(?=[/=:;,\s]|$)"
# Folders so general that a placeholder for them would stand for half the system.
TOO_GENERAL = {"/", "/usr", "/usr/local", "/opt", "/home", "/root", "/tmp", os.path.expanduser("~")}


@attrs.frozen
class Relocation:
    places: tuple[tuple[str, str], ...] = ()  # (placeholder, absolute folder) as configure recorded them
    # Every folder a placeholder stands for, longest first: each place and, where it differs, the
    # place with its links resolved (gcc names a system header by its real path).
    spellings: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_dict(cls, doc: dict | None, names: tuple[str, ...] = PLACEHOLDERS) -> "Relocation":
        """names: the placeholders taken from doc (a compile sent to a cluster node also names its
        source tree and working folder, pp4/reuse/cluster/)."""
        places = [(name, os.path.normpath(folder)) for name, folder in (doc or {}).items()
                  if name in names and os.path.isabs(folder) and os.path.normpath(folder) not in TOO_GENERAL]
        spellings = {(name, f) for name, folder in places for f in (folder, os.path.realpath(folder))
                     if f not in TOO_GENERAL}
        return cls(tuple(places), tuple(sorted(spellings, key=lambda nf: (len(nf[1]), nf), reverse=True)))

    def to_dict(self) -> dict:
        return dict(self.places)

    def portable(self, text: str) -> str:
        """text with this machine's folders named by their placeholders."""
        for (name, folder), pattern in zip(self.spellings, _patterns(self.spellings)):
            if folder in text:
                text = pattern.sub(lambda _m, n=name: n, text)
        return text

    def local(self, text: str) -> str:
        """text with each placeholder put back as this machine's folder."""
        if "$" not in text:
            return text
        for name, folder in self.places:
            if name in text:
                text = re.sub(re.escape(name) + _END, lambda _m, f=folder: f, text)
        return text


@functools.lru_cache(maxsize=None)
def _patterns(places: tuple[tuple[str, str], ...]) -> tuple[re.Pattern, ...]:
    # A folder only where a path continues or ends after it (or a separator follows it, as in
    # -fmacro-prefix-map=FOLDER=name or a:b lists): /venv never turns /venv2 into $PREFIX2.
    return tuple(re.compile(re.escape(folder) + _END) for _, folder in places)


NONE = Relocation()


def without_repeated_maps(argv: list[str]) -> list[str]:
    """A portable command less each prefix map that repeats the one before it: a folder reached
    through a link is mapped under both its spellings (pp4/plan/modules.py), which read the same
    once named by their placeholder, and gcc applies the same map either way."""
    out: list[str] = []
    last = None
    i = 0
    while i < len(argv):
        a = argv[i]
        pair = a == "-Xcompiler" and i + 1 < len(argv) and argv[i + 1].startswith("-fmacro-prefix-map=")
        flag = argv[i + 1] if pair else a
        if flag.startswith("-fmacro-prefix-map="):
            if flag != last:
                out += argv[i:i + 2] if pair else [a]
            last = flag
            i += 2 if pair else 1
            continue
        last = None
        out.append(a)
        i += 1
    return out


def places_here(torch_dir: str, toolchain_prefix: str, python_include: str, prefix: str) -> dict:
    """The placeholders configure records for this machine."""
    return Relocation.from_dict({"$TORCH": torch_dir, "$TOOLCHAIN": toolchain_prefix, "$PYINC": python_include,
                                 "$PREFIX": prefix}).to_dict()
