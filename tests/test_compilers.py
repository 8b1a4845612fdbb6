"""What a host compiler searches and runs, asked from the compiler itself; a probe that fails (its
cc1plus killed, say) is never used or cached, since a partial search list would let the include
probes skip the built-in folders."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pp4.toolchain.compilers import CompilerError, Identifier, probe_host

# Prints what `g++ -E -v` prints up to the search list, then dies as a killed cc1plus does.
DYING_DRIVER = """#!/bin/sh
echo ' /usr/lib/gcc/x86_64-linux-gnu/12/cc1plus -E -quiet -v /dev/null' >&2
echo '#include <...> search starts here:' >&2
echo 'gcc: fatal error: Killed signal terminated program cc1plus' >&2
exit 1
"""


def env() -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


def test_a_real_driver_names_its_programs_and_folders(tmp_path):
    driver = shutil.which("c++")
    probe = probe_host(driver, env(), tmp_path)
    assert probe["ok"] and os.path.isabs(probe["programs"]["cc1plus"]) and os.path.isabs(probe["programs"]["as"])
    assert any(Path(d, "stdio.h").is_file() for d in probe["include_dirs"])  # libc's folder is among them


def test_a_failed_probe_raises_and_is_not_cached(tmp_path):
    driver = tmp_path / "c++"
    driver.write_text(DYING_DRIVER)
    driver.chmod(0o755)
    with pytest.raises(CompilerError, match=r"-E -v failed \(exit status 1\), so the folders it searches are unknown"):
        probe_host(str(driver), env(), tmp_path)
    ident = Identifier(tmp_path / "compilers.json", tmp_path / "tmp")
    with pytest.raises(CompilerError):
        ident._host(str(driver), env())
    assert ident.probes == {} and not (tmp_path / "compilers.json").exists()


def test_a_failed_probe_an_older_pp4_cached_is_asked_again(tmp_path):
    ident = Identifier(tmp_path / "compilers.json", tmp_path / "tmp")
    driver = shutil.which("c++")
    key = ident._probe_key(env(), driver)
    ident.probes[key] = {"programs": {"cc1plus": None, "as": None}, "include_dirs": [], "ok": False}
    assert ident._host(driver, env())["include_dirs"]  # probed again, not the empty list
    assert ident.probes[key]["ok"]


def test_a_compiler_is_named_in_its_folders_real_path(tmp_path):
    """PATH with a folder that links to another (/bin to /usr/bin on a merged /usr) names the same
    compiler as the folder itself: one command, so builds configured either way share objects. The
    program's own name is kept (a driver acts on the name it was started by)."""
    from pp4.toolchain.compilers import resolve

    real = tmp_path / "usr" / "bin"
    real.mkdir(parents=True)
    (real / "c++").write_text("#!/bin/sh\n")
    (real / "c++").chmod(0o755)
    (tmp_path / "bin").symlink_to(real)
    assert resolve("c++", "the C++ compiler", str(tmp_path / "bin")) == str(real / "c++")
    assert resolve(str(tmp_path / "bin" / "c++"), "the C++ compiler") == str(real / "c++")
