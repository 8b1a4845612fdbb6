"""A user's spec built end to end: two modules in one spec in its own folder (sources through
`../`, a C source, macros), one target built alone, `ninja certify` auditing only what is built
and compiling nothing, a wheel of one module, a deleted build folder rebuilt by plain `ninja`.

C and C++ only (a compile takes a second), so it is part of the quick suite: the path every build
takes (configure, the reuse edge and its store, the prepass, links, pins, the certificate, the
audit, the wheel) runs in `pytest -m "not slow"`."""

from __future__ import annotations

import json
import os
import re
import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import REPO

TWO = REPO / "tests" / "fixtures" / "twomodules"


def ninja_bin() -> str:
    from ninja import BIN_DIR

    return str(Path(BIN_DIR) / "ninja")


def run(cmd, cwd, check=True):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def compiled(output: str) -> list[str]:
    return re.findall(r"^\[\d+/\d+\] (?:CXX|CUDA) (\S+)", output, re.M)


def call(work: Path, target: str, expr: str):
    code = (f"import sys, json; sys.path.insert(0, {str(REPO)!r}); from pp4.certify.loader import load_target; "
            f"m = load_target({target!r}, 'build'); print(json.dumps({expr}))")
    return json.loads(run([sys.executable, "-c", code], work).stdout.strip().splitlines()[-1])


def configured(tmp_path):
    """The two-module spec copied into tmp_path/project and configured in tmp_path/work, with its
    own store: (project, work)."""
    project = tmp_path / "project"
    shutil.copytree(TWO, project)
    work = tmp_path / "work"
    work.mkdir()
    run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", str(project / "spec" / "spec.toml"),
         "--store", str(tmp_path / "store")], work)
    return project, work


def test_a_spec_in_its_own_folder_builds_one_target_certifies_what_is_built_and_survives_rm(tmp_path, toolchain):
    project, work = configured(tmp_path)

    nothing = run([ninja_bin(), "certify"], work, check=False)
    assert nothing.returncode != 0 and "nothing is built yet" in nothing.stdout + nothing.stderr
    assert compiled(nothing.stdout) == []

    one = run([ninja_bin(), "pp4_answer"], work)
    # The spec's root is the project folder its ../ paths share: objects are named from there.
    assert sorted(compiled(one.stdout)) == ["build/pp4_answer/obj/csrc/answer.cpp.o", "build/pp4_answer/obj/csrc/twice.c.o"]
    assert call(work, "pp4_answer", "[m.answer(), m.twice(21), m.greeting]") == [42, 42, "hello"]
    # `ninja TARGET` ends, as a whole build does, with what it did.
    assert re.search(r"^pp4: last build: \d+ edges in .*; compiled 2 ", one.stdout, re.M), one.stdout

    # The wheels of what is built: pp4_answer's, and pp4_other named as not built; nothing compiled.
    packed = run([ninja_bin(), "wheel-built"], work)
    assert compiled(packed.stdout) == [] and "not built, so not packed: pp4_other" in packed.stdout, packed.stdout
    assert [w.name.split("-")[0] for w in (work / "dist").glob("*.whl")] == ["pp4_answer"]
    assert not list((work / "build" / "pp4_other").rglob("*.o"))

    audit = run([ninja_bin(), "certify"], work)
    assert compiled(audit.stdout) == [], "ninja certify compiled something"
    assert "audited what is built, pp4_answer" in audit.stdout and "not built yet: pp4_other" in audit.stdout
    assert "2 objects: 0 reused, 2 compiled, 0 failed; 1 module" in audit.stdout and "audit passed" in audit.stdout
    assert not list((work / "build" / "pp4_other").rglob("*.o"))

    everything = run([ninja_bin()], work)
    assert [Path(o).name for o in compiled(everything.stdout)] == ["other.cpp.o"]
    doc = run([ninja_bin(), "certify"], work).stdout
    assert "certificate build/certificate.json.gz: sha256" in doc and "3 objects" in doc and "not built yet" not in doc

    # The wheel of one module: the module's bytes at its import path, and the certificate beside it.
    packed = run([ninja_bin(), "wheel-pp4_answer"], work)
    assert compiled(packed.stdout) == []
    (wheel,) = (work / "dist").glob("pp4_answer-*.whl")
    built = next((work / "build" / "pp4_answer").glob("pp4_answer*.so"))
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        inside = f"pp4_answer/{built.name}"  # beside the loader that checks it (docs/wheels.md)
        assert inside in names and "pp4_answer/pp4-certificate.json.gz" in names, names
        assert hashlib.sha256(zf.read(inside)).digest() == hashlib.sha256(built.read_bytes()).digest()
        assert any(n.endswith(".dist-info/RECORD") for n in names)

    shutil.rmtree(work / "build")  # what many users do; ninja must configure again by itself
    again = run([ninja_bin()], work)
    assert "CONFIGURE" in again.stdout
    assert call(work, "pp4_answer", "m.twice(5)") == 10
    cert = json.loads(__import__("gzip").decompress((work / "build" / "certificate.json.gz").read_bytes()))
    assert {o["status"] for o in cert["objects"]} == {"reused"} and len(cert["objects"]) == 3
    assert all(os.path.commonpath([o["output"], "build"]) == "build" for o in cert["objects"])

    # A header only pp4_answer reads, edited: pp4_other's pin covers every source below the root the
    # two share, so it is pinned again too, and the build and its audit pass (not "built from other
    # sources" for good).
    header = project / "include" / "answer.h"
    header.write_text(header.read_text() + "// edited\n")
    edited = run([ninja_bin()], work)
    assert sorted(Path(o).name for o in compiled(edited.stdout)) == ["answer.cpp.o", "twice.c.o"], edited.stdout
    assert "audit passed" in run([ninja_bin(), "certify"], work).stdout
    assert call(work, "pp4_other", "m.one()") == 1
