"""build.ninja runs configure again when anything configure was made of changes: every module of
pp4 it imported and the data files they read. The oracle is Python's own account of what the
configure run imported (`-X importtime`), against ninja's account of the configure edge's inputs
(`ninja -t query build.ninja`); then a real touch of one of those modules, judged by whether ninja
runs the configure edge."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from conftest import REPO
from test_specs_build import TWO, ninja_bin


def test_every_module_configure_imported_is_an_input_of_build_ninja(tmp_path, toolchain):
    project = tmp_path / "project"
    shutil.copytree(TWO, project)
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run([sys.executable, "-X", "importtime", str(REPO / "configure.py"), "--arch", "9.0",
                           "--ext-spec", str(project / "spec" / "spec.toml"), "--store", str(tmp_path / "store")],
                          cwd=work, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(pp4(?:\.\w+)*)$", proc.stderr, re.M))
    assert "pp4.sources.unidiff" in imported or "pp4.toolchain.provision" in imported, sorted(imported)
    files = set()
    for name in imported:
        base = REPO.joinpath(*name.split("."))
        files.add(str(base / "__init__.py") if base.is_dir() else str(base.with_suffix(".py")))
    query = subprocess.run([ninja_bin(), "-t", "query", "build.ninja"], cwd=work, capture_output=True, text=True)
    inputs = {ln.strip().lstrip("| ").strip() for ln in query.stdout.splitlines()}
    missing = sorted(f for f in files if f not in inputs)
    assert not missing, f"configure imported these, and a change to them would not re-run it: {missing}"

    # A real change: a module configure imported is newer than build.ninja, and ninja re-runs configure.
    module = REPO / "pp4" / "plan" / "estimate.py"
    assert str(module) in inputs
    later = os.stat(work / "build.ninja").st_mtime + 5
    saved = os.stat(module)
    try:
        os.utime(module, (later, later))
        explain = subprocess.run([ninja_bin(), "-d", "explain", "build.ninja"], cwd=work, capture_output=True,
                                 text=True)
    finally:
        os.utime(module, ns=(saved.st_atime_ns, saved.st_mtime_ns))
    # Named as the reason (not a dry run: that says CONFIGURE whatever, docs/configure.md).
    assert f"older than most recent input {module}" in explain.stderr, explain.stdout + explain.stderr



def test_the_worker_s_spec_files_are_inputs_of_build_ninja(tmp_path, toolchain):
    """`--ext p2p --ext exl3-decode` read the worker's spec files (pp4_worker/specs/): an edit to
    either, a flag or a source, must re-run configure as an edit to a module of pp4 does."""
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext", "p2p",
                           "--ext", "exl3-decode", "--store", str(tmp_path / "store")],
                          cwd=work, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    query = subprocess.run([ninja_bin(), "-t", "query", "build.ninja"], cwd=work, capture_output=True, text=True)
    inputs = {ln.strip().lstrip("| ").strip() for ln in query.stdout.splitlines()}
    specs = [REPO / "pp4_worker" / "specs" / name for name in ("p2p.toml", "exl3-decode.toml")]
    assert {str(s) for s in specs} <= inputs, sorted(i for i in inputs if i.endswith(".toml"))

    later = os.stat(work / "build.ninja").st_mtime + 5
    saved = os.stat(specs[0])
    try:
        os.utime(specs[0], (later, later))
        explain = subprocess.run([ninja_bin(), "-d", "explain", "build.ninja"], cwd=work, capture_output=True,
                                 text=True)
    finally:
        os.utime(specs[0], ns=(saved.st_atime_ns, saved.st_mtime_ns))
    assert f"older than most recent input {specs[0]}" in explain.stderr, explain.stdout + explain.stderr
