"""The loader's cache keyed by what it resolves: caches made by the real ldconfig in a scratch root
(ldconfig -r), and a real compile's observation of /etc/ld.so.cache. The oracle is ldconfig's own
cache and what each case changes in it, not pp4's reader."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time

import pytest

from pp4.execution.run import run
from pp4.reuse import loadercache, observations, pathstates
from pp4.reuse.actionkey import FileHasher
from pp4.toolchain.limits import Limits

pytestmark = pytest.mark.skipif(loadercache.ldconfig() is None or shutil.which("gcc") is None,
                                reason="needs ldconfig and gcc")


def library(folder, soname, body="int f(void){return 1;}"):
    """A real shared library with that soname, in folder, with the soname link ldconfig makes."""
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / (soname + ".c")
    src.write_text(body + "\n")
    real = folder / (soname + ".0")
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(real), str(src)], check=True)
    src.unlink()
    return real


def make_cache(root):
    subprocess.run([loadercache.ldconfig(), "-r", str(root)], check=True, capture_output=True)
    return root / "etc" / "ld.so.cache"


@pytest.fixture
def scratch_root(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "ld.so.conf").write_text("/opt/first\n")
    library(root / "usr" / "lib", "libpp4a.so.1")
    return root


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_unrelated_library_changes_the_bytes_but_not_the_state(scratch_root):
    cache = make_cache(scratch_root)
    before, before_bytes = loadercache.state(str(cache), ["libpp4a.so.1", "libnone.so.3"]), digest(cache)
    assert before is not None and before.startswith("ld:")
    library(scratch_root / "usr" / "lib", "libunrelated.so.2")
    cache = make_cache(scratch_root)
    assert digest(cache) != before_bytes, "ldconfig rewrote the cache"
    assert loadercache.state(str(cache), ["libpp4a.so.1", "libnone.so.3"]) == before


def test_a_name_that_resolves_elsewhere_or_appears_changes_the_state(scratch_root):
    names = ["libpp4a.so.1", "libnone.so.3"]
    before = loadercache.state(str(make_cache(scratch_root)), names)
    library(scratch_root / "opt" / "first", "libpp4a.so.1")  # a folder ld.so.conf names: searched first
    moved = loadercache.state(str(make_cache(scratch_root)), names)
    assert moved != before
    library(scratch_root / "opt" / "first", "libnone.so.3")  # a name looked up and not found before
    assert loadercache.state(str(make_cache(scratch_root)), names) != moved


def test_the_names_are_what_was_opened_or_looked_for_and_what_resolves_to_it(scratch_root):
    cache = make_cache(scratch_root)
    table = loadercache.entries(str(cache))
    assert any(e.endswith("=> /usr/lib/libpp4a.so.1") for e in table["libpp4a.so.1"])
    # a library looked for and absent, one opened by its path, and a file that is no library
    seen = {"/lib/x86_64-linux-gnu/libgone.so.7", "/usr/lib/libpp4a.so.1", "/usr/include/stdio.h"}
    assert loadercache.names_for(seen, table) == ["libgone.so.7", "libpp4a.so.1"]
    # a cache name whose path was observed counts even when its file is named otherwise
    assert "libpp4a.so.1" in loadercache.names_for({"/usr/lib/libpp4a.so.1"}, {"libpp4a.so.1": table["libpp4a.so.1"]})
    odd = {"weird,name.so": ("libc6,x86-64 => /usr/lib/weird,name.so",)}
    assert loadercache.names_for({"/usr/lib/weird,name.so"}, odd) == ["weird,name.so"]
    assert loadercache.state(str(cache), ["weird,name.so"]) is None, "a name the state cannot hold: keyed by bytes"


def test_a_compile_keys_the_system_cache_by_its_resolutions(tmp_path):
    src = tmp_path / "a.c"
    src.write_text("int a(void) { return 2; }\n")
    time.sleep(2 * observations.CTIME_MARGIN_S)  # written well before the compile starts
    out = tmp_path / "a.o"
    ran = run(["gcc", "-c", str(src), "-o", str(out)], {"PATH": "/usr/bin:/bin"}, Limits(), tmp_path / "runs", None)
    if ran.trace is None:
        pytest.skip(ran.trace_problem)
    pairs, problem = observations.from_run(ran, {str(out)}, pathstates.States(FileHasher()))
    assert problem is None
    (state,) = [s for p, s in pairs if p == loadercache.CACHE]
    assert state.startswith("ld:"), state
    assert "libc.so.6" in loadercache.names_in(state)
    states = pathstates.States(FileHasher())
    assert pathstates.holds(pairs, lambda p: p, states)
    assert pathstates.differences([[loadercache.CACHE, state[:-1] + "X"]], lambda p: p, states)[0].startswith(
        "/etc/ld.so.cache: the loader's cache resolving")
