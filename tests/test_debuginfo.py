"""A compile with debug information records the folder it ran in (DWARF's DW_AT_comp_dir, which
a setup.py build gets from Python's -g): the same command in another folder gives other bytes, so
its object is reused only by builds in the same folder. Oracle: the object's own bytes name the
folder that compiled it; a build without -g reuses across folders as before."""

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


def build(work: Path, spec: Path, store: Path) -> tuple[str, bytes]:
    work.mkdir(exist_ok=True)
    run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", str(spec), "--store", str(store)],
        work)
    run([ninja_bin()], work)
    (obj,) = json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))["objects"]
    return obj["status"], Path(work / obj["output"]).read_bytes()


@pytest.mark.parametrize("flavor", ["debug", "plain"])
def test_debug_objects_are_reused_only_in_the_folder_that_compiled_them(tmp_path, toolchain, flavor):
    src = tmp_path / "src"
    shutil.copytree(FIXTURE, src)
    store = tmp_path / "store"
    first_status, first = build(tmp_path / "first", src / f"{flavor}.toml", store)
    second_status, second = build(tmp_path / "second", src / f"{flavor}.toml", store)
    assert first_status == "compiled"
    if flavor == "debug":
        assert str(tmp_path / "first").encode() in first
        assert second_status == "compiled"  # a reuse would have shipped the first folder's bytes
        assert str(tmp_path / "second").encode() in second and str(tmp_path / "first").encode() not in second
        shutil.rmtree(tmp_path / "first")  # the same folder again: the same bytes, so reused
        again_status, again = build(tmp_path / "first", src / f"{flavor}.toml", store)
        assert again_status == "reused" and again == first
    else:
        assert str(tmp_path / "first").encode() not in first
        assert second_status == "reused" and second == first
