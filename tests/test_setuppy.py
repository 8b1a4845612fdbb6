"""configure --setup-py: a project's extensions read from its setup.py with setup() intercepted,
exactly as the project declares them; nothing built or installed; failures named."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

from pp4.sources import setuppy
from pp4.sources.extensions import ExtensionError, from_spec, validate

FIXTURES = REPO / "tests" / "fixtures" / "setuppy"
BASIC = FIXTURES / "basic"


@pytest.fixture(scope="module")
def basic(toolchain):
    return setuppy.read(BASIC, toolchain.prefix, ["9.0"])


def test_every_extension_is_recorded_as_the_project_declares_it(basic):
    cpu, cuda = basic.extensions
    assert (cpu.target, cpu.module, cpu.kind, cpu.root) == ("basic_cpu._C", "_C", "cpp", BASIC)
    assert cpu.source_paths() == [BASIC / "csrc/cpu/answer.cpp"]  # its glob, run in its folder
    assert cpu.define_macros == (("ANSWER", "42"), ("WITH_FLAG", None)) and cpu.cxx_flags == ("-O2",)
    # The CUDA extension is declared only where torch sees CUDA: pp4 reads it as a CUDA build machine would.
    assert (cuda.target, cuda.kind, cuda.libraries) == ("basic_cuda", "cuda", ("m",))
    assert cuda.source_paths() == [BASIC / "csrc/cuda/bind.cpp", BASIC / "csrc/cuda/scale.cu"]
    assert cuda.include_paths() == [BASIC / "include"]
    assert cuda.cuda_flags == ("-O2", "--use_fast_math")  # its -gencode dropped ...
    assert basic.notices == (f"{BASIC / 'setup.py'} extension 'basic_cuda': its nvcc flags "
                             "-gencode=arch=compute_80,code=sm_80 are dropped; configure's --arch chooses the "
                             "architectures",)  # ... and said so
    assert cpu.spec_files == (BASIC / "setup.py",)  # configure runs again when setup.py changes
    validate(list(basic.extensions))


@pytest.mark.parametrize("options, said", [
    ("no_python_abi_suffix=True", "BuildExtension.with_options(no_python_abi_suffix=True) is not followed in the "
                                  "build folder: pp4 names each module with Python's ABI suffix"),
    ("no_python_abi_suffix=False, use_ninja=False", None),
    ("no_python_abi_suffix=True, foo='bar'", "BuildExtension.with_options(foo='bar') is not followed by pp4"),
])
def test_build_ext_options_pp4_does_not_follow_are_said(tmp_path, toolchain, options, said):
    project = tmp_path / "basic"
    shutil.copytree(BASIC, project)
    setup_py = project / "setup.py"
    text = setup_py.read_text()
    assert '"build_ext": BuildExtension}' in text
    setup_py.write_text(text.replace('"build_ext": BuildExtension}', f'"build_ext": BuildExtension.with_options({options})}}'))
    notices = setuppy.read(project, toolchain.prefix, ["9.0"]).notices
    ours = [n for n in notices if "BuildExtension.with_options" in n]
    if said is None:
        assert ours == [], notices
    else:
        assert any(said in n and n.startswith(f"{setup_py}: ") for n in ours), notices


def test_a_cuda_module_declared_where_nvcc_runs_is_read(tmp_path, toolchain, monkeypatch):
    """torchsort declares its CUDA module only where `nvcc` is on PATH: pp4's is, as on a CUDA
    build machine, though this machine has none of its own."""
    project = tmp_path / "needs_nvcc"
    shutil.copytree(BASIC, project)
    setup_py = project / "setup.py"
    text = setup_py.read_text()
    assert "if torch.cuda.is_available() and CUDA_HOME is not None:" in text
    setup_py.write_text("import shutil\n" + text.replace("if torch.cuda.is_available() and CUDA_HOME is not None:",
                                                         "if shutil.which('nvcc'):"))
    # This machine's PATH without any nvcc of its own (some have /usr/local/cuda/bin on it).
    monkeypatch.setenv("PATH", os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                                               if d and not os.path.exists(os.path.join(d, "nvcc"))))
    found = setuppy.read(project, toolchain.prefix, ["9.0"])
    assert [e.target for e in found.extensions] == ["basic_cpu._C", "basic_cuda"]


def test_reading_a_setup_py_builds_and_installs_nothing(basic):
    assert sorted(p.name for p in BASIC.iterdir()) == ["csrc", "include", "setup.py"]
    found = subprocess.run([sys.executable, "-m", "pip", "show", "basic"], capture_output=True, text=True)
    assert found.returncode != 0


def test_the_written_spec_builds_the_same_extensions(basic, tmp_path):
    spec = tmp_path / "specs" / "basic.toml"
    spec.parent.mkdir()
    spec.write_text(setuppy.spec_text(basic, spec))
    text = spec.read_text()
    assert "# " + basic.notices[0] in text  # what pp4 changed stays visible in the spec
    again = from_spec(spec)
    # Kept outside the project, the spec still names its folder as the root: the same object names,
    # the same commands in the fixed root, the same store keys as the --setup-py build.
    assert f'root = "{os.path.relpath(BASIC, spec.parent)}"' in text
    keys = ("target", "module", "kind", "root", "define_macros", "undef_macros", "libraries", "cxx_flags",
            "cuda_flags", "ld_flags")
    for a, b in zip(basic.extensions, again):
        assert {k: getattr(a, k) for k in keys} == {k: getattr(b, k) for k in keys}
        assert (a.source_paths(), a.include_paths(), a.library_paths()) == (b.source_paths(), b.include_paths(),
                                                                            b.library_paths())


@pytest.mark.parametrize("how,message", [
    ("missing", r"imports the module 'pp4_no_such_module', which .* does not have: install it there"),
    ("raises", r"failed before declaring its extensions: RuntimeError: the version file is missing"),
    ("no-setup", r"finished without calling setup\(\)"),
    ("no-extensions", r"declares no CUDAExtension or CppExtension"),
    ("extra-objects", r"pp4 cannot build extra_objects \(prebuilt objects\) yet"),
])
def test_a_setup_py_that_cannot_be_read_says_why(toolchain, monkeypatch, how, message):
    monkeypatch.setenv("PP4_BROKEN_SETUP", how)
    with pytest.raises(ExtensionError, match=message):
        setuppy.read(FIXTURES / "broken" / "setup.py", toolchain.prefix, ["9.0"])


def test_a_path_that_is_not_a_setup_py_is_refused(tmp_path, toolchain):
    with pytest.raises(ExtensionError, match=r"--setup-py .*: no such file \(give a setup.py, or the folder"):
        setuppy.read(tmp_path, toolchain.prefix, ["9.0"])


def test_configure_reads_it_and_writes_the_spec(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--setup-py", str(BASIC),
                           "--write-spec", str(tmp_path / "specs")], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "configure: notice: " in proc.stdout and "-gencode=arch=compute_80,code=sm_80 are dropped" in proc.stdout
    assert "basic_cpu._C (cpp, 1 sources), basic_cuda (cuda, 2 sources)" in proc.stdout
    # What building one of them costs, for `ninja basic_cuda` or `ninja wheel-basic_cuda` alone.
    line = re.search(r"^configure: by target, cold: (.*)$", proc.stdout, re.M)
    assert line and sorted(re.findall(r"(\S+) about [\d.]+ s of CPU", line.group(1))) == ["basic_cpu._C", "basic_cuda"], \
        proc.stdout
    assert (tmp_path / "specs" / "basic.toml").is_file()
    assert "build build/basic_cpu._C/_C" in (tmp_path / "build.ninja").read_text()
    # Built from that spec (kept outside the project), in another folder: the same compile commands
    # and object names, so each finds what the --setup-py build stored.
    other = tmp_path / "from-spec"
    other.mkdir()
    proc = subprocess.run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec",
                           str(tmp_path / "specs" / "basic.toml")], cwd=other, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

    def actions(work):
        doc = json.loads((work / "build" / "actions.json").read_text())
        return [(a["output"], a["argv"]) for a in doc["actions"]]

    assert actions(other) == actions(tmp_path) and len(actions(tmp_path)) == 3


def test_a_source_added_where_setup_py_globs_makes_ninja_read_it_again(tmp_path):
    """The fixture's CPU module takes csrc/cpu/*.cpp: a new file there is in build.ninja after a plain
    `ninja build.ninja` (which rebuilds the manifest only, compiling nothing)."""
    import shutil
    import time

    from test_build import ninja_bin, run

    project = tmp_path / "basic"
    shutil.copytree(BASIC, project)
    run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--setup-py", str(project)], tmp_path)
    assert "extra.cpp" not in (tmp_path / "build.ninja").read_text()
    assert "CONFIGURE" not in run([ninja_bin(), "build.ninja"], tmp_path).stdout
    time.sleep(1.1)  # a folder mtime newer than build.ninja's, however coarse the clock
    (project / "csrc" / "cpu" / "extra.cpp").write_text("int extra() { return 1; }\n")
    again = run([ninja_bin(), "build.ninja"], tmp_path)
    assert "CONFIGURE" in again.stdout and "basic_cpu._C (cpp, 2 sources)" in again.stdout
    assert "csrc/cpu/extra.cpp" in (tmp_path / "build.ninja").read_text()
    assert "CONFIGURE" not in run([ninja_bin(), "build.ninja"], tmp_path).stdout  # and then it settles


def test_configured_in_the_project_folder_ninja_reads_setup_py_again_only_for_a_source_come_or_gone(tmp_path):
    """configure run in the folder of the sources (as `cd project && configure.py --setup-py .`): what
    pp4, ninja, setuptools and the user write beside the sources (build.ninja itself, the wheels'
    folder, bytecode, egg-info, a log) is not a source, so it must not cost a configure (the
    setup.py's run, torch's import) at the next ninja; a source removed still does."""
    import shutil
    import time

    from test_build import ninja_bin, run

    project = tmp_path / "basic"
    shutil.copytree(BASIC, project)
    cpu = project / "csrc" / "cpu"
    shutil.copy(cpu / "answer.cpp", cpu / "second.cpp")
    # The CPU module's sources sit in csrc/cpu: configure from there makes it the folder build.ninja is in.
    run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--setup-py", str(project)], cpu)
    assert "CONFIGURE" not in run([ninja_bin(), "build.ninja"], cpu).stdout
    time.sleep(1.1)  # folder mtimes newer than build.ninja's, however coarse the clock
    for folder in ("dist", "__pycache__", "basic.egg-info"):
        (cpu / folder).mkdir()
    (cpu / "compile_commands.json").write_text("[]\n")
    assert "CONFIGURE" not in run([ninja_bin(), "build.ninja"], cpu).stdout
    (cpu / "second.cpp").unlink()
    again = run([ninja_bin(), "build.ninja"], cpu)
    assert "CONFIGURE" in again.stdout and "basic_cpu._C (cpp, 1 sources)" in again.stdout
    assert "CONFIGURE" not in run([ninja_bin(), "build.ninja"], cpu).stdout
    (cpu / "notes.txt").write_text("a name that came: configure reads the setup.py again, to be sure\n")
    assert "CONFIGURE" in run([ninja_bin(), "build.ninja"], cpu).stdout


CMAKE_SETUP = '''
import subprocess
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class CMakeExtension(Extension):
    def __init__(self, name, sourcedir=""):
        Extension.__init__(self, name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        subprocess.check_call(["cmake", "--build", "."])


setup(name="cmake_project", ext_modules=[CMakeExtension("cmake_project._C")], cmdclass={"build_ext": CMakeBuild})
'''


def test_a_cmake_setup_py_is_refused_at_configure_with_what_to_do(tmp_path, toolchain):
    """A CMake build_ext declares an extension with no sources: configure says in one line that it
    cannot build it, and promises no `ninja wheel-...` (it used to, and the build then failed)."""
    project = tmp_path / "cmake_project"
    project.mkdir()
    (project / "setup.py").write_text(CMAKE_SETUP)
    proc = subprocess.run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--setup-py", str(project)],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "wheel-" not in proc.stdout and not (tmp_path / "build.ninja").exists()
    (line,) = proc.stderr.strip().splitlines()
    assert "extension 'cmake_project._C' lists no sources: its setup.py builds it with its own build_ext " \
           "(CMakeBuild, e.g. a CMake build), which pp4 cannot build; build this project with its own setup.py " \
           "(`pip wheel .`)" in line, line
