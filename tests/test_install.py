"""pp4 installed from a wheel (`pip install .`, not `-e`) builds a spec project: every file pp4 reads at
run time is in the package (pyproject.toml's package data), and nothing it runs needs the checkout.

The wheel is built from a copy of what a clone holds, installed into a fresh venv, which borrows
torch and pp4's dependencies from the running venv through a .pth line naming its site-packages (the
.pth files there are not processed, so an editable pp4 installed there stays out of sight). Then, in
a folder outside the checkout: `python -m pp4.configure`, `ninja` (the observer built from the
installed package's C sources, into a cache of the test's own, and the compile stored through the
reuse rule), and, with the build folder gone, ninja's own re-run of configure, every object
restored from the store."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import REPO
from test_specs_build import compiled, ninja_bin

SPEC = """\
[[extension]]
name = "pp4_installed"
kind = "cpp"
sources = ["installed.cpp"]
"""

SOURCE = """\
#include <pybind11/pybind11.h>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("answer", []() { return 42; });
}
"""


def run(cmd, cwd, env):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def clone_files(dest: Path) -> Path:
    """What a clone of this checkout holds (tracked files, and new ones git does not ignore), copied
    to dest: the wheel is built from there, so that setuptools writes nothing into the checkout."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True)
    if listed.returncode != 0:  # not a git checkout: the folder, less what never goes in git
        shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(".git", ".venv", ".pp4-cache", "build*", "dist",
                                                                  "__pycache__", "*.egg-info", ".pytest_cache"))
        return dest
    for name in listed.stdout.decode().split("\0"):
        if name and (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


def package_files(top: Path) -> set[str]:
    """Every file of the pp4 packages under top (pp4 and any pp4_* beside it), bytecode aside."""
    return {p.relative_to(top).as_posix() for pkg in top.glob("pp4*") if (pkg / "__init__.py").is_file()
            for p in pkg.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.slow
def test_an_installed_pp4_configures_and_builds_a_spec_project_without_the_checkout(tmp_path, toolchain,
                                                                                    shared_cache):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    source = clone_files(tmp_path / "source")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp_path / "wheels",
         source], tmp_path, env)
    (wheel,) = (tmp_path / "wheels").glob("pp4-*.whl")

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, env)
    python = venv / "bin" / "python"
    # Installed before the .pth is written: with the running venv in sight, pip would see its pp4.
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel], tmp_path, env)
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path,
                    env).stdout.strip())
    borrowed = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "borrowed-from-the-test-venv.pth").write_text("".join(f"{p}\n" for p in borrowed))
    where = run([python, "-c", "import pp4, torch; print(pp4.__file__)"], tmp_path, env).stdout.strip()
    assert Path(where).is_relative_to(site), f"pp4 comes from {where}, not the wheel installed in {site}"

    # The package ships whole: every file of the checkout's package folders is installed.
    missing = sorted(package_files(source) - package_files(site))
    assert not missing, f"in the checkout's packages but not in the wheel (pyproject.toml's package data): {missing}"

    project, work = tmp_path / "project", tmp_path / "work"
    project.mkdir()
    work.mkdir()
    (project / "spec.toml").write_text(SPEC)
    (project / "installed.cpp").write_text(SOURCE)
    # A cache of the test's own, where the observer is built from the installed sources; the toolchain
    # comes from the shared cache (--cache-dir), provisioned already.
    env["PP4_CACHE_DIR"] = str(tmp_path / "cache")
    configured = run([python, "-m", "pp4.configure", "--arch", "9.0", "--ext-spec", project / "spec.toml",
                      "--store", tmp_path / "store", "--cache-dir", shared_cache], work, env)
    assert "python -m pp4.configure" in configured.stdout, configured.stdout
    text = (work / "build.ninja").read_text()
    assert "configure = -m pp4.configure" in text, "build.ninja's regeneration edge must re-run the module"
    assert f"{REPO}/pp4/" not in text and str(REPO / "configure.py") not in text, "build.ninja names the checkout"
    query = run([ninja_bin(), "-t", "query", "build.ninja"], work, env).stdout
    assert str(site / "pp4" / "configure" / "__main__.py") in query, "the installed configure is not an input"

    built = run([ninja_bin()], work, env)
    assert compiled(built.stdout) == ["build/pp4_installed/obj/installed.cpp.o"], built.stdout
    cert = json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))
    assert [o["status"] for o in cert["objects"]] == ["compiled"], cert["objects"]
    load = ("import json; from pp4.certify.loader import load_target; "
            "m = load_target('pp4_installed', 'build'); print(json.dumps([m.answer(), m.__file__]))")
    answer, module = json.loads(run([python, "-c", load], work, env).stdout.strip().splitlines()[-1])
    assert answer == 42 and Path(module).is_relative_to(work / "build"), module
    observer = list((tmp_path / "cache" / "observer").glob("*/pp4-observe"))
    assert observer, "the observer was not built from the installed package's sources"

    # The build folder gone: ninja re-runs configure as it was run (the module), and the store,
    # which holds only what the observer saw whole, gives the object back.
    shutil.rmtree(work / "build")
    again = run([ninja_bin()], work, env)
    assert "CONFIGURE" in again.stdout and "1 object (1 from the local store)" in again.stdout, again.stdout
    cert = json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))
    assert [o["status"] for o in cert["objects"]] == ["reused"], cert["objects"]
    assert json.loads(run([python, "-c", load], work, env).stdout.strip().splitlines()[-1])[0] == 42
