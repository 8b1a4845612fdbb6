"""A setup.py pp4 runs is limited by the CPU its processes use, never by wall time (issue 55: a
project's setup.py stopped at 300 s of wall time, at nice 19 on a busy machine, after 3.6
CPU-seconds). Real child processes, a real CPU hog on the same CPU, small limits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

# Stands in for a setup.py run (argv: setup.py, report.json, then its own): spins for argv[3]
# CPU-seconds in itself, or, with argv[4] == "grandchild", in a process it starts and waits for.
CHILD = r'''
import json, os, subprocess, sys, time
work, where = float(sys.argv[3]), sys.argv[4]
spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < %r: pass\n" % work
if where == "grandchild":
    grandchild = subprocess.Popen([sys.executable, "-c", spin])
    open(sys.argv[5], "w").write(str(grandchild.pid))
    grandchild.wait()
else:
    exec(spin)
json.dump({"done": True}, open(sys.argv[2], "w"))
'''

# Runs the child as `ninja wheel`'s stage does (pp4/wheel/__main__.py: nice 19), on one CPU.
RUNNER = r'''
import json, os, sys, time
from pathlib import Path
from pp4.sources import setuppy
cpu, limit, child, setup_py, args = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), sys.argv[5:]
os.sched_setaffinity(0, {cpu})
os.nice(19)
t = time.monotonic()
try:
    setuppy.run_child(child, setup_py, args, setup_py.parent, [], cpu_limit_s=limit)
    print(json.dumps({"ok": True, "wall": time.monotonic() - t}))
except setuppy.ExtensionError as e:
    print(json.dumps({"ok": False, "error": str(e), "wall": time.monotonic() - t}))
'''


def run_niced(tmp_path: Path, cpu: int, limit: float, *args: str) -> dict:
    setup_py = tmp_path / "setup.py"
    setup_py.write_text("")
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(cpu), str(limit), CHILD, str(setup_py), *args],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def hog():
    """A process at nice 0 that takes CPU 0 whenever it may, as a compile would."""
    cpu = 0
    proc = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    time.sleep(0.2)
    yield cpu
    proc.kill()
    proc.wait()


def test_a_niced_setup_py_beside_a_cpu_hog_is_not_stopped_for_its_wall_time(tmp_path, hog):
    """0.1 CPU-seconds of work at nice 19 against a nice-0 hog on its CPU takes far longer in wall
    time than the limit allows in CPU (1 s): it finishes, where a wall-clock limit of 1 s would
    have stopped it."""
    result = run_niced(tmp_path, hog, 1.0, "0.1", "self")
    assert result["ok"], result
    assert result["wall"] > 1.0, result  # the hog did stretch it: the test shows what it claims


def test_a_setup_py_whose_processes_spin_is_stopped_by_their_cpu_and_the_message_says_so(tmp_path):
    """The CPU is counted in a process it started (a grandchild of pp4), and that process is
    stopped with it."""
    pidfile = tmp_path / "grandchild.pid"
    result = run_niced(tmp_path, 0, 1.0, "1000", "grandchild", str(pidfile))
    assert not result["ok"], result
    error = result["error"]
    assert error.startswith(f"{tmp_path / 'setup.py'} used "), error
    used = float(error.split(" used ")[1].split(" CPU-seconds")[0])
    assert 1.0 <= used < 3.0, error
    assert "CPU-seconds (all its processes together, read from /proc) in " in error
    assert error.endswith("s of wall time without finishing: pp4 stops a setup.py at 1 CPU-seconds (does it compile "
                          "or download something before setup()?)"), error
    grandchild = int(pidfile.read_text())
    assert not Path(f"/proc/{grandchild}").exists() or "Z" in Path(f"/proc/{grandchild}/stat").read_text().split()[2]
