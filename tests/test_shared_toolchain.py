"""Two pp4s sharing one cache (issue 65): while one builds with a toolchain prefix, another pp4 that
lays prefixes out differently provisions the same lock. The first's prefix keeps its inodes and
their ctimes (nothing replaced it, nothing linked to it), and its compile is kept in the store."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from test_build import ninja_bin, run
from test_faults import certificate

from pp4.toolchain import provision as tc

pytestmark = pytest.mark.slow

# Another pp4 version: its manifests say version 2, so this version's prefixes do not pass its check.
OTHER_PP4 = """
import sys
from pathlib import Path
from pp4.toolchain import prefixcheck, provision
from pp4.toolchain.locks import lock_for_cuda
from pp4.toolchain.torchenv import torch_cuda_version
prefixcheck.MANIFEST_VERSION = provision.MANIFEST_VERSION = 2
r = provision.provision(lock_for_cuda(torch_cuda_version()), Path(sys.argv[1]), Path(sys.argv[2]))
print(r.toolchain.prefix)
"""


def compiling(output: str) -> bool:
    """Whether nvcc runs now for this object: a process whose first argument is nvcc and which names it."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"/nvcc") and output.encode() in cmd:
            return True
    return False


def identity(prefix: Path) -> list[tuple]:
    return [(p, os.lstat(p).st_ino, os.lstat(p).st_ctime_ns)
            for p in [prefix, prefix / "bin" / "nvcc", prefix / "nvvm" / "bin" / "cicc", prefix / "include" / "cuda.h"]]


def test_another_pp4_provisioning_during_a_build_leaves_its_prefix_and_store_alone(tmp_path, lock, wheelhouse):
    cache = tmp_path / "cache"
    mine = tc.provision(lock, cache, wheelhouse).toolchain.prefix
    before = identity(mine)
    work = tmp_path / "work"
    work.mkdir()
    # ATen's headers: a compile of several seconds, long enough for the other pp4 to provision meanwhile
    (work / "unit.cu").write_text("#include <ATen/ATen.h>\n__global__ void k(float* x) { x[threadIdx.x] += 1; }\n"
                                  "void launch(float* x) { k<<<1, 32>>>(x); }\n")
    (work / "ext.toml").write_text('name = "pp4_shared_fixture"\nsources = ["unit.cu"]\n')
    env = {**os.environ, "PYTHONPATH": str(REPO), "PP4_CACHE_DIR": str(cache)}
    run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", str(work / "ext.toml"),
         "--cache-dir", str(cache), "--wheel-dir", str(wheelhouse), "--store", str(tmp_path / "store")], work, env)
    build = subprocess.Popen([ninja_bin()], cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    deadline = time.monotonic() + 300
    while not compiling("build/pp4_shared_fixture/obj/unit.cu.o"):
        assert build.poll() is None, build.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    other = subprocess.run([sys.executable, "-c", OTHER_PP4, str(cache), str(wheelhouse)], cwd=REPO, env=env,
                           capture_output=True, text=True)
    overlapped = build.poll() is None
    out, _ = build.communicate(timeout=600)
    assert other.returncode == 0, other.stderr
    assert build.returncode == 0, out
    assert overlapped, "the compile ended before the other pp4 had provisioned: make it longer"
    theirs = Path(other.stdout.strip())
    assert theirs != mine and (theirs / "bin" / "nvcc").is_file()  # beside it, under its own name
    assert identity(mine) == before  # not replaced, not linked to: same inodes, same ctimes
    assert tc.check_prefix(mine, deep=True) == []
    objects = certificate(work)["objects"]
    assert objects and all(o.get("not_stored") is None for o in objects), objects
    assert "changed while it was compiled" not in out
