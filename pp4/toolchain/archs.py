"""GPU architectures as --arch writes them, and the -gencode flags nvcc gets for them.

One place for both, because two callers turn an --arch value into nvcc flags: the compile plan
(pp4/plan/modules.py) and the compatibility check's probe compile (pp4/toolchain/compat.py). The
probe once did its own `arch.replace(".", "")`, which made `9.0+PTX` into `compute_90+PTX` and nvcc
refused it (issue 55).
"""

from __future__ import annotations

import re

_ARCH = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")
# What separates architectures in one --arch value: a comma, or the `;` and spaces torch's
# TORCH_CUDA_ARCH_LIST uses, so `--arch "8.0;9.0+PTX"` copied from there means the same.
_SEPARATORS = re.compile(r"[,;\s]+")


# The variable torch's BuildExtension takes its architectures from when the flags name none.
TORCH_ENV = "TORCH_CUDA_ARCH_LIST"

# torch's names for architecture families, in the order it replaces them (combined names before the
# single ones, so "Ampere+Tegra" is not read as "Ampere" then "+Tegra"): torch/utils/cpp_extension.py,
# _get_cuda_arch_flags. tests/test_archs.py checks them against torch's own function.
TORCH_NAMED = (
    ("Kepler+Tesla", "3.7"), ("Kepler", "3.5+PTX"), ("Maxwell+Tegra", "5.3"), ("Maxwell", "5.0;5.2+PTX"),
    ("Pascal", "6.0;6.1+PTX"), ("Volta+Tegra", "7.2"), ("Volta", "7.0+PTX"), ("Turing", "7.5+PTX"),
    ("Ampere+Tegra", "8.7"), ("Ampere", "8.0;8.6+PTX"), ("Ada", "8.9+PTX"), ("Hopper", "9.0+PTX"),
    ("Blackwell+Tegra", "11.0"), ("Blackwell", "10.0;10.3;12.0;12.1+PTX"), ("Rubin", "10.7+PTX"),
)


class ArchError(ValueError):
    """An --arch value that is not an architecture, or one this nvcc cannot compile for."""


def split(values: list[str]) -> list[str]:
    """["8.0,9.0+PTX", "8.6"] -> ["8.0", "9.0+PTX", "8.6"]: repeated --arch options and lists in one
    value both work; the first mention of an architecture keeps its place, repeats are dropped."""
    out: list[str] = []
    for value in values:
        parts = [p for p in _SEPARATORS.split(value.strip()) if p]
        if not parts:
            raise ArchError(f"--arch {value!r} names no architecture: write one as MAJOR.MINOR, e.g. --arch 9.0, "
                            "or several separated by commas, e.g. --arch 8.0,9.0+PTX")
        out.extend(p for p in parts if p not in out)
    return out


def from_torch_env(value: str | None) -> list[str]:
    """TORCH_CUDA_ARCH_LIST read as BuildExtension reads it: spaces are `;`, family names expand
    ("Hopper" -> 9.0+PTX), and unset, empty or "native" mean the visible GPUs' ([] here: the caller
    asks nvidia-smi). An element torch would refuse (an empty one, "Hopper+PTX") is refused here too."""
    if not value or value == "native":
        return []
    text = value.replace(" ", ";")
    for name, archs in TORCH_NAMED:
        text = text.replace(name, archs)
    out: list[str] = []
    for arch in text.split(";"):
        if not _ARCH.match(arch) or arch.endswith("f") or arch.endswith("f+PTX"):
            raise ArchError(f"{TORCH_ENV}={value!r}: {arch!r} is not an architecture torch's BuildExtension knows; "
                            "write them as MAJOR.MINOR separated by `;` (e.g. 8.0;9.0+PTX) or a family name "
                            "(Ampere, Hopper, ...), or pass --arch")
        out.extend([arch] if arch not in out else [])
    return out


def parse(arch: str, supported: list[str] | None = None) -> tuple[str, bool]:
    """"9.0" -> ("90", False); "9.0a+PTX" -> ("90a", True). Checked against nvcc's own list."""
    m = _ARCH.match(arch.strip())
    if not m:
        raise ArchError(
            f"--arch {arch!r} is not a compute capability: write it as MAJOR.MINOR, e.g. --arch 9.0 "
            "(optionally with an a/f suffix, 9.0a, or +PTX to embed PTX too, 9.0+PTX; several separated "
            "by commas, 8.0,9.0+PTX)"
        )
    cc = f"{m.group(1)}{m.group(2)}{m.group(3)}"
    # nvcc lists the base architectures; the a/f feature suffixes ride on them (sm_90a on sm_90).
    if supported is not None and f"sm_{m.group(1)}{m.group(2)}" not in supported:
        raise ArchError(
            f"--arch {arch}: this nvcc cannot compile for sm_{cc}; it supports {', '.join(map(dotted, supported))}"
        )
    return cc, bool(m.group(4))


def dotted(sm: str) -> str:
    """"sm_90a" -> "9.0a", the way --arch is written."""
    m = re.match(r"sm_(\d+)(\d)([a-z]?)$", sm)
    return f"{m.group(1)}.{m.group(2)}{m.group(3)}" if m else sm


def gencode_flags(archs: list[str], supported: list[str] | None = None) -> list[str]:
    """SASS for each architecture; with +PTX also its PTX (code=compute_XY), which the driver
    compiles at load time for GPUs newer than any SASS in the module."""
    flags = []
    for arch in archs:
        cc, ptx = parse(arch, supported)
        flags.append(f"-gencode=arch=compute_{cc},code=sm_{cc}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{cc},code=compute_{cc}")
    return flags
