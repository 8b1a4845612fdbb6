"""Soundness of the reuse rule, with real compiles and a real store: each case asserts a recompile
where one is due and a reuse where it is safe."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_build import FIXTURE, ninja_bin, run

from pp4.certify import audit

pytestmark = pytest.mark.slow


class Tree:
    """A scratch copy of the fixture sources, a store, and any number of build directories."""

    def __init__(self, base: Path):
        self.base = base
        self.src = base / "src"
        shutil.copytree(FIXTURE, self.src)
        self.store = base / "store"
        self.n = 0

    def build(self, *extra: str, spec: Path | None = None, env=None) -> dict[str, str]:
        """Configure a fresh build directory and build it; returns output -> compiled|reused."""
        self.n += 1
        work = self.base / f"work{self.n}"
        work.mkdir()
        run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", str(spec or self.src / "ext.toml"),
             "--store", str(self.store), *extra], work, env)
        run([ninja_bin()], work, env)
        self.work = work
        return statuses(work)


def statuses(work: Path) -> dict[str, str]:
    doc = json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))
    return {Path(o["output"]).name: o["status"] for o in doc["objects"]}


ALL_REUSED = {"ops.cpp.o": "reused", "scale.cu.o": "reused", "shift.cu.o": "reused"}


@pytest.fixture(scope="module")
def tree(tmp_path_factory, toolchain):
    t = Tree(tmp_path_factory.mktemp("reuse"))
    assert set(t.build().values()) == {"compiled"}
    assert t.build() == ALL_REUSED  # a fresh build directory restores everything
    return t


def test_noop_and_audit_after_a_restore(tree):
    out = run([ninja_bin()], tree.work).stdout
    assert "ninja: no work to do." in out
    res = run([ninja_bin(), "certify"], tree.work).stdout
    assert "3 objects: 3 reused, 0 compiled, 0 failed" in res and "audit passed" in res


def test_edited_project_header(tree):
    header = tree.src / "include" / "fixture" / "common.h"
    original = header.read_text()
    header.write_text(original.replace("kShift = 3", "kShift = 11"))
    try:
        assert tree.build() == {"ops.cpp.o": "compiled", "scale.cu.o": "reused", "shift.cu.o": "compiled"}
    finally:
        header.write_text(original)
    assert tree.build() == ALL_REUSED  # back to the old bytes: the old objects are valid again


def private_torch(base: Path) -> Path:
    """A folder to put first on PYTHONPATH holding a torch package of its own: every entry of the
    installed torch linked, except include/, a tree of links to each header, so that one header can
    be replaced there. Tests run two at a time: an edit of the installed torch's headers would
    change what every other test's compiles read."""
    import torch

    real = Path(torch.__file__).parent
    (base / "torch").mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name != "include":
            (base / "torch" / entry.name).symlink_to(entry)
    run(["cp", "-rs", str(real / "include"), str(base / "torch" / "include")], base)
    return base


def test_edited_torch_header(tree):
    """A header under torch/include (pybind11's, which ops.cpp includes): edited, then restored."""
    site = private_torch(tree.base / "torch-site")
    header = site / "torch" / "include" / "pybind11" / "options.h"
    original = header.read_bytes()
    header.unlink()  # the link to the installed header goes; a file of its own takes its place
    header.write_bytes(original + b"\n// edited by pp4's reuse test\n")
    assert tree.build(env=dict(os.environ, PYTHONPATH=str(site))) == \
        {"ops.cpp.o": "compiled", "scale.cu.o": "reused", "shift.cu.o": "reused"}
    header.write_bytes(original)
    # The certificate holds the edited header's hash in an observation set: the audit, which checks
    # each set once, must name it now that the bytes are back.
    proc = run([sys.executable, "-m", "pp4.certify.audit", "build/certificate.json.gz"], tree.work,
               dict(os.environ, PYTHONPATH=str(REPO)), check=False)
    assert proc.returncode == 1 and f"changed since it was built: {header}: sha256" in proc.stderr, proc.stderr


def test_host_only_edit_under_ifndef_cuda_arch(tree):
    """nvcc -E runs with __CUDA_ARCH__ defined for the device pass, so a cache keyed on preprocessed
    device code misses this edit; raw input bytes do not."""
    src = tree.src / "src" / "scale.cu"
    original = src.read_text()
    src.write_text(original.replace("int scale_host(int x) { return x * kScale; }",
                                    "#ifndef __CUDA_ARCH__\nint scale_host(int x) { return x * kScale + 1; }\n#endif"))
    try:
        assert tree.build() == {"ops.cpp.o": "reused", "scale.cu.o": "compiled", "shift.cu.o": "reused"}
    finally:
        src.write_text(original)


def test_new_header_shadowing_an_old_one(tree):
    """fixture/common.h appears next to shift.cu: `#include "fixture/common.h"` would now find it
    first, even with identical bytes, so no object that included the old one may be reused."""
    shadow = tree.src / "src" / "fixture" / "common.h"
    shadow.parent.mkdir()
    shutil.copy(tree.src / "include" / "fixture" / "common.h", shadow)
    try:
        got = tree.build()
        assert got["shift.cu.o"] == "compiled" and got["scale.cu.o"] == "reused"
    finally:
        shutil.rmtree(shadow.parent)
    assert tree.build() == ALL_REUSED


def test_changed_flag(tree, tmp_path):
    spec = tree.src / "ext-O1.toml"
    spec.write_text((tree.src / "ext.toml").read_text().replace('cuda_flags = ["-O2"]', 'cuda_flags = ["-O1"]'))
    try:
        assert tree.build(spec=spec) == {"ops.cpp.o": "reused", "scale.cu.o": "compiled", "shift.cu.o": "compiled"}
    finally:
        spec.unlink()


def test_other_module_name_shares_only_what_is_proven(tree):
    """A -D value is keyed as written (a macro can carry the module name anywhere); another module
    name shares a unit only where the compilers prove the name cannot reach it (docs/reuse.md): the
    two CUDA units, never the unit that defines the module. Each shared object is the object a real
    compile under the new name gives."""
    spec = tree.src / "ext-renamed.toml"
    spec.write_text((tree.src / "ext.toml").read_text().replace('name = "pp4_fixture"', 'name = "pp4_fixture_b"'))
    try:
        assert tree.build(spec=spec) == {"ops.cpp.o": "compiled", "scale.cu.o": "reused", "shift.cu.o": "reused"}
        objects = Path("build") / "pp4_fixture_b" / "obj" / "src"
        shared = {u: (tree.work / objects / u).read_bytes() for u in ("scale.cu.o", "shift.cu.o")}
        assert tree.build(spec=spec) == ALL_REUSED
        assert tree.build("--no-reuse", spec=spec) == {u: "compiled" for u in ALL_REUSED}
        assert {u: (tree.work / objects / u).read_bytes() for u in shared} == shared
    finally:
        spec.unlink()


def test_different_nvcc(tree, toolchain):
    """An nvcc whose files differ (here nvcc.profile, by one comment line) shares no CUDA unit. The
    C++ unit runs no nvcc: it reads the toolkit's headers, the same bytes at another path, mounted
    at /pp4/toolchain in the fixed root, so it is shared, and is the object a compile there gives."""
    other = tree.base / "other-cuda"
    # A copy, not hard links: a link changes the ctime of the shared toolchain's files, which makes any
    # compile running meanwhile (another test worker's) unstorable ("changed while it was compiled").
    shutil.copytree(toolchain.prefix, other, symlinks=True)
    profile = other / "bin" / "nvcc.profile"
    text = profile.read_text()
    profile.unlink()
    profile.write_text(text + "# a different toolkit\n")
    try:
        assert tree.build("--cuda-home", str(other)) == {
            "ops.cpp.o": "reused", "scale.cu.o": "compiled", "shift.cu.o": "compiled"}
        ops = Path("build") / "pp4_fixture" / "obj" / "src" / "ops.cpp.o"
        reused = (tree.work / ops).read_bytes()
        assert tree.build("--cuda-home", str(other), "--no-reuse")["ops.cpp.o"] == "compiled"
        assert (tree.work / ops).read_bytes() == reused
    finally:
        shutil.rmtree(other)


def test_corrupted_stored_object_is_never_used(tree):
    from pp4.store.local import Store

    assert tree.build() == ALL_REUSED
    doc = json.loads(gzip.decompress((tree.work / "build" / "certificate.json.gz").read_bytes()))
    scale = next(o for o in doc["objects"] if o["output"].endswith("scale.cu.o"))
    obj = Store(tree.store).object_path(scale["object_sha256"])
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0x40
    os.chmod(obj, 0o644)
    obj.write_bytes(bytes(data))
    got = tree.build()
    assert got["scale.cu.o"] == "compiled" and got["shift.cu.o"] == "reused"
    res = run([ninja_bin(), "certify"], tree.work).stdout
    assert "audit passed" in res


def test_audit_detects_a_changed_object_and_input(tree):
    """The audit itself (ninja certify would first rebuild what changed, as it should)."""
    tree.build()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    audit_cmd = [sys.executable, "-m", "pp4.certify.audit", "build/certificate.json.gz"]
    obj = tree.work / "build" / "pp4_fixture" / "obj" / "src" / "shift.cu.o"
    saved = obj.read_bytes()
    obj.write_bytes(saved + b"x")
    try:
        proc = run(audit_cmd, tree.work, env, check=False)
        assert proc.returncode == 1
        assert "shift.cu.o: object sha256 is" in proc.stderr and "AUDIT FAILED" in proc.stderr
    finally:
        obj.write_bytes(saved)
    header = tree.src / "include" / "fixture" / "scale.cuh"
    original = header.read_text()
    header.write_text(original + "// edited after the build\n")
    try:
        proc = run(audit_cmd, tree.work, env, check=False)
        assert proc.returncode == 1
        assert f"changed since it was built: {header}: sha256" in proc.stderr
    finally:
        header.write_text(original)
    assert "audit passed" in run(audit_cmd, tree.work, env).stdout


def test_recompile_audit_finds_the_same_bytes(tree):
    """Compiled again in the fixed root, a reused object is the stored one byte for byte: nothing
    is masked (nvcc's temporary files carry the same process id in every run of the root)."""
    tree.build()
    proc = run([sys.executable, "-m", "pp4.certify.audit", "build/certificate.json.gz", "--recompile", "2"],
               tree.work, dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.stdout.count("identical, byte for byte") == 2, proc.stdout
    assert "audit passed" in proc.stdout


def test_differing_bytes_masks_nothing():
    a = b"\x00abc tmpxft_00002a91_00000000-6_shift.cudafe1.cpp xyz"
    b = b"\x00abc tmpxft_00002aa6_00000000-6_shift.cudafe1.cpp xyz"
    assert audit.differing_bytes(a, a) == []
    assert audit.differing_bytes(a, b) == [18, 19]
    assert audit.differing_bytes(a, a + b"x") == [len(a)]
