"""A module restored from the store instead of linked, judged against a real link.

Oracles independent of the code under test: the restored module's bytes and mode are compared
with a module a `--no-reuse` build links in a third folder; a changed input (another object) is
judged by whether the build ran the linker (its LINK line and the link record's own word), and
the module's bytes again against a real link of the changed sources.
"""

from __future__ import annotations

import gzip
import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_build import ninja_bin

FIXTURE = REPO / "tests" / "fixtures" / "debuginfo"


def build(work: Path, store: Path | None, src: Path = FIXTURE) -> tuple[dict, Path, str]:
    """Configure and build the fixture's module in work: its certificate entry, the module, the output."""
    if not (work / "src").exists():
        shutil.copytree(src, work / "src")
    out = ""
    reuse = ["--store", str(store)] if store else ["--no-reuse"]
    for cmd in ([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", "src/plain.toml", *reuse],
                [ninja_bin()]):
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=300)
        out += proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{cmd} failed:\n{out}"
    (module,) = json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))["modules"]
    return module, work / module["file"], out


@pytest.mark.slow
def test_a_module_is_restored_where_its_link_would_give_the_same_bytes(tmp_path, toolchain):
    store = tmp_path / "store"
    first, first_module, _ = build(tmp_path / "a", store)
    assert first["link_reuse"] and first["link_reuse"]["action_key"] and "tier" not in first["link_reuse"]

    second, module, out = build(tmp_path / "b", store)
    assert second["link_reuse"]["tier"] == "local" and second["link_reuse"]["signers"], out
    # every object restored in this run: the prepass restored the module, pinned and certified it,
    # and the later edges only said so (what ninja ran: its log's command hashes are of the full
    # commands either way, so the judge is that no process of those edges' Python ran: no marker left)
    assert out.splitlines()[-1].startswith("pp4: this build restored everything before its edges ran: "), out
    assert not list((tmp_path / "b" / "build").rglob("*.pp4-ahead")), "every claim is taken by its edge"
    assert second["link_reuse"]["action_key"] == first["link_reuse"]["action_key"]
    real, real_module, _ = build(tmp_path / "c", None)
    assert real["link_reuse"] is None
    assert module.read_bytes() == real_module.read_bytes() == first_module.read_bytes()
    assert stat.S_IMODE(module.stat().st_mode) == stat.S_IMODE(real_module.stat().st_mode)
    assert second["link_inputs"] == first["link_inputs"], "the restored module's record is what its link observed"
    audit = subprocess.run([ninja_bin(), "certify"], cwd=tmp_path / "b", capture_output=True, text=True)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    # Its dependency file names what the link read, so a changed library or object relinks it.
    deps = (module.parent / (module.name + ".d")).read_text()
    assert "unit.cpp.o" in deps

    # A claim left by another ninja run (one asked for less, or killed) is not taken on trust: the
    # edges run in full, and what the claim says is never said.
    pin_file = module.with_name(module.name + ".pin.json")
    module_bytes = module.read_bytes()
    for made in (module, pin_file):
        made.unlink()
        made.with_name(made.name + ".pp4-ahead").write_text("1\nFORGED CLAIM\n")
    proc = subprocess.run([ninja_bin()], cwd=tmp_path / "b", capture_output=True, text=True)
    assert proc.returncode == 0 and "FORGED CLAIM" not in proc.stdout, proc.stdout + proc.stderr
    assert module.read_bytes() == module_bytes and json.loads(pin_file.read_text())["file"] == module.name

    # Another object (an edited source): nothing stored holds, the linker runs, and the module is
    # what a real link of the edited source gives.
    edited = tmp_path / "edited"
    shutil.copytree(FIXTURE, edited)
    (edited / "unit.cpp").write_text((FIXTURE / "unit.cpp").read_text() + "\nint pp4_link_edit() { return 5; }\n")
    shutil.rmtree(tmp_path / "b" / "src")
    shutil.copytree(edited, tmp_path / "b" / "src")
    proc = subprocess.run([ninja_bin()], cwd=tmp_path / "b", capture_output=True, text=True)
    assert proc.returncode == 0 and "LINK" in proc.stdout, proc.stdout + proc.stderr
    again = json.loads(gzip.decompress((tmp_path / "b" / "build" / "certificate.json.gz").read_bytes()))["modules"][0]
    assert "tier" not in (again["link_reuse"] or {}), "an edited object must be linked, not restored"
    _, edited_real, _ = build(tmp_path / "d", None, src=edited)
    assert module.read_bytes() == edited_real.read_bytes() != real_module.read_bytes()
