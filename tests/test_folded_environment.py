"""The environment configure folded is kept current: a change to a variable configure took into the
build (a toolchain variable, one a setup.py read) makes the next `ninja` run configure again, as an
edited spec does, and a no-op ninja stays one."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
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


# Texts for NVCC_APPEND_FLAGS and what nvcc 13.0 does with each (asked of the tool with -dryrun).
SPLITS = ['-DVAL="X"', '-DD="q r" -O2', '-DE=a"b c"d', "-DG=it's", '-DH=""', "  -DJ=a\t-DK=b  ", '-DB=a\\b',
          '-DB=a\\\\b', '-DB="a\\"b"', '-DB="a\\ b"', '-DB=a\\\\"b c"', '-DB="a\\\\\\""', "-DB=a\n-DC=b", "-DC='q r'",
          '-DB="a\\\\" -DC=b"', '-DB=x"y',
          '-DB=a\\"', '-DB="abc', '-DB="a\\\\"', '-DB=a\\ b', '-DB=a\\']


def _dryrun(nvcc: str, argv: list[str], env: dict, tmp_path) -> tuple[int, str]:
    import re
    import subprocess

    (tmp_path / "t.cu").write_text("\n")
    done = subprocess.run([nvcc, *argv, "-dryrun", "-c", "t.cu"], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", **env})
    said = (done.stdout + done.stderr).replace(f'#$ NVCC_APPEND_FLAGS="{env.get("NVCC_APPEND_FLAGS")}"\n', "")
    return done.returncode, re.sub(r"tmpxft_[0-9a-f]+_", "tmpxft_", said)


def test_nvcc_append_flags_are_split_as_nvcc_splits_them(toolchain, tmp_path):
    """Oracle: nvcc's own -dryrun commands with the variable set, against the same commands with
    pp4's words on the command line and no variable; where nvcc refuses the text, pp4 does too."""
    from pp4.toolchain.compilerenv import EnvError, nvcc_split

    for text in SPLITS:
        rc, by_nvcc = _dryrun(str(toolchain.nvcc), [], {"NVCC_APPEND_FLAGS": text}, tmp_path)
        try:
            words = nvcc_split(text, "NVCC_APPEND_FLAGS")
        except EnvError:
            assert rc != 0 and "fatal" in by_nvcc, (text, by_nvcc)
            continue
        # the same commands, or the same refusal (of a word, which nvcc reads as a word of its command line)
        assert _dryrun(str(toolchain.nvcc), words, {}, tmp_path) == (rc, by_nvcc), text


@pytest.mark.slow
def test_a_quoted_macro_in_nvcc_append_flags_compiles_as_nvcc_compiles_it(toolchain, tmp_path):
    """NVCC_APPEND_FLAGS='-DVAL="X y"' (a shell's split drops the quotes and the build fails): the
    object pp4 builds holds what nvcc makes of it with the variable set and no pp4 (the string in
    .rodata, the device code that took its size in .nv_fatbin)."""
    import subprocess

    value = '-DVAL="X y"'
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "v.cu").write_text('extern "C" const char pp4_val[] = VAL;\n'
                                            "__global__ void pp4_k(int *p) { *p = sizeof(VAL); }\n")
    (tmp_path / "src" / "v.toml").write_text('name = "pp4_val"\nsources = ["v.cu"]\n')
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, NVCC_APPEND_FLAGS=value)
    run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", str(tmp_path / "src" / "v.toml"),
         "--no-reuse"], work, env=env)
    (action,) = json.loads((work / "build" / "actions.json").read_text())["actions"]
    run([ninja_bin(), action["output"]], work, env=env)
    # The same command without pp4: its own words only, the variable set, nvcc splitting it.
    argv = [a for a in action["argv"] if a != value]
    argv = argv[:1] + argv[4:] if argv[1:3] == ["-MD", "-MF"] else argv
    argv[argv.index("-o") + 1] = str(tmp_path / "plain.o")
    run(argv, work, env=dict(action["env"], NVCC_APPEND_FLAGS=value))

    def section(obj, name):
        out = tmp_path / f"{Path(obj).name}{name}.bin"
        subprocess.run(["objcopy", "-O", "binary", f"--only-section={name}", str(obj), str(out)], check=True)
        return out.read_bytes()

    for name in (".rodata", ".nv_fatbin"):
        assert section(work / action["output"], name) == section(tmp_path / "plain.o", name), name
    assert b"X y\0" in section(tmp_path / "plain.o", ".rodata")
