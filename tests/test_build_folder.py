"""The build folder's configuration has one owner (pp4/build/config.py): a folder written by
another format is refused with what to do by every edge and command that reads it, never read by
raw keys that mean something else now; `python -m pp4.store` beside build.ninja shows the store
that build uses."""

from __future__ import annotations

import json
import subprocess
import sys

from test_specs_build import configured, ninja_bin


def test_a_build_folder_of_another_format_is_refused_with_what_to_do(tmp_path, toolchain):
    _, work = configured(tmp_path)
    config = work / "build" / "pp4.json"
    doc = json.loads(config.read_text())
    assert doc["format"] == 2
    doc.pop("format")  # as every pp4 before the build folder had an owner wrote it
    config.write_text(json.dumps(doc))
    for cmd in ([ninja_bin()], [ninja_bin(), "certify"], [ninja_bin(), "report"]):
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
        said = proc.stdout + proc.stderr
        assert proc.returncode != 0, said
        assert "written by another version of pp4 (format 1" in said and "python -m pp4.configure" in said, said
        assert "Traceback" not in said, said


def test_the_store_command_shows_the_store_this_build_uses(tmp_path, toolchain):
    _, work = configured(tmp_path)  # configured with --store tmp_path/store
    proc = subprocess.run([sys.executable, "-m", "pp4.store", "stats"], cwd=work, capture_output=True, text=True)
    assert str(tmp_path / "store") in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    elsewhere = subprocess.run([sys.executable, "-m", "pp4.store", "--store", str(tmp_path / "other"), "stats"],
                               cwd=work, capture_output=True, text=True)
    assert str(tmp_path / "other") in elsewhere.stdout + elsewhere.stderr
