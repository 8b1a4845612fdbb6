"""The compile server (pp4/reuse/server.py): a ninja run's compile edges run in workers forked by
one server, which the prepass starts, with the same objects; Ctrl-C, a killed client and a killed server
end the compile they ran; PP4_NO_SERVER=1 runs every edge itself. Each judged from the real
process tree under a real ninja (the compilers' ancestors), never from pp4's own records."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest
from test_build import ninja_bin
from test_faults import certify, configure, env_with, ninja, objects_of, processes_in, wait_for

# Each unit makes g++ evaluate a constexpr loop: a few seconds of real compiling, the same every time.
UNIT = """constexpr unsigned long spin(unsigned long n) {
  unsigned long x = 0;
  for (unsigned long i = 0; i < n; ++i) x = x * 6364136223846793005ul + i;
  return x;
}
unsigned long %s() { constexpr unsigned long v = spin(SPIN); return v; }
"""
NAMES = ("one", "two", "three")
COMPILERS = ("cc1plus", "c++", "g++")


def spec(where: Path, spin: int) -> Path:
    (where / "src").mkdir(parents=True)
    for name in NAMES:
        (where / "src" / f"{name}.cpp").write_text(UNIT % name)
    flags = ["-O0", "-fconstexpr-loop-limit=2147483647", "-fconstexpr-ops-limit=4294967295", f"-DSPIN={spin}"]
    path = where / "ext.toml"
    path.write_text(f'name = "served"\nsources = {[f"src/{n}.cpp" for n in NAMES]}\n'.replace("'", '"')
                    + f"cxx_flags = {flags}\n".replace("'", '"'))
    return path


def ancestors(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of pid and each process above it."""
    chain = []
    while pid >= 1:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        chain.append((pid, cmdline))
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
    return chain


def unit_compilers(work: Path) -> list[int]:
    """The compilers of the fixture's units running for work (not the toolchain's probes)."""
    return [pid for pid, argv in processes_in(work)
            if argv and Path(argv[0]).name in COMPILERS and any(a.endswith(f"/{n}.cpp") for a in argv for n in NAMES)]


def server_of(pid: int) -> tuple[int, int] | None:
    """(worker, server) of a process run by a compile server's worker, or None."""
    # A worker is a fork of its server, and the compile's launcher a fork of the worker: all show
    # the server's command line; the server is the topmost.
    served = [p for p, cmd in ancestors(pid) if "-m pp4.reuse.server " in cmd]
    return (served[-2], served[-1]) if len(served) >= 2 else None


def served_compiler(work: Path) -> tuple[int, int, int] | None:
    """(compiler, worker, server) pids of a compile of work run by a server's worker, or None."""
    for pid in unit_compilers(work):
        found = server_of(pid)
        if found:
            return pid, *found
    return None


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    return True


def start_ninja(work: Path, *args: str, **env) -> subprocess.Popen:
    return subprocess.Popen([ninja_bin(), *args], cwd=work, env=env_with(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.fixture
def reference(tmp_path, toolchain) -> dict[str, bytes]:
    """The objects of a build in which every edge runs itself (PP4_NO_SERVER=1: none is served)."""
    work = tmp_path / "reference"
    configure(work, spec(tmp_path / "ref-src", 300_000), "--no-reuse", "-j", "1")
    proc = start_ninja(work, PP4_NO_SERVER="1")
    compiles, served = set(), set()
    while proc.poll() is None:
        compiles.update(unit_compilers(work))
        served.update([found[0]] if (found := served_compiler(work)) else [])
    assert proc.returncode == 0, proc.communicate()[0]
    assert compiles and not served, (compiles, served)
    return {n: p.read_bytes() for n, p in objects_of(work).items()}


def test_every_compile_runs_in_one_servers_workers_with_the_same_objects(tmp_path, reference):
    """The prepass starts the run's server before any compile edge: all of them are served."""
    work = tmp_path / "work"
    configure(work, spec(tmp_path / "src", 300_000), "--store", str(tmp_path / "store"), "-j", "1")
    proc = start_ninja(work)
    served_units, servers, unserved = set(), set(), {}
    while proc.poll() is None:
        for pid in unit_compilers(work):
            chain = ancestors(pid)
            if not chain:
                continue
            found = server_of(pid)
            if found:
                served_units.update(n for n in NAMES if f"/{n}.cpp" in chain[0][1])
                servers.add(found[1])
            elif any(" -m pp4.reuse " in cmd and "--prepass" not in cmd for _, cmd in chain):
                unserved.setdefault(pid, [cmd[:100] for _, cmd in chain[:5]])  # an edge that ran itself
    out = proc.communicate()[0]
    assert proc.returncode == 0, out
    assert not unserved, f"{len(unserved)} compiler processes of edges that ran themselves: {next(iter(unserved.values()))}"
    assert served_units == set(NAMES), f"units seen compiling in a server's worker: {served_units}"
    assert len(servers) == 1, f"not one server for the run: {servers}"
    wait_for(lambda: gone(next(iter(servers))), 20, "the server to end with its ninja run")
    assert {n: p.read_bytes() for n, p in objects_of(work).items()} == reference
    certify(work)


@pytest.mark.parametrize("how", ["ctrl-c", "client-killed", "server-killed"])
def test_a_served_compile_ends_with_its_edge(tmp_path, toolchain, how):
    """Ctrl-C (ninja passes SIGINT to each edge's group), a SIGKILL of the edge's group, or of the
    server: the worker and its compiler end at once, ninja fails, and the next build is whole."""
    work = tmp_path / "work"
    configure(work, spec(tmp_path / "src", 40_000_000), "--store", str(tmp_path / "store"), "-j", "1")
    proc = start_ninja(work)
    try:
        compiler, worker, server = wait_for(lambda: served_compiler(work), 240, "a compile run by the server")
        if how == "ctrl-c":
            os.kill(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does to ninja
        elif how == "client-killed":
            pgid = next(os.getpgid(pid) for pid, argv in processes_in(work)
                        if any(a.endswith("pp4/reuse/client.py") for a in argv))
            os.killpg(pgid, signal.SIGKILL)
        else:
            os.kill(server, signal.SIGKILL)
        wait_for(lambda: gone(compiler) and gone(worker), 20, "the worker and its compiler to end")
        if how != "ctrl-c":
            os.kill(proc.pid, signal.SIGINT)  # ninja may have started the next edge meanwhile
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0, out
    if how == "ctrl-c":
        assert "interrupted" in out, out
    if how == "server-killed":
        assert "the build's compile server ended while it ran this edge" in out, out
    configure(work, spec(tmp_path / "src2", 300_000), "--store", str(tmp_path / "store"), "-j", "2")
    again = ninja(work)
    assert "FAILED" not in again.stdout
    certify(work)
