"""Extension specs and the plans made from them, without compiling: every field, paths relative to
the spec wherever it is, objects always under the build folder, refusals that say what to do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from pp4.plan import modules as plan
from pp4.plan.torchflags import torch_build_flags
from pp4.sources.extensions import BUILTIN_SPECS, ExtensionError, from_spec, validate

TWO = REPO / "tests" / "fixtures" / "twomodules"


def spec(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_two_modules_in_one_spec_with_every_field():
    answer, other = from_spec(TWO / "spec" / "spec.toml")
    assert answer.root == TWO and answer.sources == ("csrc/answer.cpp", "csrc/twice.c")  # the folder ../ reaches
    assert (answer.module, answer.target, answer.kind) == ("pp4_answer", "pp4_answer", "cpp")
    assert answer.source_paths() == [TWO / "csrc" / "answer.cpp", TWO / "csrc" / "twice.c"]  # no `..` left
    assert answer.include_paths() == [TWO / "include"]
    assert answer.define_macros == (("ANSWER", "42"), ("GREETING", '"hello"'), ("DROPPED", None))
    assert answer.undef_macros == ("DROPPED",)
    assert (other.module, other.kind) == ("pp4_other", "cpp")  # no .cu source: a CppExtension
    validate([answer, other])


@pytest.mark.parametrize("name, module, sources, cuda_flags", [
    ("p2p", "pp4_p2p", ("p2p.cu", "bindings.cpp"), ("-O2",)),
    ("exl3-decode", "pp4_exl3_decode", ("gemm_mul1.cu", "gemm_3inst.cu", "gemm_mcg.cu", "ops.cu", "bindings.cpp"),
     ("-O3", "--use_fast_math")),
])
def test_the_worker_s_extensions_are_spec_files_it_owns(name, module, sources, cuda_flags):
    """`--ext p2p` and `--ext exl3-decode` read the worker's spec files, and get what pp4 built when
    they were code in pp4/sources/extensions.py: the same target, module, flags and kind, the
    sources' own folder as the root (so objects keep their names and each compile its command in
    the execution root), and the spec file as what re-runs configure."""
    spec_file = REPO / "pp4_worker" / "specs" / f"{name}.toml"
    assert BUILTIN_SPECS[name] == spec_file
    [ext] = from_spec(spec_file)
    assert (ext.target, ext.module, ext.kind, ext.flavor) == (name, module, "cuda", "jit")
    assert ext.root == REPO / "pp4_worker" / "ext" / module.removeprefix("pp4_") and ext.sources == sources
    assert (ext.cxx_flags, ext.cuda_flags, ext.ld_flags) == (("-O2",), cuda_flags, ())
    assert (ext.include_dirs, ext.define_macros, ext.undef_macros, ext.libraries, ext.library_dirs) == ((),) * 5
    assert ext.spec_files == (spec_file,) and ext.provenance == {}
    validate([ext])


def test_fields_outside_the_extension_tables_are_refused(tmp_path):
    p = spec(tmp_path, 'name = "x"\n[[extension]]\nname = "y"\nsources = ["a.cpp"]\n')
    with pytest.raises(ExtensionError, match=r"every field belongs in one of them \(name is outside\)"):
        from_spec(p)


@pytest.mark.parametrize("text,message", [
    ('name = "x"\nsources = ["a.cpp"]\nextra_compile_args = []\n', r"unknown field\(s\) extra_compile_args \(the fields are name,"),
    ('name = "x"\nsources = ["a.cpp"]\ndefine_macros = [3]\n', r'a define_macros entry is "NAME", "NAME=VALUE" or'),
    ('name = "x"\nsources = ["a.cpp"]\ndefine_macros = ["1BAD"]\n', r"'1BAD' is not a macro name"),
    ('name = "x"\nsources = ["a.cpp"]\nkind = "rocm"\n', r'`kind` is \'rocm\'; it is "cuda" or "cpp"'),
    ('sources = ["a.cpp"]\n', r"needs at least `name` and `sources`"),
    ('name = "x"\nsources = ["a.cpp"]\nroot = "sub"\n', r"the source a.cpp is outside `root` \(.*/sub\); the root must hold"),
    ('name = "x"\nsources = ["a.cpp"]\nroot = "/"\n', r"`root` is /: pp4 hashes every source below the root"),
    ('name = "x"\nsources = ["a.cpp"]\nroot = 3\n', r"`root` must be a folder \(a string\), not 3"),
])
def test_bad_fields_are_refused_by_name(tmp_path, text, message):
    (tmp_path / "a.cpp").write_text("")
    with pytest.raises(ExtensionError, match=message):
        from_spec(spec(tmp_path, text))


@pytest.mark.parametrize("flags", [["-gencode=arch=compute_80,code=sm_80"], ["-gencode", "arch=compute_80,code=sm_80"],
                                   ["-arch=sm_90"], ["--gpu-architecture", "sm_90"], ["-O3", "-arch", "sm_80"]])
def test_architecture_flags_in_a_spec_are_refused_and_point_at_arch(tmp_path, flags):
    (tmp_path / "k.cu").write_text("")
    p = spec(tmp_path, f'name = "x"\nsources = ["k.cu"]\ncuda_flags = {flags!r}\n'.replace("'", '"'))
    with pytest.raises(ExtensionError, match=r"cuda_flags choose GPU architectures \(.*\); pp4 builds for the "
                                             r"architectures configure's --arch names"):
        validate(from_spec(p))


@pytest.mark.parametrize("text,make,message", [
    ('name = "x"\nsources = ["k.cu"]\nkind = "cpp"\n', ["k.cu"], r'k.cu is CUDA, but the extension is kind "cpp"'),
    ('name = "x"\nsources = ["a.f90"]\n', ["a.f90"], r"a.f90 is not a source pp4 compiles \(C .c, C\+\+"),
    ('name = "x"\nsources = ["a.cpp", "./a.cpp"]\n', ["a.cpp"], r"a.cpp is listed twice"),
    ('name = "x"\nsources = ["a.cpp"]\nlibrary_dirs = ["nolib"]\n', ["a.cpp"], r"library directory .*nolib does not exist"),
    ('name = "x"\nsources = ["../gone.cpp"]\n', [], r"source .*/gone.cpp does not exist"),
])
def test_sources_and_folders_are_checked(tmp_path, text, make, message):
    for name in make:
        (tmp_path / "spec" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "spec" / name).write_text("")
    with pytest.raises(ExtensionError, match=message):
        validate(from_spec(spec(tmp_path / "spec", text)))


def test_objects_stay_under_the_build_folder_wherever_the_sources_are(tmp_path, toolchain):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "ops.cpp").write_text("")
    (tmp_path / "proj" / "src").mkdir(parents=True)
    (tmp_path / "proj" / "src" / "ops.cpp").write_text("")
    (tmp_path / "proj" / "main.c").write_text("")
    p = spec(tmp_path / "proj" / "pp4", f'name = "m"\nsources = ["../src/ops.cpp", "{elsewhere / "ops.cpp"}", '
                                        '"../main.c"]\nlibraries = ["m"]\nlibrary_dirs = ["../src"]\n')
    (ext,) = from_spec(p)
    validate([ext])
    mp = plan.module_plan(ext, torch_build_flags(), toolchain, ["9.0"], tmp_path / "build", tmp_path)
    objects = [s.object for s in mp.steps]
    assert all(not o.is_absolute() and o.parts[0] == "build" and ".." not in o.parts for o in objects), objects
    assert len(set(objects)) == 3  # two sources named ops.cpp, two objects
    assert objects[0] == Path("build/m/obj/src/ops.cpp.o")  # the root is proj/, which ../ reaches
    assert objects[1] == Path("build/m/obj/_outside") / str(elsewhere / "ops.cpp.o").lstrip("/")
    assert [s.language for s in mp.steps] == ["cxx", "cxx", "cxx"]  # .c goes to the C++ compiler, as torch's
    assert [str(s.source) for s in mp.steps] == [str(tmp_path / "proj/src/ops.cpp"), str(elsewhere / "ops.cpp"),
                                                str(tmp_path / "proj/main.c")]
    link = list(mp.link_flags)
    assert link[-2:] == [f"-L{tmp_path / 'proj' / 'src'}", "-lm"]
    assert not {"-lc10_cuda", "-ltorch_cuda", "-lcudart"} & set(link)  # kind cpp: no CUDA libraries


def test_a_named_root_names_the_objects_from_there(tmp_path):
    (tmp_path / "proj" / "csrc").mkdir(parents=True)
    (tmp_path / "proj" / "csrc" / "a.cpp").write_text("")
    (ext,) = from_spec(spec(tmp_path / "elsewhere", 'name = "x"\nroot = "../proj"\nsources = ["../proj/csrc/a.cpp"]\n'))
    assert ext.root == tmp_path / "proj" and ext.sources == ("csrc/a.cpp",)


def test_the_root_never_widens_to_the_file_system_or_home(tmp_path):
    from pp4.sources.extensions import project_root

    assert project_root(tmp_path / "a" / "spec", ["../src/x.cpp"]) == tmp_path / "a"
    assert project_root(tmp_path / "a" / "spec", ["x.cpp"]) == tmp_path / "a" / "spec"
    deep = "../" * len((tmp_path / "a" / "spec").parts)
    assert project_root(tmp_path / "a" / "spec", [deep + "usr/src/x.cpp"]) == tmp_path / "a" / "spec"
    home = Path.home() / "pp4-spec-test"
    assert project_root(home, ["../other/x.cpp"]) == home


def test_macros_then_includes_in_setuptools_order(toolchain, tmp_path):
    answer, _ = from_spec(TWO / "spec" / "spec.toml")
    mp = plan.module_plan(answer, torch_build_flags(), toolchain, ["9.0"], tmp_path / "build", tmp_path)
    flags = list(mp.cxx_flags)
    i = flags.index("-DANSWER=42")
    assert flags[i:i + 5] == ["-DANSWER=42", '-DGREETING="hello"', "-DDROPPED", "-UDROPPED", f"-I{TWO / 'include'}"]
    # the spec's own flags come last: pp4 adds nothing after them (pp4/plan/modules.py)
    assert flags.index("-DTORCH_EXTENSION_NAME=pp4_answer") < i and flags[-1] == "-O1"


@pytest.mark.parametrize("args,message", [
    (["-j", "0"], "-j/--jobs 0: at least one compile must be allowed to run"),
    (["--compiler-threads", "0"], "--compiler-threads 0: nvcc compiles at least one architecture"),
    (["--nice", "40"], "--nice 40: niceness is -20 to 19"),
])
def test_option_values_no_build_can_use_are_refused_first(tmp_path, args, message):
    env = {k: v for k, v in os.environ.items() if k != "PP4_CACHE_DIR"}
    env["PP4_CACHE_DIR"] = str(tmp_path / "empty-cache")  # refused before anything is provisioned
    proc = subprocess.run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext", "p2p", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and f"configure.py: error: {message}" in proc.stderr, proc.stderr
    assert not (tmp_path / "empty-cache").exists() and not (tmp_path / "build.ninja").exists()
