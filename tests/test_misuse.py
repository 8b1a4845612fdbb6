"""Misuse a newcomer meets (issue 65): each answered by one line that says what is wrong and how to
fix it, at configure where it can be known there, never a traceback. configure, ninja and the store's
command run as a user runs them, on the small C++ fixture (g++ only: the point is not CUDA)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_build import ninja_bin

TWO = REPO / "tests" / "fixtures" / "twomodules"
PY = sys.executable


def env_with(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def run(cmd, cwd, env=None, preexec_fn=None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env or env_with(), capture_output=True, text=True, preexec_fn=preexec_fn)


def configure(work: Path, spec: Path, *extra: str, env=None) -> subprocess.CompletedProcess:
    work.mkdir(parents=True, exist_ok=True)
    return run([PY, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", str(spec), *extra], work, env)


def one_error_line(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture
def project(tmp_path) -> Path:
    src = tmp_path / "src"
    shutil.copytree(TWO, src)
    return src / "spec" / "spec.toml"


def test_cpus_outside_those_allowed_is_refused_at_configure(tmp_path, project, toolchain):
    allowed = sorted(os.sched_getaffinity(0))
    beyond = max(allowed) + 3
    line = one_error_line(configure(tmp_path / "w", project, "--cpus", f"{beyond}-{beyond + 2}"))
    ok = f"0-{max(allowed)}" if allowed == list(range(max(allowed) + 1)) else None
    assert line.startswith(f"configure.py: error: --cpus {beyond}-{beyond + 2}: CPU(s) {beyond}-{beyond + 2} are not "
                           f"among those this machine lets pp4 run on ("), line
    assert "re-run configure with --cpus within " in line and line.endswith("or without --cpus to use them all"), line
    if ok:
        assert f"({ok})" in line
    assert not (tmp_path / "w" / "build.ninja").exists()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to run ninja on fewer than configured")
def test_a_build_run_on_fewer_cpus_than_configured_says_so_before_it_compiles(tmp_path, project, toolchain):
    """Configured on CPU B, then run where only CPU A is allowed (another cgroup, taskset): each compile
    says why it cannot start, not "Exception occurred in preexec_fn"."""
    a, b = sorted(os.sched_getaffinity(0))[:2]
    work = tmp_path / "w"
    assert configure(work, project, "--cpus", str(b), "--store", str(tmp_path / "store")).returncode == 0
    built = run([ninja_bin()], work, preexec_fn=lambda: os.sched_setaffinity(0, {a}))
    assert built.returncode != 0
    assert "preexec_fn" not in built.stdout + built.stderr and "Traceback" not in built.stdout + built.stderr
    assert (f"pp4: --cpus {b}: CPU(s) {b} are not among those this machine lets pp4 run on ({a}); re-run configure "
            f"with --cpus within {a}, or without --cpus to use them all (the build's limits, build/pp4.json)"
            in built.stdout.splitlines()), built.stdout


def test_a_remote_folder_that_is_not_there_is_one_line_at_configure(tmp_path, project, toolchain):
    line = one_error_line(configure(tmp_path / "w", project, "--remote-store", f"file://{tmp_path}/nonexistent"))
    assert line == (f"configure.py: error: remote store folder {tmp_path}/nonexistent does not exist or is not a "
                    "folder (create it, mount the shared file system there, or fix the URL)")


SIZES = "(write a byte count or a number with K, M, G, T or P: 48G, 512M, 1.5GiB, 1048576)"


def test_not_a_size_is_said_once_with_examples(tmp_path, project):
    line = one_error_line(configure(tmp_path / "w", project, "--max-memory", "lots"))
    assert line == f"configure.py: error: --max-memory: not a size: 'lots' {SIZES}"
    (tmp_path / "store").mkdir()
    stats = run([PY, "-m", "pp4.store", "--store", str(tmp_path / "store"), "stats"], tmp_path,
                env_with(PP4_STORE_MAX_BYTES="lots"))
    assert one_error_line(stats) == f"pp4.store: error: PP4_STORE_MAX_BYTES: not a size: 'lots' {SIZES}"
