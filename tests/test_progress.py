"""Progress while ninja builds (pp4/report/progress.py): a real build whose compiles take seconds
(a C++ compiler that sleeps first), ninja's output captured through a pipe as CI captures it, the
reporter's interval cut to a second. Oracles: ninja's own output and the log, read as text."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO
from test_specs_build import ninja_bin


def slow_project(tmp_path: Path, sleep_s: int) -> tuple[Path, dict]:
    """Three tiny C++ units behind a C++ compiler that sleeps first, one job: the build takes
    3 x sleep_s seconds. Returns the configured work folder and the environment to build it in."""
    src = tmp_path / "project"
    src.mkdir()
    for name in ("a", "b", "c"):
        (src / f"{name}.cpp").write_text(f"int {name}() {{ return 1; }}\n")
    (src / "ext.toml").write_text('[[extension]]\nname = "slow"\nkind = "cpp"\nsources = ["a.cpp", "b.cpp", "c.cpp"]\n')
    slow = tmp_path / "bin" / "c++"
    slow.parent.mkdir()
    slow.write_text(f'#!/bin/sh\nsleep {sleep_s}\nexec /usr/bin/c++ "$@"\n')
    slow.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, CXX=str(slow), PP4_PROGRESS_S="1")
    proc = subprocess.run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "-j", "1", "--ext-spec",
                           str(src / "ext.toml"), "--store", str(tmp_path / "store")], cwd=work, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return work, env

LINE = re.compile(r"^pp4: progress \d\d:\d\d:\d\d: (\d+) of 3 objects built \(this run: (\d+) compiled, (\d+) restored\), "
                  r"about .+ of CPU left by the estimate, done in about .+ \(\d\d:\d\d\)$", re.M)


def test_a_slow_build_says_where_it_is_every_interval_and_the_reporter_ends_with_ninja(tmp_path, toolchain):
    work, env = slow_project(tmp_path, 2)
    proc = subprocess.run([ninja_bin()], cwd=work, env=env, capture_output=True, text=True)  # stdout: a pipe
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = LINE.findall(proc.stdout)
    assert len(lines) >= 3, proc.stdout  # three units of 2 s each, one at a time: a line every second
    built = [int(n) for n, _, _ in lines]
    assert built == sorted(built) and built[0] < 3, lines
    assert all(int(c) + int(r) <= 3 for _, c, r in lines)
    log = (work / "build" / ".pp4" / "progress.log").read_text()
    assert len(LINE.findall(log)) >= len(lines) - 1, log

    # The reporter ends with ninja: its lock is free within two of its seconds.
    lock = os.open(work / "build" / ".pp4" / "progress.lock", os.O_RDWR)
    try:
        deadline = time.monotonic() + 5
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                assert time.monotonic() < deadline, "the progress reporter outlived ninja"
                time.sleep(0.1)
    finally:
        os.close(lock)

    # A build that compiles nothing starts no reporter and prints no progress.
    again = subprocess.run([ninja_bin()], cwd=work, env=env, capture_output=True, text=True)
    assert "no work to do" in again.stdout and "pp4: progress" not in again.stdout


def test_a_file_ninja_writes_over_gets_no_lines_and_the_log_still_does(tmp_path, toolchain):
    """ninja's output sent to a file opened without O_APPEND: a line added there would be written
    over by ninja's next one, so the reporter writes to its log alone."""
    work, env = slow_project(tmp_path, 1)
    out = tmp_path / "ninja.out"
    with open(out, "w") as f:
        proc = subprocess.run([ninja_bin()], cwd=work, env=env, stdout=f, stderr=subprocess.STDOUT)
    assert proc.returncode == 0, out.read_text()
    assert "pp4: progress" not in out.read_text()
    assert LINE.search((work / "build" / ".pp4" / "progress.log").read_text())
