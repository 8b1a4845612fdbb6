"""A compile with debug information records the folder it ran in (DWARF's DW_AT_comp_dir, which
a setup.py build gets from Python's -g) and its source's path. In the fixed execution root pp4 maps
both to this machine's folders relative to the working folder (`.`, `../src`): a debugger run from
there finds the sources, as it does for a compile outside the root, and another build folder laid
out alike gives the same bytes, so its object is shared. Oracles: the object's own bytes (no fixed
path, no absolute folder), gdb listing the source from the working folder, and a real compile in
another folder (--no-reuse) giving the same bytes."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_build import ninja_bin, run

pytestmark = pytest.mark.slow

FIXTURE = REPO / "tests" / "fixtures" / "debuginfo"


def build(work: Path, spec: Path, store: Path, *extra: str) -> tuple[str, bytes]:
    work.mkdir(exist_ok=True)
    run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", str(spec), "--store", str(store),
         *extra], work)
    run([ninja_bin()], work)
    (obj,) = json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))["objects"]
    return obj["status"], Path(work / obj["output"]).read_bytes()


@pytest.mark.parametrize("flavor", ["debug", "plain"])
def test_objects_are_the_same_from_any_build_folder(tmp_path, toolchain, flavor):
    src = tmp_path / "src"
    shutil.copytree(FIXTURE, src)
    store = tmp_path / "store"
    first_status, first = build(tmp_path / "first", src / f"{flavor}.toml", store)
    second_status, second = build(tmp_path / "second", src / f"{flavor}.toml", store)
    assert first_status == "compiled"
    assert str(tmp_path).encode() not in first, "the object names no folder of this machine by its absolute path"
    assert b"/pp4/" not in first, "the object names none of the root's fixed paths"
    if flavor == "debug":
        assert b"../src" in first  # the source's folder, relative to the working folder
        obj = next((tmp_path / "first" / "build").rglob("*.cpp.o"))
        listed = subprocess.run(["gdb", "-batch", "-ex", "list pp4_debug_info_fixture", str(obj)],
                                cwd=tmp_path / "first", capture_output=True, text=True)
        assert "return 3 * x + 1" in listed.stdout, listed.stdout + listed.stderr
    assert second_status == "reused" and second == first
    real_status, real = build(tmp_path / "third", src / f"{flavor}.toml", store, "--no-reuse")
    assert real_status == "compiled" and real == first


def test_a_debug_object_is_not_shared_with_a_checkout_laid_out_otherwise(tmp_path, toolchain):
    """Its debug information names the source folder relative to the working folder: a build whose
    source folder lies elsewhere relative to it compiles its own, which names that place."""
    store = tmp_path / "store"
    for name in ("src", "elsewhere/src"):
        shutil.copytree(FIXTURE, tmp_path / name)
    first_status, first = build(tmp_path / "first", tmp_path / "src" / "debug.toml", store)
    other_status, other = build(tmp_path / "other", tmp_path / "elsewhere" / "src" / "debug.toml", store)
    assert first_status == other_status == "compiled"
    assert b"../elsewhere/src" in other and b"../elsewhere/src" not in first
