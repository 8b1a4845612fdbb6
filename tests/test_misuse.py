"""Misuse a newcomer meets (issue 65): each answered by one line that says what is wrong and how to
fix it, at configure where it can be known there, never a traceback. configure, ninja and the store's
command run as a user runs them, on the small C++ fixture (g++ only: the point is not CUDA)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
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


# ------------------------------------------------------------------ a tiny C++ project of one module


def tiny_project(folder: Path, flag: str = "-O1", k: int = 1) -> Path:
    """One module of two C++ units (no pybind11, no torch header: each compiles in a fraction of a
    second); a.cpp reads inc/k.h, b.cpp reads nothing of the project."""
    (folder / "inc").mkdir(parents=True, exist_ok=True)
    (folder / "inc" / "k.h").write_text(f"#define K {k}\n")
    (folder / "a.cpp").write_text('#include "k.h"\nint a() { return K; }\n')
    (folder / "b.cpp").write_text("int b() { return 2; }\n")
    spec = folder / "ext.toml"
    spec.write_text(f'name = "pp4_tiny"\nkind = "cpp"\nsources = ["a.cpp", "b.cpp"]\ninclude_dirs = ["inc"]\n'
                    f'cxx_flags = ["{flag}"]\n')
    return spec


def ninja(work: Path, *targets: str, env=None) -> subprocess.CompletedProcess:
    return run([ninja_bin(), *targets], work, env)


def statuses(work: Path) -> dict[str, str]:
    doc = json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))
    return {Path(o["output"]).name: o["status"] for o in doc["objects"]}


def why(work: Path, obj: str, env=None) -> list[str]:
    proc = run([PY, "-m", "pp4.reuse", "why", obj], work, env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    return proc.stdout.splitlines()


def certificate_keys(work: Path) -> dict[str, str]:
    doc = json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))
    return {Path(o["output"]).name: o["action_key"] for o in doc["objects"]}


A_OBJ = "build/pp4_tiny/obj/a.cpp.o"


def test_why_names_the_header_that_differs_then_the_flag(tmp_path, toolchain):
    src, work = tmp_path / "src", tmp_path / "w"
    spec = tiny_project(src)
    assert configure(work, spec, "--store", str(tmp_path / "store")).returncode == 0
    assert ninja(work).returncode == 0
    first = certificate_keys(work)["a.cpp.o"]
    old = hashlib.sha256((src / "inc" / "k.h").read_bytes()).hexdigest()

    tiny_project(src, k=2)
    rebuilt = ninja(work)
    assert rebuilt.returncode == 0 and statuses(work) == {"a.cpp.o": "compiled", "b.cpp.o": "reused"}, rebuilt.stdout
    new = hashlib.sha256((src / "inc" / "k.h").read_bytes()).hexdigest()
    lines = why(work, A_OBJ)
    assert lines[0] == (f"{A_OBJ} was compiled, not restored: the first observation that differs: {src}/inc/k.h: "
                        f"sha256 {old[:12]} when compiled, sha256 {new[:12]} now"), lines
    assert re.fullmatch(rf"  compared with: action {first[:16]}, stored \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC for "
                        rf"{re.escape(str(work))}/{A_OBJ}, signed by pp4-tests", lines[1]), lines
    assert len(lines) == 2, lines
    explained = ninja(work, "explain")  # every object compiled: a.cpp.o alone; builds nothing
    assert explained.returncode == 0 and "\n".join(lines) in explained.stdout, explained.stdout
    assert "b.cpp.o" not in explained.stdout and "CXX" not in explained.stdout
    b_key = certificate_keys(work)["b.cpp.o"]  # its source file rewritten with the same bytes: restored
    assert why(work, "build/pp4_tiny/obj/b.cpp.o") == [
        f"build/pp4_tiny/obj/b.cpp.o was restored (wrapper, local store), entry {b_key[:16]}, signed by pp4-tests"]

    tiny_project(src, flag="-O2", k=2)
    assert ninja(work).returncode == 0
    lines = why(work, A_OBJ)
    assert lines[0].startswith(f"{A_OBJ} was compiled, not restored: no entry of this command in the store "
                               "(manifest key "), lines
    assert lines[1].startswith(f"  the command differs from the one stored for {A_OBJ} on "), lines
    assert lines[1].endswith("signed by pp4-tests): -O1 then, -O2 now"), lines

    tiny_project(src, flag="-O1", k=1)  # what the first build compiled: every object restored
    assert ninja(work).returncode == 0
    assert why(work, A_OBJ) == [f"{A_OBJ} was restored (prepass, local store), entry {first[:16]}, "
                                "signed by pp4-tests"]
    assert why(work, "build/nothing.o")[0].startswith("build/nothing.o is not an object of this build (its objects: ")


def test_revoking_a_key_rebuilds_what_only_it_vouched_for(tmp_path, toolchain):
    """Alice builds and stores; Bob, who trusts her, restores a.cpp.o and compiles his own b.cpp.o;
    Bob revokes her key: `ninja certify` fails saying to run ninja, `ninja` compiles a.cpp.o again
    (and leaves his own b.cpp.o), then certify passes."""
    store = tmp_path / "store"
    alice_cfg, bob_cfg = tmp_path / "alice-config", tmp_path / "bob-config"
    alice, bob = env_with(PP4_CONFIG_DIR=str(alice_cfg)), env_with(PP4_CONFIG_DIR=str(bob_cfg))
    for who, env in (("alice", alice), ("bob", bob)):
        assert run([PY, "-m", "pp4.store", "keys", "new", "--name", who], tmp_path, env).returncode == 0
    assert run([PY, "-m", "pp4.store", "keys", "trust", str(alice_cfg / "keys" / "signing.pub")], tmp_path,
               bob).returncode == 0
    spec_a = tiny_project(tmp_path / "src-a")
    assert configure(tmp_path / "wa", spec_a, "--store", str(store), env=alice).returncode == 0
    assert ninja(tmp_path / "wa", env=alice).returncode == 0

    spec_b = tiny_project(tmp_path / "src-b")
    (tmp_path / "src-b" / "b.cpp").write_text("int b() { return 3; }\n")  # Bob's own change
    work = tmp_path / "wb"
    assert configure(work, spec_b, "--store", str(store), env=bob).returncode == 0
    assert ninja(work, env=bob).returncode == 0
    assert statuses(work) == {"a.cpp.o": "reused", "b.cpp.o": "compiled"}
    b_before = (work / "build/pp4_tiny/obj/b.cpp.o").stat()

    revoked = run([PY, "-m", "pp4.store", "keys", "revoke", str(alice_cfg / "keys" / "signing.pub")], tmp_path, bob)
    assert revoked.returncode == 0, revoked.stderr
    audit = ninja(work, "certify", env=bob)
    assert audit.returncode != 0 and "Traceback" not in audit.stdout + audit.stderr, audit.stdout
    assert ("1 restored object(s) were vouched for by keys this build no longer trusts enough: run `ninja`, which "
            "compiles them (or restores them from entries still trusted), then `ninja certify`") in audit.stderr, \
        audit.stderr
    assert (work / "build/pp4_tiny/obj/a.cpp.o").exists()  # certify builds nothing

    rebuilt = ninja(work, env=bob)
    assert rebuilt.returncode == 0, rebuilt.stdout
    assert (f"pp4: 1 output(s) no longer match what made them, which ninja's file times cannot show (first, {A_OBJ}: "
            "restored from an entry signed by alice, no longer trusted (0 trusted signer(s) left, 1 required)): "
            "removed, so this run builds them again") in rebuilt.stdout.splitlines(), rebuilt.stdout
    assert statuses(work) == {"a.cpp.o": "compiled", "b.cpp.o": "compiled"}
    assert (work / "build/pp4_tiny/obj/b.cpp.o").stat().st_ino == b_before.st_ino  # his own object stayed
    assert "audit passed" in ninja(work, "certify", env=bob).stdout
    assert ninja(work, env=bob).stdout.strip().splitlines()[-1] == "ninja: no work to do."


def test_the_picture_names_every_row_and_what_each_grey_bar_did():
    """Rows for the build's own edges are named for what they do, not for a folder of their path
    ("root", ".pp4"), and a grey bar says which module it linked or pinned, not "other"."""
    import xml.etree.ElementTree as ET

    from pp4.report import picture
    from pp4.report.timeline import Step

    outputs = ["/root/.cache/pp4/toolchains/cuda-13.0-x/.pp4-toolchain.json", "build/.pp4/recheck.stamp",
               "build/.pp4/prepass.stamp", "build/pp4_tiny/obj/a.cpp.o", "build/pp4_tiny/pp4_tiny.cpython-311.so",
               "build/pp4_tiny/pp4_tiny.cpython-311.so.pin.json", "build/certificate.json.gz"]
    steps = [Step(o, float(i), i + 0.9, "compiled" if o.endswith(".o") else "other") for i, o in enumerate(outputs)]
    root = ET.fromstring(picture.svg(steps, [], "a build"))
    ns = "{http://www.w3.org/2000/svg}"
    texts = [t.text for t in root.iter(f"{ns}text")]
    rows = sorted(t for t in texts if re.fullmatch(r"\S+: \d+ edges?.*", t))
    assert rows == ["certificate: 1 edge", "pp4_tiny: 3 edges", "prepass: 1 edge", "recheck: 1 edge",
                    "toolchain: 1 edge"], rows
    titles = [r.find(f"{ns}title").text for r in root.iter(f"{ns}rect") if r.find(f"{ns}title") is not None]
    assert "build/pp4_tiny/pp4_tiny.cpython-311.so: link of pp4_tiny, 0.9 s" in titles, titles
    assert "build/pp4_tiny/pp4_tiny.cpython-311.so.pin.json: pin of pp4_tiny, 0.9 s" in titles, titles
    assert not any(t.endswith(("other", "other, 0.9 s")) or ": other," in t for t in titles + texts), titles
    assert "link, pin, check or certificate" in texts
    trace = picture.chrome_trace(steps, [])["traceEvents"]
    assert [e["args"]["how"] for e in trace][-3:] == ["link of pp4_tiny", "pin of pp4_tiny", "certificate"]


def test_the_prepass_counts_what_the_asked_target_needs(tmp_path, toolchain):
    """`ninja pp4_one` in a fresh folder: the line counts pp4_one's objects, and says apart what it
    found for the build's other targets."""
    src = tmp_path / "src"
    tiny_project(src)
    spec = src / "two.toml"
    spec.write_text('[[extension]]\nname = "pp4_one"\nkind = "cpp"\nsources = ["a.cpp"]\ninclude_dirs = ["inc"]\n\n'
                    '[[extension]]\nname = "pp4_two"\nkind = "cpp"\nsources = ["b.cpp"]\n')
    store = str(tmp_path / "store")
    assert configure(tmp_path / "w1", spec, "--store", store).returncode == 0
    assert ninja(tmp_path / "w1").returncode == 0
    assert configure(tmp_path / "w2", spec, "--store", store).returncode == 0
    one = ninja(tmp_path / "w2", "pp4_one")
    assert one.returncode == 0, one.stdout
    said = [ln for ln in one.stdout.splitlines() if ln.startswith("pp4.reuse: ")]
    assert len(said) == 1 and re.fullmatch(r"pp4\.reuse: 1 of 1 missing objects of pp4_one restored from the store "
                                           r"in \d+\.\d\d s \(\d+\.\d\d CPU-s\); 1 of 1 of other targets too",
                                           said[0]), said


@pytest.mark.slow
def test_ctrl_c_says_how_far_the_build_got_and_the_resumed_build_says_so_at_once(tmp_path, toolchain):
    """Three units behind a compiler that sleeps 2 s, one job, ninja on a terminal (a pty) and the
    interval left at its minute: the first progress line comes within seconds, Ctrl-C ends with
    how far it got and how to go on; the resumed build (a pipe) prints a line at its start too."""
    import pty
    import signal
    import time

    from test_progress import slow_project

    work, env = slow_project(tmp_path, 2)
    env.pop("PP4_PROGRESS_S")
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([ninja_bin()], cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=secondary,
                            stderr=secondary, start_new_session=True)
    os.close(secondary)
    seen, deadline, interrupted = b"", time.monotonic() + 120, False
    while time.monotonic() < deadline and b"pp4: the build stopped" not in seen:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # the terminal's last writer closed it
            break
        seen += chunk
        if not interrupted and b"pp4: progress" in seen and b"CXX build/slow/obj/b.cpp.o" in seen:
            proc.send_signal(signal.SIGINT)  # as Ctrl-C: ninja's process group
            interrupted = True
    proc.wait(timeout=60)
    os.close(primary)
    text = seen.decode(errors="replace").replace("\r\x1b[K", "\n")
    assert interrupted, text
    assert "ninja: build stopped: interrupted by user." in text, text
    stop = re.search(r"pp4: the build stopped with (\d) of 3 objects built \(this run: (\d) compiled, 0 restored\); "
                     r"run ninja again to go on from there: what is built is kept, and only the rest compiles", text)
    assert stop and stop.group(1) == stop.group(2) and 1 <= int(stop.group(1)) < 3, text
    assert "Traceback" not in text

    resumed = run([ninja_bin()], work, env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert re.search(rf"^pp4: progress \d\d:\d\d:\d\d: {stop.group(1)} of 3 objects built \(this run: 0 compiled",
                     resumed.stdout, re.M), resumed.stdout
    assert "pp4: the build stopped" not in resumed.stdout


def test_a_project_std_older_than_torch_needs_is_warned_at_configure(tmp_path, toolchain):
    """torch's own headers say the C++ they need (#error below 202002L: C++20 for torch 2.14);
    a spec's -std=c++17 comes after torch's -std in the command and wins, so configure says so
    before anything compiles. Here the oracle reads torch's header itself."""
    from pp4.toolchain.torchenv import torch_package_dir

    include = torch_package_dir() / "include"
    needs_20 = any(re.search(r"__cplusplus\s*<\s*202002L", (include / rel).read_text(errors="replace"))
                   for rel in ("torch/headeronly/macros/Macros.h", "c10/macros/Macros.h") if (include / rel).is_file())
    if not needs_20:
        pytest.skip("this torch's headers do not need C++20")
    import torch

    spec = tiny_project(tmp_path / "src", flag="-std=c++17")
    out = configure(tmp_path / "w", spec, "--no-reuse")
    assert out.returncode == 0, out.stderr
    version = torch.__version__.split("+")[0]
    assert (f"configure: warning: pp4_tiny compiles with -std=c++17 (its C++ flags), but torch {version}'s "
            "headers need C++20: its units that include them will fail. Drop -std=c++17 from the project's flags "
            "(torch's -std=c++20 is used then) or write -std=c++20") in out.stdout.splitlines(), out.stdout
    assert out.stdout.index("warning: pp4_tiny") < out.stdout.index("build.ninja written")
    spec = tiny_project(tmp_path / "src", flag="-std=gnu++20")
    assert "-std" not in "".join(ln for ln in configure(tmp_path / "w2", spec, "--no-reuse").stdout.splitlines()
                                 if "warning" in ln)
