"""The flags an extension needs from the installed torch, derived as torch.utils.cpp_extension does.

Derived from files, without importing torch (seconds, and its cpp_extension module goes looking for
a CUDA_HOME of its own). tests/test_plan.py has torch write its own build.ninja for the same sources
and compares flag by flag; docs/configure.md lists each intentional difference.
"""

from __future__ import annotations

import os
import re
import sysconfig
from pathlib import Path

import attrs

from pp4.toolchain.torchenv import torch_package_dir, torch_version

# torch.utils.cpp_extension.COMMON_NVCC_FLAGS: torch's headers are written for these.
COMMON_NVCC_FLAGS = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
)
# Headers where torch states the C++ standard it needs (#if __cplusplus < 2020xxL #error ...).
_STANDARD_HEADERS = ("torch/headeronly/macros/Macros.h", "c10/macros/Macros.h", "ATen/ATen.h")


@attrs.frozen
class TorchBuildFlags:
    version: str
    include_dirs: tuple[Path, ...]  # -isystem, in torch's order
    python_include: Path
    lib_dir: Path
    cxx_standard: str  # "c++20" for torch 2.14, "c++17" for 2.11
    ext_suffix: str  # ".cpython-311-x86_64-linux-gnu.so"
    libraries: tuple[str, ...]  # -l names, in torch's order
    cuda_runtime_lib_dir: Path | None  # where torch's own libcudart.so.13 lives (for rpath)


def cxx_standard(include_root: Path) -> str:
    for rel in _STANDARD_HEADERS:
        p = include_root / rel
        if p.is_file():
            text = p.read_text(errors="replace")
            if re.search(r"__cplusplus\s*<\s*202002L", text):
                return "c++20"
    return "c++17"


# A -std value's year: gcc's and nvcc's spellings, GNU dialects too (gnu++17 is C++17 with extensions).
_YEARS = {"98": 1998, "03": 2003, "0x": 2011, "11": 2011, "1y": 2014, "14": 2014, "1z": 2017, "17": 2017,
          "2a": 2020, "20": 2020, "2b": 2023, "23": 2023, "2c": 2026, "26": 2026}


def standard_year(value: str) -> int | None:
    """"c++17", "gnu++2a" -> 2017, 2020; None for what is not a C++ standard."""
    m = re.fullmatch(r"(?:c|gnu)\+\+(\w\w)", value)
    return _YEARS.get(m.group(1)) if m else None


def older_standard(flags, needed: str) -> str | None:
    """The -std flag of a compile's flags (the last wins, as in gcc and nvcc) when it names an older C++
    than `needed` (torch's, e.g. "c++20"); None when none does."""
    given = [f for f in flags if f.startswith("-std=")]
    year, want = (standard_year(given[-1][len("-std="):]) if given else None), standard_year(needed)
    return given[-1] if year is not None and want is not None and year < want else None


@attrs.frozen
class SetuptoolsFlags:
    """What setuptools' build_ext adds to every compile of a setup.py build (torch's BuildExtension
    keeps it): Python's own compiler flags first, its include folders after the extension's."""

    cflags: tuple[str, ...]  # compiler_so[1:]: sysconfig's CFLAGS and CCSHARED, then $CFLAGS and $CPPFLAGS
    include_dirs: tuple[Path, ...]  # a virtual environment's include folder, then Python's


def setuptools_flags(env: dict[str, str]) -> SetuptoolsFlags:
    """As setuptools computes them (its own customize_compiler and build_ext rules), for the
    environment configure runs in: $CFLAGS and $CPPFLAGS are read here and written into the commands."""
    import sys

    from setuptools._distutils import ccompiler
    from setuptools._distutils import sysconfig as du_sysconfig

    saved = {k: os.environ.get(k) for k in ("CC", "CFLAGS", "CPPFLAGS", "CCSHARED")}
    try:
        for k in saved:
            if k in env:
                os.environ[k] = env[k]
            else:
                os.environ.pop(k, None)
        compiler = ccompiler.new_compiler()
        du_sysconfig.customize_compiler(compiler)
        cflags = tuple(compiler.compiler_so[1:])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    include = [Path(sys.exec_prefix) / "include"] if sys.exec_prefix != sys.base_exec_prefix else []
    py_include, plat_include = du_sysconfig.get_python_inc(), du_sysconfig.get_python_inc(plat_specific=True)
    include += [Path(d) for d in py_include.split(os.pathsep)]
    if plat_include != py_include:
        include += [Path(d) for d in plat_include.split(os.pathsep)]
    return SetuptoolsFlags(cflags, tuple(include))


def torch_build_flags(wheel_root: str = "nvidia/cu13") -> TorchBuildFlags:
    torch_dir = torch_package_dir()
    include = torch_dir / "include"
    site = torch_dir.parent
    cudart = site / wheel_root / "lib"
    return TorchBuildFlags(
        version=torch_version(),
        include_dirs=(include, include / "torch" / "csrc" / "api" / "include"),
        python_include=Path(sysconfig.get_path("include", scheme="posix_prefix")),
        lib_dir=torch_dir / "lib",
        cxx_standard=cxx_standard(include),
        ext_suffix=sysconfig.get_config_var("EXT_SUFFIX"),
        libraries=("c10", "c10_cuda", "torch_cpu", "torch_cuda", "torch", "torch_python"),
        cuda_runtime_lib_dir=cudart if (cudart / "libcudart.so.13").exists() or cudart.is_dir() else None,
    )
