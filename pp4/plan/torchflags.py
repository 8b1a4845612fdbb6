"""The flags an extension needs from the installed torch, derived as torch.utils.cpp_extension does.

Derived from files, without importing torch (seconds, and its cpp_extension module goes looking for
a CUDA_HOME of its own). tests/test_plan.py has torch write its own build.ninja for the same sources
and compares flag by flag; docs/configure.md lists each intentional difference.
"""

from __future__ import annotations

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
