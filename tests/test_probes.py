"""Probe digests against the preprocessor itself: whenever `g++ -E` of a unit gives other output
because a file appeared where the unit looks, its probe digest must differ; a file appearing where
the preprocessor does not look must leave it alone (or the facc variant would never share)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pp4.reuse import probes
from pp4.reuse.actionkey import FileHasher

GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="needs g++ as the oracle")


def test_names_keep_whether_they_were_quoted():
    text = b"""#include "a.h"
#  include <b/c.h>
#if __has_include(<d.h>) && 1
#define E_H "e.h"
#include_next <f.h>
int s = sizeof("not/a/directive.h");
"""
    assert probes.names_in(text) == ('"a.h', '"e.h', "<b/c.h", "<d.h", "<f.h")


class Unit:
    """A unit with two -I folders (the second absent at first) and the include of a real header."""

    def __init__(self, root: Path):
        self.root = root
        self.src = root / "src"
        self.one, self.two = root / "one", root / "two"
        self.src.mkdir(parents=True)
        self.one.mkdir()
        (self.one / "base.h").write_text("#define BASE 1\n")
        self.unit = self.src / "deep" / "u.cpp"
        self.unit.parent.mkdir()
        self.unit.write_text('#include <base.h>\n#include "../../up/near.h"\n'
                             "#if __has_include(<opt/probe.h>)\nint probe_on;\n#endif\n"
                             "#if __has_include(<own.h>)\nint own_on;\n#endif\n"
                             '#if __has_include("../sibling/later.h")\nint later_on;\n#endif\nint base = BASE;\n')
        (root / "up").mkdir()
        (root / "up" / "near.h").write_text("int near;\n")
        self.chain = probes.search_path([], [str(self.two), str(self.one)], [], [], {}, str(root))

    def preprocessed(self) -> str:
        proc = subprocess.run([GXX, "-E", "-P", "-I", str(self.two), "-I", str(self.one), str(self.unit)],
                              capture_output=True, text=True, cwd=self.root, check=True)
        return proc.stdout

    def inputs(self) -> list[tuple[str, str]]:
        dep = subprocess.run([GXX, "-M", "-I", str(self.two), "-I", str(self.one), str(self.unit)],
                             capture_output=True, text=True, cwd=self.root, check=True).stdout
        files = dep.replace("\\\n", " ").split(":", 1)[1].split()
        return [(os.path.normpath(f), os.path.normpath(f)) for f in files]

    def digest(self, names_file: Path | None = None) -> str:
        prober = probes.Prober(FileHasher(), names_file)
        d = prober.unit_digest(self.inputs(), [], self.chain)
        prober.save()
        return d


@pytest.mark.parametrize("change", ["probe-in-absent-folder", "shadow-in-earlier-folder", "quote-name-through-parent-folder"])
def test_a_file_the_preprocessor_would_find_changes_the_digest(tmp_path, change):
    u = Unit(tmp_path)
    before_text, before = u.preprocessed(), u.digest()
    if change == "probe-in-absent-folder":  # two/ does not exist yet
        (u.two / "opt").mkdir(parents=True)
        (u.two / "opt" / "probe.h").write_text("\n")
    elif change == "shadow-in-earlier-folder":
        u.two.mkdir()
        (u.two / "base.h").write_text("#define BASE 2\n")
    else:  # a quote name relative to the unit's own folder, through .. (no -I folder reaches it)
        (u.src / "sibling").mkdir()
        (u.src / "sibling" / "later.h").write_text("\n")
    assert u.preprocessed() != before_text, "the oracle: the compile now differs"
    assert u.digest() != before


def test_a_file_where_the_preprocessor_does_not_look_changes_nothing(tmp_path):
    u = Unit(tmp_path)
    before_text, before = u.preprocessed(), u.digest()
    (u.src / "own.h").write_text("\n")  # an angle name never searches the unit's own folder
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "base.h").write_text("#define BASE 3\n")
    assert u.preprocessed() == before_text
    assert u.digest() == before


def test_names_kept_between_processes_are_used_only_for_the_same_bytes(tmp_path):
    u = Unit(tmp_path)
    names_file = tmp_path / "state" / "probe-names.json"
    first = u.digest(names_file)
    kept = json.loads(names_file.read_text())["names"]
    assert any('<opt/probe.h' in v for v in kept.values())
    assert u.digest(names_file) == first
    # The unit is edited: its new names are read from the file, not taken from the cache.
    u.unit.write_text(u.unit.read_text().replace("<opt/probe.h>", "<opt/other.h>"))
    edited = u.digest(names_file)
    (u.two / "opt").mkdir(parents=True)
    (u.two / "opt" / "other.h").write_text("\n")
    assert u.digest(names_file) != edited


def test_a_damaged_names_file_is_ignored(tmp_path):
    u = Unit(tmp_path)
    names_file = tmp_path / "probe-names.json"
    clean = u.digest()
    sha = FileHasher().sha256(str(u.unit))
    names_file.write_text(json.dumps({"format": probes.NAMES_FORMAT, "names": {sha: 7}}))
    assert u.digest(names_file) == clean
    names_file.write_text("{not json")
    assert u.digest(names_file) == clean
