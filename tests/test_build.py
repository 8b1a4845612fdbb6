"""configure.py and ninja end to end, with the pinned nvcc: real compiles of a small multi-file
fixture and of the P2P extension, exact incremental rebuilds, the generator rule, pins, compdb."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

FIXTURE = REPO / "tests" / "fixtures" / "multifile"


def ninja_bin() -> str:
    from ninja import BIN_DIR

    return str(Path(BIN_DIR) / "ninja")


def run(cmd, cwd, env=None, check=True):
    proc = subprocess.run(cmd, cwd=cwd, env=env or os.environ.copy(), capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def built_edges(ninja_output: str) -> list[str]:
    """The outputs ninja ran an edge for, from its [n/m] DESCRIPTION OUTPUT status lines."""
    return re.findall(r"^\[\d+/\d+\] \w+ (\S+)", ninja_output, re.M)


def configure(workdir: Path, *args: str, env=None):
    return run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", *args], workdir, env)


@pytest.fixture(scope="module")
def fixture_build(tmp_path_factory, toolchain):
    """The fixture extension configured and built once in a scratch tree (edits stay there)."""
    base = tmp_path_factory.mktemp("fixture-build")
    src = base / "src"
    shutil.copytree(FIXTURE, src)
    work = base / "work"
    work.mkdir()
    out = configure(work, "--ext-spec", str(src / "ext.toml"))
    assert "build.ninja written" in out.stdout
    first = run([ninja_bin()], work)
    return work, src, first.stdout


def _call_fixture(work: Path) -> dict:
    code = ("import sys, json; sys.path.insert(0, %r); from pp4.certify.loader import load_target; "
            "m = load_target('pp4_fixture', 'build'); print(json.dumps([m.scale(6), m.shift(6), m.shift_constant]))") % str(REPO)
    proc = run([sys.executable, "-c", code], work)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_fixture_builds_and_imports(fixture_build):
    work, src, output = fixture_build
    edges = built_edges(output)
    assert {"build/pp4_fixture/obj/src/ops.cpp.o", "build/pp4_fixture/obj/src/scale.cu.o",
            "build/pp4_fixture/obj/src/shift.cu.o"} <= set(edges)
    assert _call_fixture(work) == [42, 9, 3]


def test_second_ninja_does_nothing(fixture_build):
    work, _, _ = fixture_build
    out = run([ninja_bin()], work)
    assert "ninja: no work to do." in out.stdout


def test_a_lock_file_newer_than_the_toolchain_is_checked_once(tmp_path, toolchain):
    """A fresh checkout or a pull leaves the lock file newer than the manifest of a toolchain that a
    shared cache provisioned earlier: ninja runs the toolchain step once, then no work, not every time.
    The lock touched is a copy's: tests run two at a time, and this checkout's lock is read by every
    other test's build."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "pp4", checkout / "pp4", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "configure.py", checkout / "configure.py")
    src, work = tmp_path / "src", tmp_path / "work"
    shutil.copytree(FIXTURE, src)
    work.mkdir()
    run([sys.executable, str(checkout / "configure.py"), "--arch", "9.0", "--ext-spec", str(src / "ext.toml")], work)
    run([ninja_bin()], work)
    text = re.sub(r" \$\n +", " ", (work / "build.ninja").read_text())  # join ninja's continued lines
    edge = re.search(r"^build (\S+\.json): toolchain \| (\S+\.toml)$", text, re.M)
    manifest, lock = Path(edge.group(1)), Path(edge.group(2))
    assert lock.is_relative_to(checkout), lock
    before = manifest.stat().st_mtime_ns
    os.utime(lock)  # now: newer than the manifest
    assert "TOOLCHAIN" in run([ninja_bin()], work).stdout
    assert manifest.stat().st_mtime_ns == before  # nothing changed, nothing rewritten
    assert "ninja: no work to do." in run([ninja_bin()], work).stdout


def test_configure_rerun_touches_nothing(fixture_build):
    work, src, _ = fixture_build
    configure(work, "--ext-spec", str(src / "ext.toml"))  # may reorder edges by the durations just measured
    before = {p: p.stat().st_mtime_ns for p in [work / "build.ninja", *(work / "build").rglob("*.json")]}
    out = configure(work, "--ext-spec", str(src / "ext.toml"))
    assert "build.ninja unchanged" in out.stdout
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert "ninja: no work to do." in run([ninja_bin()], work).stdout


def _edit(path: Path, old: str, new: str) -> None:
    path.write_text(path.read_text().replace(old, new))


def test_header_edit_rebuilds_exactly_its_dependents(fixture_build):
    work, src, _ = fixture_build
    _edit(src / "include" / "fixture" / "scale.cuh", "kScale = 7", "kScale = 5")
    edges = built_edges(run([ninja_bin()], work).stdout)
    mod = [e for e in edges if e.endswith(".so")]
    assert [e for e in edges if e.endswith(".o")] == ["build/pp4_fixture/obj/src/scale.cu.o"]
    assert len(mod) == 1
    assert _call_fixture(work) == [30, 9, 3]

    _edit(src / "include" / "fixture" / "common.h", "kShift = 3", "kShift = 4")
    edges = built_edges(run([ninja_bin()], work).stdout)
    assert sorted(e for e in edges if e.endswith(".o")) == [
        "build/pp4_fixture/obj/src/ops.cpp.o", "build/pp4_fixture/obj/src/shift.cu.o"]
    assert _call_fixture(work) == [30, 10, 4]
    assert "ninja: no work to do." in run([ninja_bin()], work).stdout


def test_system_header_is_a_dependency_of_cpp_units_too(fixture_build):
    """-MD, not torch's -MMD: a -isystem header (pybind11 from torch) is recorded for the .cpp unit."""
    work, _, _ = fixture_build
    deps = run([ninja_bin(), "-t", "deps", "build/pp4_fixture/obj/src/ops.cpp.o"], work).stdout
    assert "/torch/include/pybind11/pybind11.h" in deps
    assert "/Python.h" in deps


def test_generator_rule_reruns_configure_when_the_source_list_changes(fixture_build):
    work, src, _ = fixture_build
    spec = src / "ext.toml"
    original = spec.read_text()
    spec.write_text(original + "\n# a comment: the source list is unchanged\n")
    out = run([ninja_bin()], work)
    assert "CONFIGURE" in out.stdout
    assert [e for e in built_edges(out.stdout) if e.endswith(".o")] == []
    assert "ninja: no work to do." in run([ninja_bin()], work).stdout
    spec.write_text(original.replace('cxx_flags = ["-O2"]', 'cxx_flags = ["-O1"]'))
    out = run([ninja_bin()], work)
    assert "CONFIGURE" in out.stdout
    assert [e for e in built_edges(out.stdout) if e.endswith(".o")] == ["build/pp4_fixture/obj/src/ops.cpp.o"]
    spec.write_text(original)
    run([ninja_bin()], work)


def test_compdb_is_usable_by_clangd(fixture_build):
    work, _, _ = fixture_build
    run([ninja_bin(), "compdb"], work)
    entries = json.loads((work / "compile_commands.json").read_text())
    assert len(entries) == 3
    for e in entries:
        first = e["command"].split()[0]
        assert Path(first).name in ("nvcc", "c++", "g++"), e["command"]
        assert not {"pp4.reuse", "pp4.reuse.link", "--env"} & set(e["command"].split()), e["command"]
        assert Path(e["file"]).is_file()


def test_pin_mismatch_is_refused(fixture_build):
    work, _, _ = fixture_build
    module = next((work / "build" / "pp4_fixture").glob("pp4_fixture*.so"))
    saved = module.read_bytes()
    try:
        module.write_bytes(saved + b"\0")
        code = f"import sys; sys.path.insert(0, {str(REPO)!r}); from pp4.certify.loader import load_target; load_target('pp4_fixture', 'build')"
        proc = run([sys.executable, "-c", code], work, check=False)
        assert proc.returncode != 0
        assert "but its pin says" in proc.stderr and "Rebuild it with ninja; do not load it." in proc.stderr
    finally:
        module.write_bytes(saved)


def test_the_link_launcher_applies_limits(fixture_build, tmp_path):
    """The launcher links run under really applies affinity, nice and the address-space cap."""
    work, _, _ = fixture_build
    config = json.loads((work / "build" / "pp4.json").read_text())
    limits = config["limits"]
    probe = tmp_path / "probe.sh"
    probe.write_text("#!/bin/sh\ngrep -E 'Cpus_allowed_list' /proc/self/status\nulimit -v\nnice\necho GPU=[$CUDA_VISIBLE_DEVICES]\n")
    probe.chmod(0o755)
    custom = dict(limits, cpus=[0], nice=7, address_space=8 << 30)
    lf = tmp_path / "pp4.json"
    lf.write_text(json.dumps(dict(config, limits=custom)))
    ran = run([sys.executable, "-m", "pp4.reuse.link", str(lf), "--env", "PATH=/usr/bin:/bin", "--", str(probe)], REPO)
    out = ran.stdout + ran.stderr  # a command's stdout goes where its stderr does (pp4/execution/run.py)
    assert re.search(r"Cpus_allowed_list:\s+0$", out, re.M)
    assert f"{8 << 20}" in out  # ulimit -v reports KiB
    assert re.search(r"^\d+$", out, re.M) and int(re.findall(r"^(\d+)$", out, re.M)[-1]) >= 7
    assert "GPU=[]" in out


def _decoy(path: Path, marker: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho decoy $0 >> {marker}\nexit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def test_p2p_builds_with_decoys_and_imports_without_a_cuda_context(tmp_path, toolchain):
    marker = tmp_path / "decoy-ran"
    _decoy(tmp_path / "decoy-bin" / "nvcc", marker)
    _decoy(tmp_path / "decoy-cuda" / "bin" / "nvcc", marker)
    env = dict(os.environ, PATH=f"{tmp_path / 'decoy-bin'}:{os.environ['PATH']}",
               CUDA_HOME=str(tmp_path / "decoy-cuda"), CUDA_PATH=str(tmp_path / "decoy-cuda"))
    work = tmp_path / "work"
    work.mkdir()
    configure(work, "--ext", "p2p", env=env)
    out = run([ninja_bin(), "p2p"], work, env)
    assert "build/p2p/pp4_p2p" in out.stdout
    assert not marker.exists()
    for obj in ("build/p2p/obj/p2p.cu.o", "build/p2p/obj/bindings.cpp.o"):
        deps = run([ninja_bin(), "-t", "deps", obj], work).stdout
        assert "/usr/local/cuda" not in deps
        assert str(toolchain.prefix) in deps or "cuda_runtime" not in deps
    assert str(toolchain.prefix) in run([ninja_bin(), "-t", "deps", "build/p2p/obj/p2p.cu.o"], work).stdout
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); import torch; from pp4.certify.loader import load_target;"
            "m = load_target('p2p', 'build');"
            "maps = open('/proc/self/maps').read();"  # the driver library is loaded at the first CUDA call
            "print('context', torch.cuda.is_initialized(), '/libcuda.so' in maps, sorted(n for n in dir(m) if not n.startswith('_')))")
    proc = run([sys.executable, "-c", code], work, env)
    assert "context False False" in proc.stdout
    for fn in ("can_access_peer", "enable_peer_access", "export_ipc_handle", "open_ipc_handle", "peer_copy"):
        assert fn in proc.stdout
    pin = json.loads(next((work / "build" / "p2p").glob("*.pin.json")).read_text())
    assert re.fullmatch(r"[0-9a-f]{64}", pin["sha256"]) and re.fullmatch(r"[0-9a-f]{64}", pin["source_key"])


def test_limits_are_applied_to_a_real_compile(fixture_build, tmp_path):
    """A real nvcc compile through the reuse wrapper, as ninja runs it: every compiler process it
    starts (nvcc, cc1plus, cicc, ptxas ...) has the configured CPUs, niceness and address-space cap,
    read from /proc while it runs."""
    work, _, _ = fixture_build
    config = json.loads((work / "build" / "pp4.json").read_text())
    config["limits"] = dict(config["limits"], cpus=[0], nice=7, address_space=8 << 30)
    config["reuse"]["store"] = None  # compile, whatever is stored
    cfg_file = tmp_path / "pp4.json"
    cfg_file.write_text(json.dumps(config))
    action = next(a for a in json.loads((work / "build" / "actions.json").read_text())["actions"]
                  if a["output"].endswith("shift.cu.o"))
    argv = [a.replace(action["output"], str(tmp_path / "shift.cu.o")) for a in action["argv"]]
    env_args = [x for k, v in sorted(action["env"].items()) for x in ("--env", f"{k}={v}")]
    proc = subprocess.Popen([sys.executable, "-m", "pp4.reuse", str(cfg_file), *env_args, "--", *argv], cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen: dict[str, tuple[str, int, str]] = {}
    while proc.poll() is None:
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                cwd = os.readlink(d / "cwd")  # in the fixed root: <work>/build/tmp/pp4-runs/run-.../root/pp4/work
                if cwd != str(work) and not (cwd.startswith(f"{work}/") and cwd.endswith("/pp4/work")):
                    continue
                name = Path((d / "cmdline").read_bytes().split(b"\0")[0].decode()).name
                if name not in ("nvcc", "cc1plus", "cicc", "ptxas", "cudafe++", "fatbinary") or name in seen:
                    continue
                status = (d / "status").read_text()
                nice = int((d / "stat").read_text().rsplit(")", 1)[1].split()[16])
                limits = (d / "limits").read_text()
            except (OSError, IndexError, ValueError):
                continue
            cpus = re.search(r"^Cpus_allowed_list:\s+(\S+)$", status, re.M).group(1)
            address = re.search(r"^Max address space\s+(\S+)", limits, re.M).group(1)
            seen[name] = (cpus, nice, address)
        time.sleep(0.01)
    assert proc.returncode == 0, proc.stdout.read().decode()[-2000:]
    assert (tmp_path / "shift.cu.o").stat().st_size > 0
    assert {"nvcc", "cc1plus"} <= set(seen), seen  # cc1plus runs twice or more, for ~a second each
    for name, (cpus, nice, address) in seen.items():
        assert (cpus, nice, address) == ("0", min(19, os.nice(0) + 7), str(8 << 30)), (name, seen)


def test_pin_check_takes_a_str_path_as_the_readme_writes_it(fixture_build):
    """README: `pp4.certify.pin.check(path)`, then `torch.ops.load_library(path)`, path a str."""
    from pp4.certify import pin

    work, _, _ = fixture_build
    (module,) = (work / "build" / "pp4_fixture").glob("pp4_fixture*.so")
    checked = pin.check(str(module))
    assert checked["sha256"] == hashlib.sha256(module.read_bytes()).hexdigest()
