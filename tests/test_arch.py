"""--arch as configure.py --help and docs/configure.md write it (a list, +PTX) reaches nvcc as the
right -gencode flags: a real compile with the pinned nvcc, and what the object holds read back by
tools that are not pp4's."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_build import ninja_bin, run

pytestmark = pytest.mark.slow

FIXTURE = REPO / "tests" / "fixtures" / "ptx"
OBJECT = "build/pp4_ptx_fixture/obj/src/kernel.cu.o"
PTX, ELF = 1, 2  # fatbin entry kinds


def fatbin_entries(obj: Path, tmp: Path) -> set[tuple[str, int]]:
    """("ptx"|"elf", sm) for each entry of the object's .nv_fatbin section. The section is cut out
    by binutils' objcopy and read by the fatbin layout NVIDIA's own tools use (a 16-byte header,
    magic 0xBA55ED50; each entry's header starts with its kind, 1 PTX or 2 ELF, its header size and
    payload size, and holds the architecture at byte 28): nothing of pp4 reads it."""
    section = tmp / "fatbin.bin"
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", str(obj), str(section)], check=True)
    data = section.read_bytes()
    magic, _, header, size = struct.unpack_from("<IHHQ", data, 0)
    assert magic == 0xBA55ED50, f"{obj}: no fatbin in .nv_fatbin"
    entries, off = set(), header
    while off < header + size:
        kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, off)
        (arch,) = struct.unpack_from("<I", data, off + 28)
        entries.add(({PTX: "ptx", ELF: "elf"}[kind], arch))
        off += entry_header + payload
    return entries


def cuobjdump(toolchain) -> str | None:
    """NVIDIA's cuobjdump, where one is here: the pinned toolchain's (the CUDA 13.0 lock has no
    cuobjdump wheel), $PP4_CUOBJDUMP, or PATH (pip install nvidia-cuda-cuobjdump puts one under
    nvidia/cu13/bin)."""
    for candidate in (toolchain.prefix / "bin" / "cuobjdump", os.environ.get("PP4_CUOBJDUMP"),
                      shutil.which("cuobjdump")):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def test_an_arch_list_with_ptx_compiles_sass_for_each_and_ptx_where_asked(tmp_path, toolchain):
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # Before issue 55 configure stopped here: its probe compile asked nvcc for compute_90+PTX.
    run([sys.executable, str(REPO / "configure.py"), "--arch", "8.0,9.0+PTX", "--ext-spec", str(FIXTURE / "ext.toml"),
         "--no-reuse"], work, env)
    run([ninja_bin(), OBJECT], work, env)
    assert fatbin_entries(work / OBJECT, tmp_path) == {("elf", 80), ("elf", 90), ("ptx", 90)}
    tool = cuobjdump(toolchain)
    if tool:  # the same from NVIDIA's reader, where there is one
        ptx = subprocess.run([tool, "--list-ptx", str(work / OBJECT)], capture_output=True, text=True, check=True)
        elf = subprocess.run([tool, "--list-elf", str(work / OBJECT)], capture_output=True, text=True, check=True)
        # "PTX file    1: kernel.cu.1.sm_90.ptx", "ELF file    1: kernel.cu.1.sm_80.cubin", ...
        assert re.findall(r"\.(sm_\d+)\.ptx$", ptx.stdout, re.M) == ["sm_90"], ptx.stdout
        assert sorted(re.findall(r"\.(sm_\d+)\.cubin$", elf.stdout, re.M)) == ["sm_80", "sm_90"], elf.stdout


def test_a_malformed_arch_is_refused_before_anything_is_provisioned(tmp_path):
    proc = run([sys.executable, str(REPO / "configure.py"), "--arch", "8.0,9.0+ptx"], tmp_path,
               {**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("configure.py: error: --arch '9.0+ptx' is not a compute capability: "
                                          "write it as MAJOR.MINOR"), proc.stderr
    assert not (tmp_path / "build.ninja").exists()
