"""Relocatable device code end to end (issue 65): a module whose CUDA units call each other's
__device__ functions (-rdc=true) gets the device link BuildExtension makes (`nvcc -dlink` of the
objects into dlink.o, linked into the module), from a spec and from a setup.py; the module imports;
the device link is observed, stored, restored and certified like a link; and a module left without
one is refused by its link's own check, never certified. The oracle of which CUDA registration
symbols a loadable module leaves undefined is torch's own BuildExtension build of the same setup.py."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_build import ninja_bin, run

from pp4.sources import setuppy

pytestmark = pytest.mark.slow

FIXTURE = REPO / "tests" / "fixtures" / "rdc"
MODULE = "build/pp4_rdc_fixture/pp4_rdc_fixture" + __import__("sysconfig").get_config_var("EXT_SUFFIX")
LINKED_BINARY = b"__cudaRegisterLinkedBinary_"


def env_for(tmp_path: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def configure(work: Path, store: Path, *args: str):
    work.mkdir(parents=True, exist_ok=True)
    return run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--store", str(store), *args], work,
               env_for(work))


def imports(module: Path) -> subprocess.CompletedProcess:
    """Import the module in a fresh Python (torch first, as a user would): dlopen resolves every symbol."""
    code = (f"import sys, torch; sys.path.insert(0, {str(module.parent)!r}); import pp4_rdc_fixture as m; "
            "assert m.launch")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def undefined_dynamic_symbols(path: str) -> list[bytes]:
    """binutils' reading of the module's undefined dynamic symbols (not pp4's own ELF reader)."""
    out = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True, check=True).stdout
    return [line.split()[-1].split(b"@")[0] for line in out.splitlines() if line.strip()]


def cuda_undefined(path: Path) -> set[bytes]:
    return {n for n in undefined_dynamic_symbols(str(path)) if n.startswith(b"__cuda")}


def certificate(work: Path) -> dict:
    return json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))


@pytest.fixture(scope="module")
def spec_build(tmp_path_factory, toolchain):
    tmp = tmp_path_factory.mktemp("rdc")
    work, store = tmp / "spec", tmp / "store"
    configure(work, store, "--ext-spec", str(FIXTURE / "ext.toml"))
    out = run([ninja_bin()], work, env_for(work)).stdout
    return work, store, out


def test_a_spec_with_rdc_gets_a_device_link_and_the_module_imports(spec_build):
    work, _, out = spec_build
    assert "DLINK build/pp4_rdc_fixture/dlink.o" in out
    module = work / MODULE
    assert not [n for n in undefined_dynamic_symbols(str(module)) if n.startswith(LINKED_BINARY)]
    proc = imports(module)
    assert proc.returncode == 0, proc.stderr
    run([ninja_bin(), "certify"], work, env_for(work))
    (mod,) = certificate(work)["modules"]
    dlink = mod["device_link"]
    # what the device link read: each CUDA object by its bytes, nvcc's own programs
    read = {Path(p).name for p, _ in dlink["inputs"]}
    assert {"scale.cu.o", "kernel.cu.o", "nvlink"} <= read, sorted(read)
    assert any(Path(p).name == "dlink.o" for p, _ in mod["link_inputs"])  # and the module's link read it


def test_the_device_link_is_restored_from_the_store(spec_build, tmp_path):
    work, store, _ = spec_build
    again = tmp_path / "again"  # another checkout's build: every object and both links from the store
    configure(again, store, "--ext-spec", str(FIXTURE / "ext.toml"))
    run([ninja_bin()], again, env_for(again))
    (mod,) = certificate(again)["modules"]
    assert mod["device_link"]["reuse"]["tier"] == "local", mod["device_link"]["reuse"]
    dlink_o = "build/pp4_rdc_fixture/dlink.o"
    assert (again / dlink_o).read_bytes() == (work / dlink_o).read_bytes()
    # restored with the mode nvcc gives it, so the module's link, which observes it, is restored too
    assert (again / dlink_o).stat().st_mode == (work / dlink_o).stat().st_mode
    assert mod["link_reuse"]["tier"] == "local", mod["link_reuse"]
    assert imports(again / MODULE).returncode == 0


def test_a_setup_py_device_link_loads_as_buildextensions_does(spec_build, tmp_path, toolchain):
    _, store, _ = spec_build
    project = tmp_path / "project"
    shutil.copytree(FIXTURE, project)
    work = tmp_path / "work"
    configure(work, store, "--setup-py", str(project))
    out = run([ninja_bin()], work, env_for(work)).stdout
    assert "DLINK build/pp4_rdc_fixture/dlink.o" in out
    mine = work / MODULE
    assert imports(mine).returncode == 0
    # the oracle: torch's BuildExtension builds the same setup.py with the same nvcc
    oracle = tmp_path / "oracle"
    shutil.copytree(FIXTURE, oracle)
    env = {**env_for(oracle), "CUDA_HOME": str(toolchain.prefix), "TORCH_CUDA_ARCH_LIST": "9.0", "MAX_JOBS": "2"}
    built = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=oracle, env=env,
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (theirs,) = oracle.glob("pp4_rdc_fixture*.so")
    assert imports(theirs).returncode == 0
    assert not [n for n in cuda_undefined(theirs) if n.startswith(LINKED_BINARY)]
    assert cuda_undefined(mine) == cuda_undefined(theirs)


def test_a_module_without_its_device_link_is_refused_by_its_link(spec_build, tmp_path):
    """A setup.py with -rdc=true and no dlink: BuildExtension makes a module that cannot load; pp4's
    link finds the registration symbols no device link defined and fails, naming the fix."""
    _, store, _ = spec_build
    project = tmp_path / "project"
    shutil.copytree(FIXTURE, project)
    text = (project / "setup.py").read_text()
    (project / "setup.py").write_text(text.replace(', "nvcc_dlink": ["-dlink"]', ""))
    work = tmp_path / "work"
    configure(work, store, "--setup-py", str(project))
    proc = run([ninja_bin()], work, env_for(work), check=False)
    assert proc.returncode != 0
    assert "cannot load: it leaves __cudaRegisterLinkedBinary_" in proc.stdout, proc.stdout
    assert "add dlink=True to the CUDAExtension in setup.py" in proc.stdout
    assert not (work / MODULE).exists() and not (work / "build" / "certificate.json.gz").exists()


def test_dlink_true_is_read_as_cudaextension_makes_it(tmp_path, toolchain):
    project = tmp_path / "project"
    shutil.copytree(FIXTURE, project)
    text = (project / "setup.py").read_text()
    (project / "setup.py").write_text(text.replace(', "nvcc_dlink": ["-dlink"]}', "}, dlink=True, "
                                                   "dlink_libraries=['cudadevrt'], library_dirs=['lib']"))
    (ext,) = setuppy.read(project, toolchain.prefix, ["9.0"]).extensions
    # CUDAExtension's nvcc_dlink: -dlink, -L each library folder, -l each dlink library (its -dlto
    # is left out with a notice: the pinned toolchain has no libnvvm)
    assert ext.dlink_flags == ("-dlink", f"-L{project / 'lib'}", "-lcudadevrt")
