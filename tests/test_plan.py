"""The compile plan against torch's own: torch writes its build.ninja for the same sources, and the
flags are compared one by one. Every difference must be one of those docs/configure.md lists."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from pp4.plan import modules as plan
from pp4.plan.torchflags import torch_build_flags
from pp4.sources.extensions import Extension
from pp4.toolchain import archs

# Each intentional difference, as documented in docs/configure.md.
OURS_ONLY_LINK = {"-Wl,-rpath,{torch_lib}", "-Wl,-rpath,{cudart_lib}"}


def _torch_ninja(tmp_path: Path, toolchain, sources: list[Path]) -> dict[str, list[str]]:
    """torch.utils.cpp_extension's own build.ninja variables for these sources (CUDA_HOME = our prefix)."""
    code = f"""
import inspect, sys
import torch.utils.cpp_extension as ce
kw = dict(path={str(tmp_path / 'torch.ninja')!r}, name='fixture', sources={[str(s) for s in sources]!r},
          extra_cflags=['-O2'], extra_cuda_cflags=['-O2'], extra_sycl_cflags=[], extra_ldflags=[],
          extra_include_paths=[], with_cuda=True, with_sycl=False, is_standalone=False)
params = inspect.signature(ce._write_ninja_file_to_build_library).parameters
ce._write_ninja_file_to_build_library(**{{k: v for k, v in kw.items() if k in params}})
ld = ce._prepare_ldflags([], True, False, False, False) if 'with_sycl' in inspect.signature(ce._prepare_ldflags).parameters \
     else ce._prepare_ldflags([], True, False, False)
print('LDFLAGS=' + ' '.join(ld))
"""
    env = dict(os.environ, CUDA_HOME=str(toolchain.prefix), TORCH_CUDA_ARCH_LIST="9.0")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "torch.ninja").read_text()
    out = {}
    for name in ("cflags", "cuda_cflags"):
        m = re.search(rf"^{name} = (.*)$", text, re.M)
        out[name] = shlex.split(m.group(1))
    out["ldflags"] = proc.stdout.split("LDFLAGS=", 1)[1].split()
    rules = {n: re.search(rf"^rule {n}\n(?:  .*\n)*?  command = (.*)$", text, re.M).group(1) for n in ("compile", "cuda_compile")}
    out["rules"] = rules
    return out


def _pairs(flags: list[str]) -> list[str]:
    """-isystem DIR as one item, so order and values compare as torch writes them."""
    out, i = [], 0
    while i < len(flags):
        if flags[i] in ("-isystem", "--compiler-options", "-Xcompiler") and i + 1 < len(flags):
            out.append(f"{flags[i]} {flags[i + 1]}")
            i += 2
        else:
            out.append(flags[i])
            i += 1
    return out


def test_flags_match_torch_cpp_extension(tmp_path, toolchain):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.cpp").write_text("int a() { return 1; }\n")
    (src / "b.cu").write_text("__global__ void b() {}\n")
    ext = Extension(target="fixture", module="fixture", root=src, sources=("a.cpp", "b.cu"),
                    cxx_flags=("-O2",), cuda_flags=("-O2",))
    torch_flags = torch_build_flags()
    ours = plan.module_plan(ext, torch_flags, toolchain, ["9.0"], tmp_path / "build", tmp_path)
    theirs = _torch_ninja(tmp_path, toolchain, [src / "a.cpp", src / "b.cu"])

    # pp4 adds nothing: the fixed execution root, not a flag, makes objects independent of folders.
    assert _pairs(list(ours.cxx_flags)) == _pairs(theirs["cflags"])
    # torch writes --compiler-options '-fPIC' for a shell; we hold arguments unquoted.
    assert _pairs(list(ours.cuda_flags)) == _pairs(theirs["cuda_cflags"])

    subs = {"torch_lib": str(torch_flags.lib_dir), "cudart_lib": str(torch_flags.cuda_runtime_lib_dir)}
    ours_only = {f.format(**subs) for f in OURS_ONLY_LINK}
    assert [f for f in ours.link_flags if f not in ours_only] == theirs["ldflags"]
    # The dependency-file difference: torch's C++ rule uses -MMD, which leaves -isystem headers out.
    assert "-MMD" in theirs["rules"]["compile"]
    assert "-MD " in theirs["rules"]["cuda_compile"]
    rules = (REPO / "pp4" / "plan" / "build.ninja.in").read_text()
    commands = [ln for ln in rules.splitlines() if ln.strip().startswith("command =")]
    assert any("$cxx -MD -MF $out.d" in c for c in commands) and any("$nvcc -MD -MF $out.d" in c for c in commands)
    assert not any("-MMD" in c for c in commands)


@pytest.mark.parametrize("arch,expected", [
    ("9.0", ["-gencode=arch=compute_90,code=sm_90"]),
    ("9.0a", ["-gencode=arch=compute_90a,code=sm_90a"]),
    ("8.6+PTX", ["-gencode=arch=compute_86,code=sm_86", "-gencode=arch=compute_86,code=compute_86"]),
])
def test_gencode_flags(arch, expected):
    assert plan.gencode_flags([arch], ["sm_80", "sm_86", "sm_90"]) == expected


def test_unknown_arch_is_refused_with_the_supported_list():
    with pytest.raises(plan.ArchError) as e:
        plan.gencode_flags(["4.2"], ["sm_75", "sm_90", "sm_100"])
    assert str(e.value) == "--arch 4.2: this nvcc cannot compile for sm_42; it supports 7.5, 9.0, 10.0"
    with pytest.raises(plan.ArchError, match=r"--arch 'ninety' is not a compute capability: write it as MAJOR.MINOR"):
        plan.gencode_flags(["ninety"], None)


@pytest.mark.parametrize("given,expected", [
    (["9.0"], ["9.0"]),
    (["8.0,9.0+PTX"], ["8.0", "9.0+PTX"]),
    (["8.0;9.0+PTX"], ["8.0", "9.0+PTX"]),  # TORCH_CUDA_ARCH_LIST's spelling
    (["8.0 9.0", "9.0", "8.6"], ["8.0", "9.0", "8.6"]),  # repeats dropped, first place kept
    ([" 9.0a , 10.0+PTX "], ["9.0a", "10.0+PTX"]),
])
def test_arch_lists_split_as_documented(given, expected):
    assert archs.split(given) == expected


def test_an_empty_arch_value_is_refused():
    with pytest.raises(archs.ArchError, match=r"--arch ',' names no architecture: .* --arch 8.0,9.0\+PTX"):
        archs.split([","])


def test_longest_first_uses_log_then_table_then_the_estimate(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    # A big plain C++ file, and a tiny CUDA unit that reaches torch's headers through a project header
    # and invokes its instantiation macro: source size would put the tiny one last.
    (root / "big.cpp").write_text("int f%d(int x) { return x + %d; }\n" * 2000 % tuple(v for i in range(2000) for v in (i, i)))
    (root / "inst.cuh").write_text("#include <torch/extension.h>\n#define INSTANCES(n) " +
                                   " \\\n  ".join(f"template __global__ void k<{i}, n>(float*);" for i in range(200)) + "\n")
    (root / "tiny.cu").write_text('#include "inst.cuh"\nINSTANCES(8)\n')
    for name in ("a.cu", "b.cu"):
        (root / name).write_text("x")
    ext = Extension(target="t", module="t", root=root, sources=("a.cu", "b.cu", "big.cpp", "tiny.cu"))

    def step(name, ms):
        return plan.CompileStep("cuda", root / name, Path(f"build/t/obj/{name}.o"), ms)

    p = plan.ModulePlan(ext, Path("m.so"), (), (), (), (step("a.cu", 5_000), step("b.cu", None), step("big.cpp", None),
                                                        step("tiny.cu", None)))
    order = [s.source.name for _, s in plan.longest_first([p], {"t/b.cu": 600_000})]
    assert order == ["b.cu", "tiny.cu", "a.cu", "big.cpp"]
    assert (root / "big.cpp").stat().st_size > 100 * (root / "tiny.cu").stat().st_size


def test_the_estimate_names_torchs_headers_but_never_walks_them(tmp_path):
    """torch-lfilter's setup.py lists torch's include folders as its own: the estimate must still
    count only the project's code (torch's 14,000 headers made its one unit "about 2 min" for 29 s,
    and cost configure 1.4 s of reading them)."""
    from pp4.plan import estimate
    from pp4.plan.torchflags import torch_build_flags

    root = tmp_path / "src"
    root.mkdir()
    (root / "op.cpp").write_text('#include <torch/extension.h>\n#include "own.h"\nint f() { return OWN; }\n')
    (root / "own.h").write_text("#define OWN 1\n")
    torch_dirs = tuple(torch_build_flags().include_dirs)
    assert (torch_dirs[0] / "torch" / "extension.h").is_file()
    alone = estimate.features(root / "op.cpp", (root,))
    with_torch = estimate.features(root / "op.cpp", (root, *torch_dirs))
    assert with_torch == alone and alone[0] is True  # torch's whole C++ API, by name
    assert alone[4] == pytest.approx((len((root / "op.cpp").read_bytes()) + len((root / "own.h").read_bytes())) / 1000)


def test_the_estimate_counts_kernel_instantiations_through_class_templates_and_macros(tmp_path):
    """exllamav2's three longest units are 13 lines each: a class template lists 22 kernel
    instantiations, and each unit names four of its instances (88). exllamav3's instance units pass
    one macro to another by name (FOREACH(INST, ...)). A kernel launched (`k<<<...>>>`) or merely
    declared is no instantiation; a template that reaches itself adds nothing more."""
    from pp4.plan import estimate

    root = tmp_path / "src"
    root.mkdir()
    (root / "kernels.cuh").write_text(
        "template <int m, int p, bool r>\n__global__ void __launch_bounds__(128) gemm_kernel(const int* a)\n{ }\n"
        "template <int m> __global__ void declared_kernel(int*);\n"
        "__global__ void plain_kernel(int* a) { }\n")
    (root / "select.cuh").write_text(
        '#include <ATen/cuda/CUDAContext.h>\n#include "kernels.cuh"\n'
        "template <int m, bool r>\nstruct map_m {\n  static constexpr void* pick(int perm) {\n    switch (perm) {\n"
        + "".join(f"      case {i}: return (void*) gemm_kernel<m, {i}, r>;\n" for i in range(22))
        + "      default: return map_m<m, r>::pick(0);\n    }\n  }\n};\n"
        "template <int n>\nvoid launch(int* a) { gemm_kernel<n, 0, false><<<1, 32>>>(a); plain_kernel<<<1, 1>>>(a); }\n"
        "#define INST(S, bits) (void*) gemm_kernel<bits, S, true>,\n"
        "#define FOREACH(X, ...) X(1, __VA_ARGS__) X(2, __VA_ARGS__) X(3, __VA_ARGS__)\n"
        "#define INSTANCES(bits) void* table_##bits[] = { FOREACH(INST, bits) FOREACH(INST, bits) };\n")
    (root / "unit_b.cu").write_text('#include "select.cuh"\nvoid* pick(int m, int perm) {\n'
                                    + "".join(f"  if (m == {i}) return map_m<{i}, false>::pick(perm);\n" for i in range(1, 5))
                                    + "  return 0;\n}\n")
    (root / "unit_inst.cu").write_text('#include "select.cuh"\nINSTANCES(4)\nINSTANCES(5)\n')
    (root / "unit_launch.cu").write_text('#include "select.cuh"\nvoid go(int* a) { launch<1>(a); launch<2>(a); '
                                         'declared_kernel<3>; plain_kernel<<<1, 1>>>(a); }\n')
    (root / "bindings.cpp").write_text('#include <torch/extension.h>\nint f() { return 1; }\n' + "// comment\n" * 400)

    def kernels(name):
        return estimate.features(root / name, (root,))[5]

    assert kernels("unit_b.cu") == 4 * 22
    assert kernels("unit_inst.cu") == 2 * 2 * 3
    assert kernels("unit_launch.cu") == 2  # launch<n> instantiates gemm_kernel<n, 0, false> once each
    assert kernels("bindings.cpp") == 0
    # A project's CUDA unit of 88 instantiations outranks its torch/extension.h bindings, as exllamav2's
    # unit_exl2_1b.cu (59-70 s on two cores) does its ext_qattn.cpp (42 s).
    assert estimate.estimate_seconds(root / "unit_b.cu", (root,)) > estimate.estimate_seconds(root / "bindings.cpp", (root,))


def test_the_h200_figures_are_scaled_by_how_this_machine_compared(tmp_path):
    """Three units timed here and in the shipped table took 2x, 3x and 4x: the table's figure for
    a unit not timed here, and the text estimate, are scaled by the median, 3x; a unit's own log
    figure stands."""
    root = tmp_path / "src"
    root.mkdir()
    names = ("a.cu", "b.cu", "c.cu", "d.cu", "e.cu")
    for name in names:
        (root / name).write_text("__global__ void k() {}\n")
    ext = Extension(target="t", module="t", root=root, sources=names)

    def step(name, ms):
        return plan.CompileStep("cuda", root / name, Path(f"build/t/obj/{name}.o"), ms)

    table = {"t/a.cu": 1000, "t/b.cu": 1000, "t/c.cu": 1000, "t/d.cu": 10_000}
    timed = plan.ModulePlan(ext, Path("m.so"), (), (), (), (step("a.cu", 2000), step("b.cu", 3000), step("c.cu", 4000),
                                                            step("d.cu", None), step("e.cu", None)))
    assert plan.machine_scale([timed], table) == (3.0, 3)
    d, e = timed.steps[3], timed.steps[4]
    assert plan.expected_ms(timed, d, table, 3.0) == 30_000
    assert abs(plan.expected_ms(timed, e, table, 3.0) - 3 * plan.expected_ms(timed, e, table)) <= 2  # rounding
    assert plan.expected_ms(timed, timed.steps[0], table, 3.0) == 2000
    fewer = plan.ModulePlan(ext, Path("m.so"), (), (), (), (step("a.cu", 2000), step("b.cu", 3000), step("d.cu", None)))
    assert plan.machine_scale([fewer], table) == (1.0, 2)


def test_ninja_log_is_read(tmp_path):
    log = tmp_path / ".ninja_log"
    log.write_text("# ninja log v6\n0\t1500\t123\tbuild/t/obj/a.cu.o\tdeadbeef\n2000\t2100\t124\tbuild/t/m.so\tabc\n")
    assert plan.read_ninja_log(log) == {"build/t/obj/a.cu.o": 1500, "build/t/m.so": 100}
