"""`ninja wheel` of a --setup-py project: the project's own wheel, judged against the one
`pip wheel --no-build-isolation` makes of the same project (real pip, setuptools and compilers),
and both installed with pip and called in fresh processes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, content_snapshot
from test_wheel import ninja_bin, run

PROJECT = REPO / "tests" / "fixtures" / "setuppy" / "package"
PP4_FILES = {"pp4-certificate.json.gz", "pp4-build-record.json"}
TORCH_OP = '        CppExtension("demo_pkg.sub._ops", sources=["csrc/ops.cpp"], extra_compile_args={"cxx": ["-O2"]}),\n'


def project_copy(where: Path, with_torch_op: bool) -> Path:
    shutil.copytree(PROJECT, where)
    if not with_torch_op:  # the quick variant: the module that needs Python alone compiles in seconds
        setup_py = where / "setup.py"
        assert TORCH_OP in setup_py.read_text()
        setup_py.write_text(setup_py.read_text().replace(TORCH_OP, ""))
    return where


def pip_wheel(project: Path, out: Path) -> Path:
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", out, project])
    (wheel,) = out.glob("*.whl")
    return wheel


def pp4_wheel(project: Path, work: Path, store: Path) -> tuple[Path, str]:
    work.mkdir()
    run([sys.executable, REPO / "configure.py", "--arch", "9.0", "--setup-py", project, "--store", store], work)
    run([ninja_bin()], work)
    out = run([ninja_bin(), "wheel"], work).stdout
    wheels = list((work / "dist").glob("*.whl"))
    assert len(wheels) == 1, out  # one wheel for the project, not one per module
    return wheels[0], out


def files_of(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as z:
        return {i.filename: z.read(i) for i in z.infolist() if not i.is_dir()}


def executables_of(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {i.filename for i in z.infolist() if (i.external_attr >> 16) & 0o111}


def use_installed(wheel: Path, target: Path, with_torch_op: bool) -> str:
    """The wheel installed by pip into target, its modules called from a fresh process outside the repository."""
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, wheel])
    code = "import demo_pkg; print(demo_pkg.sum_squares(*map(int, demo_pkg.table())))"
    if with_torch_op:
        code += "; import torch, demo_pkg.sub as s; print(s.affine(torch.arange(5.0), 2.5).tolist())"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHOME"}
    env["PYTHONPATH"] = str(target)
    assert (target / "bin" / "demo-pkg-answer").is_file()  # the console script
    return run([sys.executable, "-c", code], cwd=target.parent, env=env).stdout


def check_against_pip(tmp_path: Path, with_torch_op: bool) -> None:
    theirs = pip_wheel(project_copy(tmp_path / "for-pip", with_torch_op), tmp_path / "pip-dist")
    project = project_copy(tmp_path / "project", with_torch_op)
    before = content_snapshot(project)
    ours, out = pp4_wheel(project, tmp_path / "b1", tmp_path / "store")
    assert content_snapshot(project) == before  # setuptools' scratch folders were elsewhere
    assert ours.name == theirs.name  # name, version and tags: pip's
    mine, pips = files_of(ours), files_of(theirs)
    dist_info = ours.name.split("-")[0] + "-1.2.3.dist-info"
    assert set(mine) == set(pips) | {f"{dist_info}/{n}" for n in PP4_FILES}, sorted(set(mine) ^ set(pips))
    modules = {n for n in pips if n.endswith(".so")}
    assert len(modules) == (2 if with_torch_op else 1)
    assert executables_of(ours) == executables_of(theirs) == modules  # modes as the linker left them
    for name in set(pips) - modules - {f"{dist_info}/RECORD", f"{dist_info}/METADATA"}:
        assert mine[name] == pips[name], name  # packages, package data, entry points, WHEEL, top_level
    import torch

    pin = f"Requires-Dist: torch=={torch.__version__.split('+')[0]}"
    assert [line for line in mine[f"{dist_info}/METADATA"].decode().splitlines() if line != pin] == \
        pips[f"{dist_info}/METADATA"].decode().splitlines()
    assert sum(line == pin for line in mine[f"{dist_info}/METADATA"].decode().splitlines()) == 1
    # Each module is the one pp4 linked in the build folder, at its import path, and the record says so.
    record = json.loads(mine[f"{dist_info}/pp4-build-record.json"])
    for entry in record["wheel"]["modules"]:
        built = next((tmp_path / "b1" / "build" / entry["target"]).glob("*.so"))
        assert hashlib.sha256(mine[entry["file"]]).hexdigest() == hashlib.sha256(built.read_bytes()).hexdigest()
    assert sorted(e["file"] for e in record["wheel"]["modules"]) == sorted(modules)
    # Installed by pip, called: the same answers from both.
    assert use_installed(ours, tmp_path / "mine", with_torch_op) == use_installed(theirs, tmp_path / "pips", with_torch_op)
    # Made again, and made in another build folder whose objects come from the first one's store:
    # the same bytes.
    again = run([ninja_bin(), "wheel"], tmp_path / "b1").stdout
    assert "(unchanged)" in again, again
    restored, out2 = pp4_wheel(project, tmp_path / "b2", tmp_path / "store")
    assert restored.read_bytes() == ours.read_bytes()


def test_a_setup_py_projects_wheel_is_the_one_pip_makes_with_pp4s_modules(tmp_path, toolchain):
    check_against_pip(tmp_path, with_torch_op=False)


@pytest.mark.slow
def test_the_same_with_a_torch_op(tmp_path, toolchain):
    check_against_pip(tmp_path, with_torch_op=True)


def test_a_setup_py_that_no_longer_builds_says_so(tmp_path, toolchain):
    """setup.py broken after the build: ninja runs configure again, which says what is wrong; no wheel."""
    project = project_copy(tmp_path / "project", with_torch_op=False)
    work = tmp_path / "b"
    work.mkdir()
    run([sys.executable, REPO / "configure.py", "--arch", "9.0", "--setup-py", project, "--store", tmp_path / "s"], work)
    run([ninja_bin()], work)
    (project / "setup.py").write_text((project / "setup.py").read_text().replace("setup(\n", "raise ValueError('oops')\nsetup(\n"))
    proc = run([ninja_bin(), "wheel"], work, check=False)
    assert proc.returncode != 0 and "ValueError: oops" in proc.stdout + proc.stderr
    assert not (work / "dist").exists()


def test_a_renamed_project_gets_its_new_name_without_a_compile(tmp_path, toolchain):
    """The name moves from setup.py to pyproject.toml (setuptools reads it there) and changes: ninja
    runs configure again, pins the same module with the new plan, compiles nothing, and the wheel
    and its target carry the new name."""
    project = project_copy(tmp_path / "project", with_torch_op=False)
    work = tmp_path / "b"
    work.mkdir()
    run([sys.executable, REPO / "configure.py", "--arch", "9.0", "--setup-py", project, "--store", tmp_path / "s"], work)
    run([ninja_bin()], work)
    setup_py = project / "setup.py"
    setup_py.write_text(setup_py.read_text().replace('    name="demo-pkg",\n', ""))
    (project / "pyproject.toml").write_text('[project]\nname = "Demo.Renamed"\nversion = "1.2.3"\n'
                                            'dependencies = ["numpy>=1.20"]\nrequires-python = ">=3.8"\n')
    out = run([ninja_bin(), "wheel-demo-renamed"], work).stdout
    assert "] CONFIGURE" in out and "] PIN" in out and not re.search(r"\] (CXX|CUDA|LINK) ", out), out
    assert [w.name for w in (work / "dist").glob("*.whl")] == ["demo_renamed-1.2.3-cp311-cp311-linux_x86_64.whl"
                                                               .replace("cp311", f"cp3{sys.version_info.minor}")]
