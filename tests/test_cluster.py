"""`--executor ray://...`: compiles that miss the store run on a real local Ray cluster (a head with
no CPUs for tasks and worker nodes of one CPU each, started with Ray's own cluster utilities: real
raylets, real object transfers), and the results are the local build's: the same keys, certificate
and audit. The oracle for every object is a local compile of the same unit (equal up to the pid
digits nvcc writes into its temporary file names), never pp4's own records."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow
ray_cluster_utils = pytest.importorskip("ray.cluster_utils")

FIXTURE = REPO / "tests" / "fixtures" / "multifile"


def ninja_bin() -> str:
    from ninja import BIN_DIR

    return str(Path(BIN_DIR) / "ninja")


def run(cmd, cwd, check=True, env=None):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, env=env)
    if check:
        assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def same_object(a: Path, b: Path) -> bool:
    """Byte for byte: a node compiles in the same fixed root as this machine."""
    return a.read_bytes() == b.read_bytes()


def configure(work: Path, *args) -> str:
    return run([sys.executable, REPO / "configure.py", "--arch", "9.0", *args], work).stdout


def tree(base: Path, name: str) -> Path:
    work = base / name
    work.mkdir()
    shutil.copytree(FIXTURE, work / "src")
    return work


def events_of(work: Path) -> dict[str, dict]:
    out = {}
    for p in (work / "build" / ".pp4" / "events").glob("*.json"):
        doc = json.loads(p.read_text())
        out[doc["output"]] = doc
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, toolchain):
    """A head (no CPUs for tasks) and two worker nodes of one CPU each. The nodes keep their blobs
    and trees in a folder of their own (PP4_NODE_DIR, read by the nodes' workers)."""
    node_dir = tmp_path_factory.mktemp("nodes")
    old = os.environ.get("PP4_NODE_DIR")
    os.environ["PP4_NODE_DIR"] = str(node_dir)
    c = ray_cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [c.add_node(num_cpus=1), c.add_node(num_cpus=1)]
    c.wait_for_nodes()
    yield c, nodes, node_dir
    c.shutdown()
    if old is None:
        os.environ.pop("PP4_NODE_DIR", None)
    else:
        os.environ["PP4_NODE_DIR"] = old


@pytest.fixture(scope="module")
def local_build(tmp_path_factory, toolchain):
    """The oracle: the fixture and P2P compiled here, without the cluster or any store."""
    work = tree(tmp_path_factory.mktemp("local"), "w")
    configure(work, "--ext", "p2p", "--ext-spec", "src/ext.toml", "--no-reuse")
    run([ninja_bin()], work)
    return work


def test_misses_compile_on_the_workers_and_equal_local_compiles(cluster, local_build, tmp_path):
    c, _, _ = cluster
    work = tree(tmp_path, "w")
    out = configure(work, "--ext", "p2p", "--ext-spec", "src/ext.toml", "--store", tmp_path / "store",
                    "--executor", f"ray://{c.address}")
    assert f"cluster {c.address}: 2 CPUs" in out
    assert re.search(r"configure: 2 job\(s\)", out)
    build = run([ninja_bin()], work)
    assert "warning" not in build.stdout + build.stderr, build.stdout  # ninja passes on what a command prints
    evs = events_of(work)
    objects = sorted(evs)
    assert len(objects) == 5  # p2p.cu, bindings.cpp and the fixture's three units
    assert all(evs[o]["status"] == "compiled" and evs[o]["executed_on"] for o in objects), evs
    for o in objects:
        assert same_object(work / o, local_build / o), o
    cert = json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))
    assert sorted(o["output"] for o in cert["objects"] if o["executed_on"]) == objects
    run([ninja_bin(), "certify"], work)  # the audit: each object against its inputs and the store
    # Stored like local compiles: a second checkout restores every object from the store.
    again = tree(tmp_path, "again")
    configure(again, "--ext", "p2p", "--ext-spec", "src/ext.toml", "--store", tmp_path / "store",
              "--executor", f"ray://{c.address}")
    assert "5 of 5 missing objects restored" in run([ninja_bin()], again).stdout
    code = ("import sys, torch; sys.path.insert(0, %r); from pp4.certify.loader import load_target; "
            "m = load_target('pp4_fixture', 'build'); print(m.scale(6), torch.cuda.is_initialized())") % str(REPO)
    assert run([sys.executable, "-c", code], work).stdout.split() == ["42", "False"]


def test_a_node_with_another_torch_is_caught_and_its_object_never_used(local_build, tmp_path, toolchain):
    """A cluster whose only worker node sees another torch: one of torch's headers (pybind11.h,
    which the fixture's bindings unit includes) differs there. Its CUDA units, which read no torch
    header, are accepted; the bindings unit is refused by the node's name and compiled here."""
    import torch

    real = Path(torch.__file__).parent
    fake_site = tmp_path / "other-torch"
    (fake_site / "torch").mkdir(parents=True)
    for entry in ("__init__.py", "version.py"):
        (fake_site / "torch" / entry).symlink_to(real / entry)
    run(["cp", "-rs", real / "include", fake_site / "torch" / "include"], tmp_path)
    header = fake_site / "torch" / "include" / "pybind11" / "pybind11.h"
    text = header.read_text()
    header.unlink()
    header.write_text(text + "\n// another torch build\n")
    c = ray_cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        c.add_node(num_cpus=1, env_vars={"PYTHONPATH": str(fake_site), "PP4_NODE_DIR": str(tmp_path / "node")})
        c.wait_for_nodes()
        work = tree(tmp_path, "w")
        configure(work, "--ext-spec", "src/ext.toml", "--store", tmp_path / "store", "--executor", f"ray://{c.address}")
        build = run([ninja_bin()], work)
    finally:
        c.shutdown()
    refusals = [line for line in build.stdout.splitlines() if "its object is not used" in line]
    assert len(refusals) == 1 and "ops.cpp.o" in refusals[0], build.stdout
    # It names the first of the node's observations that does not hold here: a header of that torch
    # (whose headers are links to this machine's, and one differs).
    assert f"({real / 'include'}/" in refusals[0], build.stdout
    assert re.search(r"cluster node \S+/[0-9a-f]{12} compiled", refusals[0])
    evs = events_of(work)
    assert not evs["build/pp4_fixture/obj/src/ops.cpp.o"].get("executed_on")
    assert evs["build/pp4_fixture/obj/src/scale.cu.o"]["executed_on"] and evs["build/pp4_fixture/obj/src/shift.cu.o"]["executed_on"]
    for o in evs:
        assert same_object(work / o, local_build / o), o


def test_an_unreachable_cluster_costs_one_warning_and_the_build_compiles_here(local_build, tmp_path, toolchain):
    work = tree(tmp_path, "w")
    out = configure(work, "--ext-spec", "src/ext.toml", "--store", tmp_path / "store", "--executor", "ray://127.0.0.1:9")
    assert "configure: warning: cluster 127.0.0.1:9 does not answer" in out
    assert "job(s)" in out
    t0 = time.monotonic()
    build = run([ninja_bin(), "-j", "2"], work)
    assert time.monotonic() - t0 < 120
    assert build.stdout.count("cluster 127.0.0.1:9 does not answer") == 1, build.stdout
    evs = events_of(work)
    assert len(evs) == 3 and all(ev["status"] == "compiled" and not ev.get("executed_on") for ev in evs.values())
    for o in evs:
        assert same_object(work / o, local_build / o), o


def _processes_named(fragment: str) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if fragment in (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def _descendants(pid: int) -> list[int]:
    kids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
                if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                    kids.append(int(p.name))
            except (OSError, ValueError):
                pass
    return kids + [d for k in kids for d in _descendants(k)]


def a_compile_running_on_a_worker(timeout: float = 60) -> tuple[int, list[int]] | None:
    """(pid of the Ray worker running a compile task, its compiler processes), once the compiler
    runs under it; None when none does within timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in _processes_named("ray::compile_remote"):
            kids = _descendants(pid)
            if kids:
                return pid, kids
        time.sleep(0.1)
    return None


def test_a_stopped_node_is_waited_for_a_bounded_time_then_the_compile_runs_here(cluster, local_build, tmp_path):
    """The worker running the compile is stopped (SIGSTOP, compiler and all): after
    --executor-timeout the task is cancelled and the unit compiles here."""
    c, _, _ = cluster
    work = tree(tmp_path, "w")
    configure(work, "--ext-spec", "src/ext.toml", "--store", tmp_path / "store", "--executor", f"ray://{c.address}",
              "--executor-timeout", "25", "-j", "1")
    stopped: list[int] = []

    def stop_the_first_compile():
        running = a_compile_running_on_a_worker()
        for p in [running[0], *running[1]] if running else []:
            try:
                os.kill(p, signal.SIGSTOP)
                stopped.append(p)
            except ProcessLookupError:
                pass

    t = threading.Thread(target=stop_the_first_compile)
    t.start()
    build = run([ninja_bin(), "build/pp4_fixture/obj/src/scale.cu.o"], work, check=False)
    t.join()
    for p in stopped:
        try:
            os.kill(p, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert stopped, "no compile was seen running on a worker"
    assert build.returncode == 0, build.stdout
    assert "no cluster node finished build/pp4_fixture/obj/src/scale.cu.o within 25 s" in build.stdout, build.stdout
    ev = events_of(work)["build/pp4_fixture/obj/src/scale.cu.o"]
    assert ev["status"] == "compiled" and not ev.get("executed_on")
    assert same_object(work / ev["output"], local_build / ev["output"])


def test_a_node_killed_mid_compile_is_replaced_and_nothing_wrong_is_stored(cluster, local_build, tmp_path):
    """One of the two worker nodes dies while it compiles: Ray runs the task again on the other
    (or, failing that, the unit compiles here); the build finishes and its objects are right."""
    c, nodes, _ = cluster
    work = tree(tmp_path, "w")
    configure(work, "--ext-spec", "src/ext.toml", "--store", tmp_path / "store", "--executor", f"ray://{c.address}",
              "-j", "1")
    killed: list = []

    def kill_the_node_that_compiles():
        running = a_compile_running_on_a_worker()
        for node in nodes if running else []:
            if node in c.worker_nodes and running[0] in _descendants(node.all_processes["raylet"][0].process.pid):
                c.remove_node(node, allow_graceful=False)
                killed.append(node)
                return

    t = threading.Thread(target=kill_the_node_that_compiles)
    t.start()
    build = run([ninja_bin(), "build/pp4_fixture/obj/src/scale.cu.o"], work, check=False)
    t.join()
    assert killed, "no compile was seen running on a worker node"
    assert build.returncode == 0, build.stdout
    ev = events_of(work)["build/pp4_fixture/obj/src/scale.cu.o"]
    assert ev["status"] == "compiled"
    assert killed[0].node_id[:12] not in (ev.get("executed_on") or "")  # ran again elsewhere, or here
    assert same_object(work / ev["output"], local_build / ev["output"])
