"""A compile with debug information records the folder it ran in (DWARF's DW_AT_comp_dir, which
a setup.py build gets from Python's -g) and its source's path; `__FILE__`, std::source_location and
assert name the source. In the fixed execution root pp4 makes what an object names of its source root
relative to that root (`csrc/x.cpp`, `./csrc/x.cpp` in debug information), as Bazel does, and the
root's other folders keep their fixed paths: the bytes are the same wherever the checkout and the
build folder sit, gdb run from the source root (or given build/pp4.gdb) finds the sources, and a
project's own -fmacro-prefix-map means what it means outside. Oracles: the object's own bytes, gdb
listing the source, a real compile elsewhere (--no-reuse), and g++ without pp4."""

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
PATHS = REPO / "tests" / "fixtures" / "paths"


def build(work: Path, spec: Path, store: Path, *extra: str) -> tuple[str, bytes]:
    work.mkdir(parents=True, exist_ok=True)
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
    assert b"/pp4/src" not in first, "the source root is named relative to itself"
    if flavor == "debug":
        obj = next((tmp_path / "first" / "build").rglob("*.cpp.o"))
        for where, extra in ((src, []), (tmp_path / "first", ["-x", "build/pp4.gdb"])):
            listed = subprocess.run(["gdb", "-batch", *extra, "-ex", "list pp4_debug_info_fixture", str(obj)],
                                    cwd=where, capture_output=True, text=True)
            assert "return 3 * x + 1" in listed.stdout, listed.stdout + listed.stderr
    assert second_status == "reused" and second == first
    real_status, real = build(tmp_path / "third", src / f"{flavor}.toml", store, "--no-reuse")
    assert real_status == "compiled" and real == first


def test_a_debug_object_is_shared_with_a_checkout_laid_out_otherwise(tmp_path, toolchain):
    """A second checkout at another place relative to its build folder (once compiled again: "named
    by the object's debug information as ../elsewhere/src") gets the same object from the store."""
    store = tmp_path / "store"
    for name in ("src", "elsewhere/deeper/src"):
        shutil.copytree(FIXTURE, tmp_path / name)
    first_status, first = build(tmp_path / "first", tmp_path / "src" / "debug.toml", store)
    other_status, other = build(tmp_path / "b" / "other", tmp_path / "elsewhere" / "deeper" / "src" / "debug.toml",
                                store)
    assert (first_status, other_status) == ("compiled", "reused") and other == first


def _strings(obj: Path, needle: bytes) -> set[bytes]:
    """The NUL-ended strings of an object's .rodata that hold needle."""
    out = obj.with_suffix(".rodata")
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.rodata", str(obj), str(out)], check=True)
    return {s for s in out.read_bytes().split(b"\0") if needle in s}


def test_file_names_the_source_relative_to_the_project_and_a_project_map_holds(tmp_path, toolchain):
    """__FILE__, std::source_location and assert's message say what g++ says compiling from the
    project's root (`csrc/where.cpp`), in any checkout; a project's own -fmacro-prefix-map naming a
    folder above the extension's root gives what g++ gives with it outside pp4."""
    project = tmp_path / "checkouts" / "proj"
    shutil.copytree(PATHS, project)
    status, _ = build(tmp_path / "work", project / "paths.toml", tmp_path / "store")
    (obj,) = (tmp_path / "work" / "build").rglob("where.cpp.o")
    said = _strings(obj, b"where.cpp")
    plain = tmp_path / "plain.o"
    run(["g++", "-std=c++20", "-g", "-c", "csrc/where.cpp", "-o", str(plain)], project)  # from the project's root
    assert status == "compiled" and said == _strings(plain, b"where.cpp") == {b"csrc/where.cpp"}

    # The project maps its checkouts' folder: inside the root the map means the same.
    spec = project / "mapped.toml"
    mapping = f"-fmacro-prefix-map={tmp_path / 'checkouts'}/=PROJ/"
    spec.write_text((project / "paths.toml").read_text().replace('"-g"', f'"-g", "{mapping}"'))
    build(tmp_path / "mapped", spec, tmp_path / "store")
    (mapped,) = (tmp_path / "mapped" / "build").rglob("where.cpp.o")
    run(["g++", "-std=c++20", "-g", mapping, "-c", str(project / "csrc" / "where.cpp"), "-o", str(plain)], project)
    assert _strings(mapped, b"where.cpp") == _strings(plain, b"where.cpp") == {b"PROJ/proj/csrc/where.cpp"}
