"""Progress while ninja builds (pp4/report/progress.py): a real build whose compiles take seconds
(a C++ compiler that sleeps first, or one that needs seconds of CPU first), ninja's output captured
through a pipe as CI captures it, the reporter's interval cut to a second. Oracles: ninja's own
output and its .ninja_log (when each compile ended), read as text, and a rival process that keeps
the build's CPU half busy."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
                  r"about .+ of CPU left.*: done in about .+ \(\d\d:\d\d\)$", re.M)


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
    wait_for_reporter(work, within_s=5)

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


BURN = """#!/usr/bin/env python3
# A compiler that needs CPU_S seconds of CPU before it compiles: on a CPU shared with other work
# it takes longer by the wall clock, as a real compile does.
import os, sys, time
if "-c" in sys.argv:  # a compile, not configure's probes
    end = time.process_time() + {cpu_s}
    while time.process_time() < end:
        pass
os.execv("/usr/bin/c++", ["/usr/bin/c++", *sys.argv[1:]])
"""

ETA = re.compile(r"^pp4: progress (\d\d):(\d\d):(\d\d): (\d+) of (\d+) objects of slow built .*?"
                 r"(?:the estimate times ([\d.]+), as this run's (\d+) compiles went\))?, the build gets ([\d.]+) CPUs: "
                 r"done in about ([\d.]+) (s|min)", re.M)


def burning_project(tmp_path: Path, cpu_s: float) -> tuple[Path, dict]:
    """Two modules: `slow`, three units behind a compiler that burns cpu_s of CPU first, and
    `other`, one unit. Python.h makes each unit's H200 figure large enough to teach the machine's
    speed (pp4/plan/estimate.py). One job, on CPU 0."""
    src = tmp_path / "project"
    src.mkdir()
    for name in ("a", "b", "c", "d"):
        (src / f"{name}.cpp").write_text(f"#include <Python.h>\nint {name}() {{ return 1; }}\n")
    (src / "ext.toml").write_text('[[extension]]\nname = "slow"\nkind = "cpp"\nsources = ["a.cpp", "b.cpp", "c.cpp"]\n'
                                  '[[extension]]\nname = "other"\nkind = "cpp"\nsources = ["d.cpp"]\n')
    burn = tmp_path / "bin" / "c++"
    burn.parent.mkdir()
    burn.write_text(BURN.format(cpu_s=cpu_s))
    burn.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, CXX=str(burn), PP4_PROGRESS_S="1", PP4_SPEED_FILE=str(tmp_path / "speed.json"))
    proc = subprocess.run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "-j", "1", "--cpus", "0",
                           "--ext-spec", str(src / "ext.toml"), "--store", str(tmp_path / "store")], cwd=work, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return work, env


def wait_for_reporter(work: Path, within_s: float = 10) -> None:
    """Until the progress reporter has let go of its lock; a failure where it still holds it after within_s."""
    lock = os.open(work / "build" / ".pp4" / "progress.lock", os.O_RDWR)
    try:
        deadline = time.monotonic() + within_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError:
                assert time.monotonic() < deadline, "the progress reporter outlived ninja"
                time.sleep(0.1)
    finally:
        os.close(lock)


@pytest.mark.slow  # about 30 s: three compiles of 2.5 CPU-s on half a CPU
def test_progress_counts_the_target_asked_for_and_its_end_comes_at_the_cpu_the_build_gets(tmp_path, toolchain):
    """`ninja slow` on a CPU that another process keeps busy: the lines count slow's three objects,
    not the four configured; the CPUs they say the build gets are about half of one; and once a
    compile has shown how far off the estimate is, the end they give is the end ninja's own log
    shows (the last compile's end), within a few seconds, where one CPU a job would have said half
    the time. Afterwards this machine's speed record holds the three compiles, and configure
    scales its figures by it in a new build folder."""
    cpu_s = 2.5
    work, env = burning_project(tmp_path, cpu_s)
    rival = subprocess.Popen([sys.executable, "-c", "import os\nos.sched_setaffinity(0, {0})\nwhile True: pass"])
    try:
        time.sleep(0.5)
        t0 = time.time()
        proc = subprocess.run([ninja_bin(), "slow"], cwd=work, env=env, capture_output=True, text=True)
    finally:
        rival.kill()
        rival.wait()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wait_for_reporter(work)
    lines = ETA.findall(proc.stdout)
    assert len(lines) >= 4, proc.stdout
    assert all(ln[4] == "3" for ln in lines), proc.stdout  # of slow's objects, not the four configured
    assert not list((work / "build").glob("other/**/*.o"))

    # ninja's log: when the asked target's last compile ended, from ninja's start (~t0)
    ends = [int(f[1]) / 1000 for f in (ln.split("\t") for ln in (work / "build" / ".ninja_log").read_text().splitlines()[1:])
            if f[3].startswith("build/slow/obj/")]
    assert len(ends) == 3
    last_compile = t0 + max(ends)
    day = time.strftime("%Y-%m-%d", time.localtime(t0))
    gets = [float(ln[7]) for ln in lines]
    assert 0.2 <= sorted(gets)[len(gets) // 2] <= 0.8, (gets, proc.stdout)  # the rival has the other half
    judged = 0
    for h, m, s, built, total, factor, ncompiled, cpus, eta, unit in lines:
        if not factor or int(built) == 3:
            continue  # before any compile ended, the estimate knows nothing of the burn
        at = time.mktime(time.strptime(f"{day} {h}:{m}:{s}", "%Y-%m-%d %H:%M:%S"))
        predicted = float(eta) * (60 if unit == "min" else 1)
        actual = last_compile - at
        assert abs(predicted - actual) <= 2.5 + 0.25 * actual, (h, m, s, predicted, actual, proc.stdout)
        judged += 1
    assert judged >= 2, proc.stdout

    speed = json.loads((tmp_path / "speed.json").read_text())
    (pairs,) = speed.values()
    assert len(pairs) == 3 and all(c >= cpu_s for c, _ in pairs), pairs
    estimates = json.loads((work / "build" / ".pp4" / "estimates.json").read_text())
    assert sorted(h for _, h in pairs) == sorted(estimates["h200"][o] for o in estimates["h200"] if "/slow/" in o)

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    again = subprocess.run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "-j", "1", "--ext-spec",
                            str(tmp_path / "project" / "ext.toml"), "--store", str(tmp_path / "store")], cwd=fresh,
                           env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout + again.stderr
    ratio = sum(c for c, _ in pairs) / sum(h for _, h in pairs)
    assert f"times {ratio:.2f} (this machine's CPU time over the H200's on the last 3 units it compiled" in again.stdout, again.stdout
    scaled = json.loads((fresh / "build" / ".pp4" / "estimates.json").read_text())
    assert all(abs(scaled["objects"][o] - h * ratio) <= 0.1 for o, h in scaled["h200"].items())
