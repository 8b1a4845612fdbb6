"""Edits ninja's file times cannot show, in the same build folder, and two ninja runs at once.

A header or source changed with its old mtime kept or put earlier (`touch -r`, `cp -p`, `tar x`,
which puts its folder's mtime back too), a checkout link pointed elsewhere with its and its folder's
mtimes put back, a library changed so: the next `ninja` in the build folder must build the object
(or link the module) again, and the object must be what a `--no-reuse` compile of the new content
gives, as must the one a fresh folder restores from the store. Each case first lets the check
before ninja decides write its table of identities (pp4/reuse/quickcheck.py), so it is that quick
check, not a first full one, that must notice.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from test_build import ninja_bin, run
from test_hidden_inputs import Case, first_build, objects, same_folder_again, spec, tagged

OLD = 1_000_000_000  # 2001: older than anything a build made


@pytest.fixture
def base(tmp_path, toolchain):
    return tmp_path


def settled(work: Path) -> None:
    """ninja once the build's files are older than the quick check's slack, so that its table is
    written, and the table is there: what follows is judged by the quick check."""
    time.sleep(2.2)
    out = run([ninja_bin()], work).stdout
    assert "no work to do" in out and "no longer match" not in out, out
    assert (work / "build" / ".pp4" / "recheck.stamp.ids").exists()


def rebuilt(case: Case, work: Path, want: str) -> None:
    """The same folder builds again, as a real compile of the new content does; a fresh folder
    restores that object (the one this folder stored), not the stale one."""
    out = same_folder_again(case, work, want)
    assert "no longer match what made them" in out, out
    got, _ = case.build()
    assert got["u.cpp.o"][0] == "reused" and got["u.cpp.o"][1] == want
    assert got["u.cpp.o"][2] == objects(work)["u.cpp.o"][2]
    settled(work)


@pytest.mark.slow
def test_edits_that_keep_or_set_back_mtimes_rebuild_in_the_same_folder(base):
    case = Case(base, {"u.cpp": tagged("VAL", head='#include "cfg.h"\n'), "one/cfg.h": '#define VAL "one"\n',
                       "two/cfg.h": '#define VAL "two"\n', "spare.h": '#define VAL "spare"\n'},
                spec(include_dirs=["inc"]))
    src = case.src
    for path in (src / "one" / "cfg.h", src / "two" / "cfg.h", src / "spare.h", src / "u.cpp"):
        os.utime(path, (OLD, OLD))
    (src / "inc").symlink_to("one")
    os.utime(src / "inc", (OLD, OLD), follow_symlinks=False)
    first_build(case, "one")
    work = base / f"work-src-{case.n}"
    settled(work)
    header = src / "one" / "cfg.h"

    # edited, its mtime put back (touch -r)
    st = header.stat()
    header.write_text('#define VAL "tr"\n')
    os.utime(header, ns=(st.st_atime_ns, st.st_mtime_ns))
    rebuilt(case, work, "tr")

    # edited, its mtime set earlier still
    header.write_text('#define VAL "older"\n')
    os.utime(header, (OLD - 86400, OLD - 86400))
    rebuilt(case, work, "older")

    # another file copied over it with its times (cp -p)
    subprocess.run(["cp", "-p", str(src / "spare.h"), str(header)], check=True)
    rebuilt(case, work, "spare")

    # the source replaced from a tarball whose entries (the folder's too) carry old times (tar x)
    stage = base / "stage" / "src"
    stage.mkdir(parents=True)
    (stage / "u.cpp").write_text(tagged('"tar:" VAL', head='#include "cfg.h"\n'))
    os.utime(stage / "u.cpp", (OLD, OLD))
    subprocess.run(["touch", "-r", str(src), str(stage)], check=True)
    subprocess.run(["tar", "cf", str(base / "src.tar"), "-C", str(stage.parent), "src"], check=True)
    folder = src.stat()
    subprocess.run(["tar", "xf", str(base / "src.tar"), "-C", str(base)], check=True)
    assert src.stat().st_mtime_ns <= folder.st_mtime_ns, "tar put the folder's mtime back (to the second)"
    rebuilt(case, work, "tar:spare")

    # the include folder's link pointed elsewhere, its and the checkout's mtimes put back
    subprocess.run(["ln", "-sfn", "two", str(src / "inc")], check=True)
    subprocess.run(["touch", "-h", "-d", "@%d" % OLD, str(src / "inc")], check=True)
    os.utime(src, ns=(folder.st_atime_ns, folder.st_mtime_ns))
    rebuilt(case, work, "tar:two")


@pytest.mark.slow
def test_a_library_changed_with_its_old_mtime_relinks_the_module(base):
    lib_dir = base / "lib"
    lib_dir.mkdir()
    lib = lib_dir / "libpp4dep.so"

    def make_lib(value: int) -> bytes:
        (base / "dep.c").write_text(f"int pp4_dep(void) {{ return {value}; }}\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(base / "new.so"), str(base / "dep.c")], check=True)
        data = (base / "new.so").read_bytes()
        with open(lib, "r+b" if lib.exists() else "wb") as f:  # in place, as cp -p writes
            f.truncate(0)
            f.write(data)
        os.utime(lib, (OLD, OLD))
        return data

    make_lib(1)
    os.utime(lib_dir, (OLD, OLD))
    case = Case(base, {"u.cpp": 'extern "C" int pp4_dep(void);\nint u() { return pp4_dep(); }\n'},
                spec(extra=f'libraries = ["pp4dep"]\nlibrary_dirs = ["{lib_dir}"]\n'))
    case.build()
    work = base / f"work-{case.src.name}-{case.n}"
    settled(work)
    data = make_lib(2)
    os.utime(lib_dir, (OLD, OLD))
    out = run([ninja_bin()], work).stdout
    assert "LINK" in out and "no longer match" in out, f"the module was not linked again:\n{out}"
    doc = json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))
    (module,) = doc["modules"]
    assert [str(lib), hashlib.sha256(data).hexdigest()] in module["link_inputs"], module["link_inputs"]
    assert run([ninja_bin(), "certify"], work).returncode == 0


@pytest.mark.slow
def test_two_ninja_runs_in_one_build_folder(base):
    """The second ninja stops with one line naming the first, before it builds or records anything:
    every object is compiled once, ninja's deps log keeps every object's dependencies (a header
    edited afterwards rebuilds them all), and the next run has nothing to do."""
    units = [f"u{i}.cpp" for i in range(4)]
    unit = '#include "cfg.h"\nextern "C" const char t%d[] = "TAG[" VAL "]";\n'
    case = Case(base, {**{u: unit % i for i, u in enumerate(units)},
                       "inc/cfg.h": '#define VAL "a"\n'},
                spec(include_dirs=["inc"], sources=units))
    work = base / "work-two"
    work.mkdir()
    run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", str(case.src / "ext.toml"),
         "--no-reuse"], work)
    lock = work / "build" / ".pp4" / "ninja.lock"
    first = subprocess.Popen([ninja_bin()], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not (lock.exists() and lock.read_text().startswith(f"{first.pid}-")):
        assert first.poll() is None and time.monotonic() < deadline, "the first ninja never claimed the folder"
        time.sleep(0.01)
    second = subprocess.run([ninja_bin()], cwd=work, capture_output=True, text=True)
    out1, _ = first.communicate()
    out2 = second.stdout + second.stderr
    assert first.returncode == 0, out1
    assert second.returncode != 0, out2
    said = [line for line in out2.splitlines() if line.startswith("pp4: ")]
    assert len(said) == 1 and f"ninja {first.pid} is already building in {work / 'build'}" in said[0], out2
    compiled = re.findall(r"^\[\d+/\d+\] CXX \S+/(\S+)$", out1 + out2, re.M)
    assert sorted(compiled) == sorted(f"{u}.o" for u in units), out1 + out2
    deps = run([ninja_bin(), "-t", "deps"], work).stdout
    for u in units:
        m = re.search(rf"^\S*/{re.escape(u)}\.o: #deps (\d+)", deps, re.M)
        assert m and int(m.group(1)) > 0, deps
    assert "no work to do" in run([ninja_bin()], work).stdout
    (case.src / "inc" / "cfg.h").write_text('#define VAL "b"\n')  # a new mtime: ninja's deps must show it
    again = run([ninja_bin()], work).stdout
    assert sorted(re.findall(r"^\[\d+/\d+\] CXX \S+/(\S+)$", again, re.M)) == sorted(f"{u}.o" for u in units), again


def test_the_state_folder_names_what_the_quick_check_writes():
    from pp4 import statedir
    from pp4.reuse import quickcheck

    assert quickcheck.LOCK == statedir.NINJA_LOCK
    assert quickcheck.table_path(statedir.RECHECK_STAMP) == statedir.RECHECK_IDS


def test_the_quick_check_sees_an_edit_that_put_its_mtime_back(tmp_path, monkeypatch):
    """The table against real files: an edit of the same size with its times put back, a link
    pointed elsewhere with its mtime put back, and no table where an identity is too recent."""
    from pp4.reuse import quickcheck

    header, link, stamp = tmp_path / "h.h", tmp_path / "inc", tmp_path / "recheck.stamp"
    header.write_text("one\n")
    link.symlink_to("a")
    os.utime(header, (OLD, OLD))
    assert not quickcheck.write_table(stamp, {str(header): True, str(link): False})  # ctimes of now
    assert not quickcheck.holds(stamp)
    monkeypatch.setattr(quickcheck, "SLACK_S", 0.0)
    assert quickcheck.write_table(stamp, {str(header): True, str(link): False})
    assert quickcheck.holds(stamp)
    time.sleep(0.01)
    header.write_text("two\n")
    os.utime(header, (OLD, OLD))
    assert not quickcheck.holds(stamp)
    assert quickcheck.write_table(stamp, {str(header): True, str(link): False})
    time.sleep(0.01)
    link.unlink()
    link.symlink_to("b")
    os.utime(link, (OLD, OLD), follow_symlinks=False)
    assert not quickcheck.holds(stamp)


CLAIMING = """
import subprocess, sys, time
sys.path.insert(0, {repo!r})
from pp4.reuse import quickcheck
if sys.argv[1] == "claim":  # the check, run by a ninja (its parent)
    print(quickcheck.claim({state!r}) or "claimed", flush=True)
else:  # a ninja: what its check says, then (nested) what a ninja one of its edges starts says, then wait
    subprocess.run([sys.executable, __file__, "claim"])
    if sys.argv[1] == "nest":
        subprocess.run([{fake!r}, __file__, "once"])
    if sys.argv[1] != "once":
        print("waiting", flush=True)
        time.sleep(60)
"""


def test_one_ninja_run_at_a_time_holds_the_folder_and_its_own_nested_runs_pass(tmp_path):
    """Real processes named ninja (a link to Python: the kernel names a process by the file it ran):
    the first claims the folder, a ninja it starts passes and leaves the claim as it was, another
    ninja is refused with the first's pid, and once the first has ended the next one claims it."""
    from pp4.reuse import quickcheck

    fake, state = tmp_path / "ninja", tmp_path / "build" / ".pp4"
    fake.symlink_to(sys.executable)
    script = tmp_path / "claiming.py"
    script.write_text(CLAIMING.format(repo=str(REPO), state=str(state), fake=str(fake)))
    first = subprocess.Popen([str(fake), str(script), "nest"], stdout=subprocess.PIPE, text=True)
    try:
        said = [first.stdout.readline().strip() for _ in range(3)]
        assert said == ["claimed", "claimed", "waiting"], said
        held = (state / quickcheck.LOCK).read_text()
        assert held.startswith(f"{first.pid}-"), held
        other = subprocess.run([str(fake), str(script), "once"], capture_output=True, text=True).stdout
        assert f"pp4: ninja {first.pid} is already building in {tmp_path / 'build'}" in other, other
        assert (state / quickcheck.LOCK).read_text() == held
    finally:
        first.kill()
        first.wait()
    after = subprocess.Popen([str(fake), str(script), "once"], stdout=subprocess.PIPE, text=True)
    assert after.communicate()[0].strip() == "claimed"
    assert (state / quickcheck.LOCK).read_text().startswith(f"{after.pid}-")
