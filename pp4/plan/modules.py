"""The compile plan: for each extension, its translation units and the exact flags of each compile.

The plan is pure data (attrs records): configure builds it, pp4.ninjafile writes it out, and the
build record and certificate name it. Flags follow torch.utils.cpp_extension (see pp4.torchflags);
the intentional differences are listed in docs/configure.md.
"""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path

import attrs

from pp4.plan.estimate import estimate_seconds
from pp4.plan.torchflags import COMMON_NVCC_FLAGS, SetuptoolsFlags, TorchBuildFlags
from pp4.sources.extensions import COMPILED_SUFFIXES, Extension
from pp4.toolchain.archs import ArchError, gencode_flags  # noqa: F401 (ArchError: callers catch it here)
from pp4.toolchain.archs import parse as parse_arch  # noqa: F401
from pp4.toolchain.compilerenv import Folded
from pp4.toolchain.compilers import Compilers, ccbin_from_flags
from pp4.toolchain.provision import Toolchain

# What a CppExtension does without (torch.utils.cpp_extension links these for CUDAExtension only).
CUDA_LIBRARIES = ("c10_cuda", "torch_cuda")
# The macro that tells a unit which module it is compiled for, as torch's builds define it.
MODULE_NAME_MACRO = "TORCH_EXTENSION_NAME"


class PlanError(Exception):
    """The requested plan cannot be made (e.g. an unknown architecture)."""


@attrs.frozen
class CompileStep:
    language: str  # "cuda" or "cxx"
    source: Path  # absolute
    object: Path  # relative to the build root, as ninja names it
    expected_ms: int | None  # measured duration used to order the edges, None when unknown


@attrs.frozen
class ModulePlan:
    extension: Extension
    output: Path  # the importable module, <module><EXT_SUFFIX>
    cuda_flags: tuple[str, ...]  # every nvcc argument but -MD -MF, -c, -o and the paths
    cxx_flags: tuple[str, ...]
    link_flags: tuple[str, ...]
    steps: tuple[CompileStep, ...]
    # The device link (relocatable device code, BuildExtension's dlink): nvcc's flags after
    # `nvcc OBJECTS -o DLINK`, and its output, linked into the module; () and None without one.
    dlink_flags: tuple[str, ...] = ()
    dlink_object: Path | None = None

    def link_inputs(self) -> list[str]:
        """What the module's link links: the objects, then the device link's output."""
        return [str(s.object) for s in self.steps] + ([str(self.dlink_object)] if self.dlink_object else [])

    def flags_for(self, step: CompileStep) -> tuple[str, ...]:
        return self.cuda_flags if step.language == "cuda" else self.cxx_flags


def _relative(path: Path, root: Path) -> Path:
    """Paths inside the build root are written relative to it, so the tree can be moved."""
    try:
        return Path(os.path.relpath(path, root)) if path.is_relative_to(root) else path
    except ValueError:
        return path


def object_path(builddir: Path, ext: Extension, source: Path) -> Path:
    """Where a source's object goes: always under the build folder, named by the source's path
    below its extension's root; a source outside the root (`../`, absolute) gets its absolute path
    under _outside/, so two sources never share an object and no object lands beside a source."""
    rel = os.path.relpath(source, ext.root)
    if rel == ".." or rel.startswith(".." + os.sep):
        rel = os.path.join("_outside", str(source).lstrip(os.sep))
    return builddir / ext.target / "obj" / (rel + ".o")


def module_plan(ext: Extension, torch: TorchBuildFlags, toolchain: Toolchain, archs: list[str],
                builddir: Path, root: Path, durations: dict[str, int] | None = None,
                supported_archs: list[str] | None = None, compilers: Compilers | None = None,
                folded: Folded | None = None, setuptools: SetuptoolsFlags | None = None) -> ModulePlan:
    """compilers: configure's choice (the host compiler nvcc runs goes in as an absolute -ccbin);
    folded: the toolchain variables configure took from the environment (pp4/toolchain/compilerenv.py);
    setuptools: what build_ext adds, for extensions of the "setuptools" flavor (from a setup.py)."""
    durations = durations or {}
    folded = folded or Folded()
    if ext.flavor == "setuptools":
        if setuptools is None:
            raise PlanError(f"extension {ext.target} is built as setuptools builds it, but no setuptools flags were given")
        cxx, cuda = _setuptools_compile_flags(ext, torch, toolchain, archs, supported_archs, folded, setuptools)
    else:
        cxx, cuda = _jit_compile_flags(ext, torch, toolchain, archs, supported_archs, folded)
    if compilers is not None:
        cuda += ["-ccbin", compilers.ccbin]
    cuda += [*_env_dirs(folded), *folded.append_flags]
    with_cuda = ext.kind == "cuda"
    libraries = [lib for lib in torch.libraries if with_cuda or lib not in CUDA_LIBRARIES]
    link = [f"-L{torch.lib_dir}", *(f"-l{lib}" for lib in libraries)]
    if with_cuda:
        link += [f"-L{toolchain.lib_dir}", "-lcudart"]
    # Found without LD_LIBRARY_PATH: torch's libraries, and the CUDA runtime torch itself loads.
    link.append(f"-Wl,-rpath,{torch.lib_dir}")
    if with_cuda and torch.cuda_runtime_lib_dir is not None:
        link.append(f"-Wl,-rpath,{torch.cuda_runtime_lib_dir}")
    link += [f"-L{d}" for d in ext.library_paths()] + [f"-l{lib}" for lib in ext.libraries]
    link += list(ext.ld_flags)
    builddir_rel = _relative(builddir, root)
    steps = []
    for source in ext.source_paths():
        obj = object_path(builddir_rel, ext, source)
        steps.append(CompileStep(COMPILED_SUFFIXES[source.suffix], source, obj, durations.get(str(obj))))
    output = builddir_rel / ext.target / f"{ext.module}{torch.ext_suffix}"
    dlink, dlink_object = (), None
    if ext.dlink_flags:
        # as BuildExtension's cuda_devlink rule: `$nvcc $in -o $out` then torch's nvcc flags, the
        # project's nvcc_dlink and the architectures (unless those name one)
        archs_given = any("arch" in f for f in ext.dlink_flags)
        dlink = (*folded.prepend_flags, *COMMON_NVCC_FLAGS, "--compiler-options", "-fPIC", *ext.dlink_flags,
                 *([] if archs_given else gencode_flags(archs, supported_archs)),
                 *(["-ccbin", compilers.ccbin] if compilers is not None else []), *folded.append_flags)
        dlink_object = builddir_rel / ext.target / "dlink.o"
    return ModulePlan(ext, output, tuple(cuda), tuple(cxx), tuple(link), tuple(steps), dlink, dlink_object)


def _macros(ext: Extension) -> list[str]:
    """The extension's macros and undefines, in the order setuptools writes them (before its -I)."""
    return ([f"-D{name}" if value is None else f"-D{name}={value}" for name, value in ext.define_macros]
            + [f"-U{name}" for name in ext.undef_macros])


def _env_dirs(folded: Folded) -> list[str]:
    """CPATH and CPLUS_INCLUDE_PATH, as gcc reads them: after every -I, and after every -isystem."""
    return [f"-I{d}" for d in folded.quote_dirs] + [a for d in folded.system_dirs for a in ("-isystem", d)]


def _jit_compile_flags(ext: Extension, torch: TorchBuildFlags, toolchain: Toolchain, archs: list[str],
                       supported_archs: list[str] | None, folded: Folded) -> tuple[list[str], list[str]]:
    """(C++ flags, nvcc flags) as torch.utils.cpp_extension.load builds: what pp4's own extensions
    and EXL3 (whose upstream builds it that way) use, and a spec's default."""
    common = [f"-D{MODULE_NAME_MACRO}={ext.module}", "-DTORCH_API_INCLUDE_EXTENSION_H", *_macros(ext)]
    common += [f"-I{inc}" for inc in ext.include_paths()]
    for inc in [*torch.include_dirs, toolchain.include_dir, torch.python_include]:
        common += ["-isystem", str(inc)]
    std = f"-std={torch.cxx_standard}"
    cxx = [*common, "-fPIC", std, *ext.cxx_flags, *_env_dirs(folded)]
    _, ext_cuda = ccbin_from_flags(list(ext.cuda_flags))  # replaced by the absolute path configure resolved
    cuda = [*folded.prepend_flags, *common, *COMMON_NVCC_FLAGS, *gencode_flags(archs, supported_archs),
            "--compiler-options", "-fPIC", *ext_cuda]
    if not any(f.startswith("-std=") for f in cuda):
        cuda.append(std)
    return cxx, cuda


def _setuptools_compile_flags(ext: Extension, torch: TorchBuildFlags, toolchain: Toolchain, archs: list[str],
                              supported_archs: list[str] | None, folded: Folded,
                              st: SetuptoolsFlags) -> tuple[list[str], list[str]]:
    """(C++ flags, nvcc flags) as torch's BuildExtension builds a setup.py's extension: Python's
    compiler flags, the macros, -I for the extension's folders, then torch's, CUDA's (a CUDA
    extension) and Python's; after them the project's own flags, torch's two defines, --arch's
    architectures where torch puts its own, and -std unless the project gave one. The order is
    BuildExtension's flag for flag, without its second -c (tests/test_setuppy_flags.py)."""
    includes = [*ext.include_paths(), *torch.include_dirs]
    if ext.kind == "cuda":
        includes.append(toolchain.include_dir)
    common = [*_macros(ext), *(f"-I{d}" for d in [*includes, *st.include_dirs])]
    defines = ["-DTORCH_API_INCLUDE_EXTENSION_H", f"-D{MODULE_NAME_MACRO}={ext.module}"]
    std = f"-std={torch.cxx_standard}"
    cxx = [*st.cflags, *common, *ext.cxx_flags, *defines]
    if not any(f.startswith("-std=") for f in ext.cxx_flags):
        cxx.append(std)
    _, ext_cuda = ccbin_from_flags(list(ext.cuda_flags))
    cuda = [*folded.prepend_flags, *common, *COMMON_NVCC_FLAGS, "--compiler-options", "-fPIC", *ext_cuda, *defines,
            *gencode_flags(archs, supported_archs)]
    if not any(f.startswith("-std=") for f in ext_cuda):
        cuda.append(std)
    return cxx + _env_dirs(folded), cuda


def longest_first(plans: list[ModulePlan], table: dict[str, int], scale: float = 1.0) -> list[tuple[ModulePlan, CompileStep]]:
    """All compile steps, longest expected first: ninja starts ready edges in the order they are written.

    A step's expected time is its measured duration (the previous .ninja_log, else the shipped
    table, looked up by the source path relative to its extension root), else the estimate from
    its text (pp4/plan/estimate.py); the table's and the estimate's times are the H200 machine's,
    times `scale` (machine_scale).
    """
    return [(p, s) for p, s, _ in sorted(
        ((p, s, expected_ms(p, s, table, scale)) for p in plans for s in p.steps),
        # Durations are bucketed (steps of about 19%) and ties keep source order, so the jitter of
        # re-measured compiles does not reshuffle build.ninja after every build.
        key=lambda i: (-_bucket(i[2]), str(i[1].source)))]


def expected_ms(plan: ModulePlan, step: CompileStep, table: dict[str, int], scale: float = 1.0) -> int:
    """This build's log, else the table's or the text's estimate (pp4/plan/estimate.py), which are
    the H200 machine's, times scale (machine_scale)."""
    if step.expected_ms is not None:
        return step.expected_ms
    known = table_ms(plan, step, table)
    if known is not None:
        return round(known * scale)
    return round(1000 * scale * estimate_seconds(step.source, tuple(plan.extension.include_paths())))


# Fewer units timed here than this, and the H200's figures stand as they are.
MIN_UNITS_FOR_SCALE = 3


def machine_scale(plans: list[ModulePlan], table: dict[str, int]) -> tuple[float, int]:
    """How much longer this machine takes than the H200 machine the shipped table was measured on:
    the median ratio over the units this build's log and the table both time, and how many there
    were; (1.0, n) when fewer than MIN_UNITS_FOR_SCALE."""
    ratios = []
    for p in plans:
        for s in p.steps:
            theirs = table_ms(p, s, table) if s.expected_ms is not None else None
            if theirs:
                ratios.append(s.expected_ms / theirs)
    if len(ratios) < MIN_UNITS_FOR_SCALE:
        return 1.0, len(ratios)
    return statistics.median(ratios), len(ratios)


def measured_ms(plan: ModulePlan, step: CompileStep, table: dict[str, int]) -> int | None:
    """This build's last duration of the step, else the shipped table's (table_ms); None when
    neither has it."""
    return step.expected_ms if step.expected_ms is not None else table_ms(plan, step, table)


def table_ms(plan: ModulePlan, step: CompileStep, table: dict[str, int]) -> int | None:
    """The shipped table's duration of the step (by the source's path below its extension root,
    the target's entry first), measured on the H200 machine; None when it has none."""
    rel = os.path.relpath(step.source, plan.extension.root)
    return table.get(f"{plan.extension.target}/{rel}", table.get(rel))


def _bucket(ms: int) -> int:
    return round(math.log2(max(ms, 1)) * 4)


def read_ninja_log(path: Path) -> dict[str, int]:
    """output path -> duration in ms of its last build, from ninja's .ninja_log (format v5 and later)."""
    durations: dict[str, int] = {}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return durations
    for line in lines[1:]:
        parts = line.split("\t")
        if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
            durations[parts[3]] = int(parts[1]) - int(parts[0])
    return durations


def read_duration_table(path: Path) -> dict[str, int]:
    """A shipped table of measured durations: `source<TAB>milliseconds` lines, # comments."""
    table: dict[str, int] = {}
    if not path.is_file():
        return table
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, ms = line.rsplit("\t", 1)
            if ms.strip().isdigit():
                table[name.strip()] = int(ms)
    return table
