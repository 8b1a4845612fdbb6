"""A compile with debug information records the folder it ran in (DWARF's DW_AT_comp_dir, which
a setup.py build gets from Python's -g) and its source's path. In the fixed execution root both are
/pp4/...: the same command in another build folder gives the same bytes, so its object is shared.
Oracle: the object's own bytes name the root's folders, never the build folder; and a real compile
in the second folder (--no-reuse) gives the same bytes."""

from __future__ import annotations

import gzip
import json
import shutil
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
    assert str(tmp_path).encode() not in first, "the object names no folder of this machine"
    if flavor == "debug":
        assert b"/pp4/work" in first and b"/pp4/src" in first  # DW_AT_comp_dir and the source's path
    assert second_status == "reused" and second == first
    real_status, real = build(tmp_path / "third", src / f"{flavor}.toml", store, "--no-reuse")
    assert real_status == "compiled" and real == first
