"""configure where it would replace another build, or cannot write (issue 55): a second configure in
one folder with another --builddir, a build.ninja that is not pp4's, a read-only build folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO
from test_build import FIXTURE, run
from test_faults import needs_tmpfs, tmpfs

SPEC = str(FIXTURE / "ext.toml")


def configure(work: Path, *args: str, check=True):
    return run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", SPEC, "--no-reuse", *args],
               work, {**os.environ, "PYTHONPATH": str(REPO)}, check=check)


def ninja_var(work: Path, name: str) -> str:
    """A top-level variable of build.ninja, its wrapped lines joined (as ninja reads it)."""
    text = re.sub(r" \$\n +", " ", (work / "build.ninja").read_text())
    return next(ln.split(" = ", 1)[1] for ln in text.splitlines() if ln.startswith(f"{name} = "))


def test_a_configure_with_another_builddir_refuses_to_replace_the_first_and_says_how_to_keep_both(tmp_path, toolchain):
    work = tmp_path / "work"
    work.mkdir()
    configure(work, "--builddir", "b1")
    first = (work / "build.ninja").read_bytes()

    refused = configure(work, "--builddir", "b2", check=False)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"configure.py: error: {work / 'build.ninja'} is the build of another configuration, --builddir b1 "
        f"(configured with: --arch 9.0 --ext-spec {SPEC} --no-reuse --builddir b1); writing this one's "
        "(--builddir b2) would replace it, and ninja here would build this one only. To keep both, run configure "
        "in another folder (build.ninja goes in the current folder, objects under --builddir): mkdir ../other && "
        f"cd ../other && python {REPO / 'configure.py'} ... --builddir DIR. To replace it, pass --replace (its "
        "build folder stays on disk)"), refused.stderr
    assert (work / "build.ninja").read_bytes() == first and not (work / "b2").exists()

    # The same builddir again (what ninja's own re-run does) is no replacement.
    assert configure(work, "--builddir", "b1").returncode == 0

    # Keeping both, as the message says: another folder, its own build.ninja.
    other = tmp_path / "other"
    other.mkdir()
    configure(other, "--builddir", str(work / "b2"))
    assert ninja_var(other, "config") == str(work / "b2" / "pp4.json")
    assert (work / "build.ninja").read_bytes() == first

    # Replacing, when asked: said, the old build folder left, --replace not kept for ninja's re-runs.
    replaced = configure(work, "--builddir", "b2", "--replace")
    assert "configure: notice: --replace: " in replaced.stdout
    assert ninja_var(work, "config") == str(work / "b2" / "pp4.json")
    assert "--replace" not in ninja_var(work, "configure_args")
    assert (work / "b1" / "pp4.json").is_file()


def test_a_build_ninja_that_is_not_pp4s_is_not_written_over(tmp_path, toolchain):
    (tmp_path / "build.ninja").write_text("# cmake's\nrule cc\n  command = cc $in\n")
    refused = configure(tmp_path, check=False)
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"configure.py: error: {tmp_path / 'build.ninja'} was not written by pp4's "
                                     "configure.py"), refused.stderr
    assert (tmp_path / "build.ninja").read_text().startswith("# cmake's")


@needs_tmpfs
def test_a_read_only_build_folder_at_configure_is_one_clear_error(tmp_path, toolchain):
    with tmpfs(tmp_path / "ro", "1m") as ro:
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        work = tmp_path / "work"
        work.mkdir()
        out = configure(work, "--builddir", str(ro / "build"), check=False)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.strip() == (
            f"configure.py: error: {ro} is on a read-only filesystem ({ro}, statvfs); remount it read-write, or "
            "configure a build folder you can write (--builddir), then run configure.py again"), out.stderr
        assert not (work / "build.ninja").exists()
        # The folder build.ninja goes in, read-only: the same, for that folder.
        out = configure(ro, check=False)
        assert out.returncode == 2 and out.stderr.startswith(f"configure.py: error: {ro} is on a read-only "), out.stderr
