"""--setup-py builds each extension with BuildExtension's flags. The oracle is BuildExtension itself:
the fixture project's setup.py runs `build_ext` under torch's own BuildExtension, with its ninja
run captured instead of run and its links made no-ops, and its build.ninja's flags are compared
with pp4's plan flag for flag. The differences are the ones docs/specs.md lists."""

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
from pp4.plan.torchflags import setuptools_flags, torch_build_flags
from pp4.sources import setuppy
from pp4.sources.extensions import architecture_flags

BASIC = REPO / "tests" / "fixtures" / "setuppy" / "basic"

CAPTURE = r'''
import json, os, runpy, sys
import torch
import torch.utils.cpp_extension as ce
captured = []
ce._run_ninja_build = lambda build_directory, verbose, error_prefix: captured.append(
    open(os.path.join(build_directory, "build.ninja")).read())
torch.cuda.is_available = lambda: True
sys.argv = ["setup.py", "build_ext", "--build-temp", sys.argv[1] + "/temp", "--build-lib", sys.argv[1] + "/lib"]
runpy.run_path("setup.py", run_name="__main__")
print(json.dumps(captured))
'''

# Stands in for g++ at link time only (nothing was compiled to link); version checks get the real one.
FAKE_GXX = """#!/bin/sh
case " $* " in *" -o "*) exit 0;; esac
exec g++ "$@"
"""


def buildextension_flags(tmp_path: Path, toolchain) -> dict[str, dict[str, list[str]]]:
    """Each extension's {cflags, post_cflags, cuda_cflags, cuda_post_cflags} as BuildExtension writes them."""
    gxx = tmp_path / "bin" / "g++"
    gxx.parent.mkdir()
    gxx.write_text(FAKE_GXX)
    gxx.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CFLAGS", "CPPFLAGS", "CC")}
    env.update(CXX=str(gxx), CUDA_HOME=str(toolchain.prefix), TORCH_CUDA_ARCH_LIST="9.0")
    proc = subprocess.run([sys.executable, "-c", CAPTURE, str(tmp_path)], cwd=BASIC, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    import json

    out = {}
    for text in json.loads(proc.stdout.strip().splitlines()[-1]):
        name = re.search(r"-DTORCH_EXTENSION_NAME=(\w+)", text).group(1)
        out[name] = {k: [a.strip("'") for a in shlex.split(m.group(1))]
                     for k in ("cflags", "post_cflags", "cuda_cflags", "cuda_post_cflags")
                     if (m := re.search(rf"^{k} = (.*)$", text, re.M))}
    return out


def test_setup_py_extensions_get_buildextensions_flags_in_its_order(tmp_path, toolchain):
    theirs = buildextension_flags(tmp_path, toolchain)
    found = setuppy.read(BASIC, toolchain.prefix, ["9.0"])
    env = {k: v for k, v in os.environ.items() if k not in ("CFLAGS", "CPPFLAGS", "CC")}
    st = setuptools_flags(env)
    assert {e.module for e in found.extensions} == set(theirs) == {"_C", "basic_cuda"}
    for ext in found.extensions:
        ours = plan.module_plan(ext, torch_build_flags(), toolchain, ["9.0"], tmp_path / "build", tmp_path,
                                setuptools=st)
        t = theirs[ext.module]
        assert t["cflags"][-1] == "-c"  # BuildExtension's flags end in a -c of their own, then -c $in again
        # pp4 adds nothing: the fixed execution root, not a flag, makes objects independent of folders.
        assert list(ours.cxx_flags) == t["cflags"][:-1] + t["post_cflags"], ext.target
        if ext.kind == "cuda":
            # The one difference: the project's -gencode list gives way to --arch's, where torch puts its own.
            theirs_cuda = [f for f in t["cuda_cflags"][:-1] + t["cuda_post_cflags"] if not architecture_flags([f])]
            ours_cuda = list(ours.cuda_flags)
            arch = [f for f in ours_cuda if architecture_flags([f])]
            assert arch == ["-gencode=arch=compute_90,code=sm_90"]
            assert ours_cuda.index(arch[0]) == ours_cuda.index("-std=c++20") - 1
            assert [f for f in ours_cuda if f not in arch] == theirs_cuda


@pytest.mark.slow
def test_a_setup_py_project_builds_and_its_op_runs(tmp_path, toolchain):
    """The fixture project built from its setup.py alone: pp4's modules import, and the CPU op gives
    what torch gives."""
    import shutil

    from test_build import ninja_bin, run

    project = tmp_path / "basic"
    shutil.copytree(BASIC, project)
    work = tmp_path / "work"
    work.mkdir()
    conf = run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--setup-py", str(project),
                "--store", str(tmp_path / "store")], work)
    assert "basic_cpu._C (cpp, 1 sources), basic_cuda (cuda, 2 sources)" in conf.stdout
    run([ninja_bin()], work)
    code = (f"import sys, json, torch; sys.path.insert(0, {str(REPO)!r}); from pp4.certify.loader import load_target; "
            "cpu = load_target('basic_cpu._C', 'build'); cuda = load_target('basic_cuda', 'build'); "
            "x = torch.arange(4.0); print(json.dumps([cpu.add_answer(x).tolist(), (x + 42).tolist(), "
            "hasattr(cuda, 'scale')]))")
    out = run([sys.executable, "-c", code], work).stdout.strip().splitlines()[-1]
    got, want, has_scale = __import__("json").loads(out)
    assert got == want and has_scale
    assert run([ninja_bin(), "certify"], work).stdout.rstrip().endswith("audit passed")
