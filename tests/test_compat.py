"""The compatibility check, and proof that the pinned compiler, not a system CUDA, does the work."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from pp4.toolchain import compat
from pp4.toolchain.provision import Toolchain


def test_pinned_toolchain_is_compatible(toolchain, shared_cache):
    report = compat.check(toolchain, archs=["9.0"], cache_root=shared_cache)
    assert (report.nvcc_release, report.nvcc_version, report.header_release) == ("13.0", "13.0.88", "13.0")
    assert report.header_path.resolve().is_relative_to(toolchain.prefix.resolve())


def test_nvcc_release_other_than_torch_names_both_and_the_fix(toolchain, shared_cache):
    with pytest.raises(compat.CompatError) as e:
        compat.check(toolchain, cache_root=shared_cache, torch_cuda="12.6")
    msg = str(e.value)
    assert f"nvcc at {toolchain.nvcc} is CUDA 13.0 (13.0.88)" in msg
    assert "was built for CUDA 12.6" in msg
    assert "Fix: provision again with `python -m pp4.toolchain`, or pass --cuda-home with a CUDA 12.6 toolkit" in msg


def test_mixed_headers_are_refused(toolchain, shared_cache, tmp_path):
    """A 13.0 nvcc whose include/ holds 12.8 runtime headers (the seed notes' 'mixed toolkit')."""
    mixed = tmp_path / "mixed"
    # A copy, not hard links: a link changes the ctime of the shared toolchain's files, which makes any
    # compile running meanwhile (another test worker's) unstorable ("changed while it was compiled").
    shutil.copytree(toolchain.prefix, mixed, symlinks=True)
    header = mixed / "include" / "cuda_runtime_api.h"
    text = header.read_text()
    header.unlink()
    header.write_text(re.sub(r"#define CUDART_VERSION\s+\d+", "#define CUDART_VERSION 12080", text))
    with pytest.raises(compat.CompatError) as e:
        compat.check(Toolchain(mixed, "13.0", "test-mixed", pinned=True), cache_root=shared_cache)
    assert f"includes headers of CUDA 12.8 ({mixed}/include/cuda_runtime_api.h)" in str(e.value)
    assert "torch was built for CUDA 13.0 and nvcc is 13.0: a mixed toolkit" in str(e.value)


def test_unknown_arch_fails_the_probe_with_a_clear_error(toolchain, shared_cache):
    with pytest.raises(compat.CompatError, match=r"cannot compile a probe kernel for sm_42"):
        compat.check(toolchain, archs=["4.2"], cache_root=shared_cache)


def test_the_probe_compiles_an_arch_with_ptx_as_the_build_does(toolchain, tmp_path):
    """`9.0+PTX` once reached nvcc as compute_90+PTX (issue 55). A private cache root, so no
    stamp of an earlier probe stands in for the compile."""
    _, full = compat.nvcc_version(toolchain.nvcc, tmp_path)
    assert compat.probe_compile(toolchain.nvcc, full, "9.0+PTX", tmp_path, cache_root=tmp_path / "cache") is False
    stamps = list((tmp_path / "cache").rglob("probes/*.ok"))
    assert len(stamps) == 1
    command = stamps[0].read_text().split()
    assert command[-2:] == ["-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90"]


def _decoy(path: Path, marker: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho decoy $0 >> {marker}\nexit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed (.ci/run installs it)")
def test_decoys_are_never_run_and_no_system_cuda_file_is_opened(tmp_path, wheelhouse):
    """A failing nvcc first on PATH, a decoy CUDA_HOME: provisioning plus a probe compile still pass,
    the decoys never run, and strace sees no file under /usr/local/cuda opened or executed."""
    marker = tmp_path / "decoy-ran"
    _decoy(tmp_path / "decoy-bin" / "nvcc", marker)
    _decoy(tmp_path / "decoy-cuda" / "bin" / "nvcc", marker)
    env = dict(os.environ, PATH=f"{tmp_path / 'decoy-bin'}:{os.environ['PATH']}",
               CUDA_HOME=str(tmp_path / "decoy-cuda"), CUDA_PATH=str(tmp_path / "decoy-cuda"),
               PP4_CACHE_DIR=str(tmp_path / "cache"))
    trace = tmp_path / "trace"
    cmd = ["strace", "-f", "-qq", "-e", "trace=open,openat,execve,stat,newfstatat,access", "-o", str(trace),
           sys.executable, "-m", "pp4.toolchain", "provision", "--wheel-dir", str(wheelhouse), "--arch", "9.0"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "probe compiled for sm_90" in proc.stdout
    assert not marker.exists(), marker.read_text()
    text = trace.read_text()
    nvcc_runs = re.findall(r'execve\("([^"]*/nvcc)"', text)
    assert nvcc_runs and all(p.startswith(str(tmp_path / "cache")) for p in nvcc_runs), nvcc_runs
    touched = [ln for ln in text.splitlines() if "/usr/local/cuda" in ln]
    assert touched == []
