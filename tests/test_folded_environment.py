"""The environment configure folded is kept current: a change to a variable configure took into the
build (a toolchain variable, one a setup.py read) makes the next `ninja` run configure again, as an
edited spec does, and a no-op ninja stays one."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

from conftest import REPO
from test_build import ninja_bin, run

GATED = REPO / "tests" / "fixtures" / "setuppy" / "gated"


def test_a_variable_a_setup_py_read_runs_configure_again_when_it_changes(tmp_path):
    project = tmp_path / "gated"
    shutil.copytree(GATED, project)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATED_", "NVCC_"))}
    out = run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--setup-py", str(project)], tmp_path,
              env=env).stdout
    # Read by setup.py itself and by a module of its folder; what pp4 sets for it is not the project's.
    assert "read the environment variable(s) GATED_CUDA=unset, GATED_LEVEL=unset" in out, out
    config = json.loads((tmp_path / "build" / "pp4.json").read_text())["compile"]["environment"]
    assert config["read_by_setup_py"] == {"GATED_CUDA": str(project / "setup.py"),
                                          "GATED_LEVEL": str(project / "setup.py")}
    assert "CUDA_HOME" not in config["values"] and config["values"]["NVCC_APPEND_FLAGS"] is None
    run([ninja_bin()], tmp_path, env=env)
    assert "no work to do" in run([ninja_bin()], tmp_path, env=env).stdout
    assert "CONFIGURE" not in run([ninja_bin(), "build.ninja"], tmp_path, env=env).stdout

    # The gate opened, and a toolchain variable folded into the commands set: build.ninja has both
    # after the next ninja, with a line for each that says why.
    changed = dict(env, GATED_CUDA="1", NVCC_APPEND_FLAGS="-DX=1")
    again = run([ninja_bin(), "build.ninja"], tmp_path, env=changed).stdout
    assert "pp4: GATED_CUDA is '1' here but was unset when configure ran: configure runs again" in again, again
    assert "NVCC_APPEND_FLAGS is '-DX=1' here but was unset" in again
    assert "CONFIGURE" in again and "gated_cuda (cuda, 1 sources)" in again
    assert "gated_cuda" in (tmp_path / "build.ninja").read_text() and "-DX=1" in (tmp_path / "build.ninja").read_text()
    assert "CONFIGURE" not in run([ninja_bin(), "build.ninja"], tmp_path, env=changed).stdout
    # Back as it was (unset): configure again; then `touch setup.py` regenerates build.ninja.
    back = run([ninja_bin(), "build.ninja"], tmp_path, env=env).stdout
    assert "CONFIGURE" in back and "gated_cuda" not in (tmp_path / "build.ninja").read_text()
    later = time.time() + 5  # newer than build.ninja, however coarse the clock
    os.utime(project / "setup.py", (later, later))
    touched = run([ninja_bin(), "build.ninja"], tmp_path, env=env)
    assert "CONFIGURE" in touched.stdout and "gated_cpu (cpp, 1 sources)" in touched.stdout
    # A deleted configure output (not a generator output any more) still makes configure run.
    (tmp_path / "build" / "actions.json").unlink()
    assert "CONFIGURE" in run([ninja_bin()], tmp_path, env=env).stdout
    assert (tmp_path / "build" / "actions.json").is_file()
