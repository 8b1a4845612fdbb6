"""Ctrl-C ends a pp4 command with one line and exit status 130, no traceback, its cleanup done."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO


def as_from_a_terminal() -> None:
    """Ctrl-C's conditions in the child: SIGINT at its default and not blocked, whatever this test
    process inherited or was left with by libraries loaded before (in one full CI run both commands
    below ignored SIGINT; every run of this file alone, or after the cluster tests, passed)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def interrupt_when(proc: subprocess.Popen, ready, timeout: float = 120) -> tuple[int, str]:
    deadline = time.time() + timeout
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the command never got going"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    try:
        # The signal is handled between Python bytecodes: a long native torch call (building the
        # weights on a busy 2-core machine) delays it.
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:  # never left running: it would take the CPUs of every test after it
            proc.kill()
            proc.communicate()
    return proc.returncode, err


def test_the_worker_stops_with_one_line_and_removes_its_private_caches(tmp_path):
    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        # The default geometry on a CPU: building its weights takes a minute, so SIGINT lands mid-build.
        proc = subprocess.Popen([sys.executable, "-m", "pp4_worker", "--device", "cpu"], stdout=f,
                                stderr=subprocess.PIPE, text=True, cwd=tmp_path, preexec_fn=as_from_a_terminal)
        rc, err = interrupt_when(proc, lambda: "private caches:" in out.read_text())
    assert rc == 130 and err.strip().splitlines()[-1] == "pp4_worker: interrupted" and "Traceback" not in err, err
    cache = out.read_text().split("private caches: ")[1].split()[0]
    assert not Path(cache).exists()


def test_configure_stops_with_one_line(tmp_path):
    started = tmp_path / "started"
    env = dict(os.environ, PP4_SLOW_SETUP_STARTED=str(started))
    proc = subprocess.Popen([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--setup-py",
                             str(REPO / "tests" / "fixtures" / "setuppy" / "slow")], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_from_a_terminal)
    rc, err = interrupt_when(proc, started.exists)
    assert rc == 130 and err.strip() == "configure.py: interrupted", err
    assert not (tmp_path / "build.ninja").exists()
