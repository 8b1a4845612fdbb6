"""The audit hashes each file once, even when two paths name it, and still catches every changed
byte. Real files: a small certified build of two variants (real torch headers as shared inputs,
objects of random bytes stored through pp4's Reuser, the certificate and pins written by pp4
itself), no compiler."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest
from conftest import compile_section, store_as_compiled
from pp4.build import config as buildconfig

from pp4.certify import audit
from pp4.execution import depfile
from pp4.build import modules
from pp4.reuse.actionkey import FileHasher


@pytest.fixture(scope="module")
def build(tmp_path_factory, toolchain) -> Path:
    """exl3 and exl3-facc trees with the same two units, each pair of objects the same bytes: the
    certificate names the same bytes at two paths."""
    import torch

    from pp4.certify import certificate, pin
    from pp4.build.config import ReuseConfig
    from pp4.reuse.wrapper import Reuser

    work = tmp_path_factory.mktemp("audit")
    inc = Path(torch.__file__).parent / "include"
    shared = sorted(str(p) for p in (inc / "c10" / "macros").glob("*.h"))
    assert shared, f"no torch headers under {inc}"
    build, state = work / "build", work / "build" / ".pp4"
    roots = {"exl3": work / "exllamav3", "exl3-facc": work / "exllamav3-facc"}
    old = time.time() - 3600  # inputs settled before their compile started
    for root in roots.values():
        (root / "src").mkdir(parents=True)
        for i in range(2):
            unit = root / "src" / f"unit{i}.cu"
            unit.write_text(f"// unit {i}\n")
            os.utime(unit, (old, old))
    config = {"limits": {"address_space": None, "cpus": None, "nice": 0, "nvcc_threads": 1, "tmpdir": str(build / "tmp")},
              "reuse": {"roots": [str(r) for r in roots.values()],
                        "state_dir": str(state), "store": str(work / "store"), "toolchain": {"bin/nvcc": "0" * 64}},
              "compile": compile_section(toolchain)}
    build.mkdir()
    buildconfig.write(build, **config)
    reuser = Reuser(ReuseConfig.load(build / "pp4.json"))
    env = config["compile"]["env"]["cuda"]
    actions = []
    for target, root in roots.items():
        tdir = build / target
        (tdir / "obj").mkdir(parents=True)
        objs = []
        for unit in sorted((root / "src").iterdir()):
            out, dep = tdir / "obj" / f"{unit.name}.o", tdir / "obj" / f"{unit.name}.o.d"
            argv = ["nvcc", "-c", str(unit), "-o", str(out), "-MD", "-MF", str(dep), "-isystem", str(inc), "-O3",
                    f"-DTORCH_EXTENSION_NAME={target.replace('-', '_')}"]
            data = random.Random(unit.name).randbytes(64 * 1024)  # the same bytes in both variants
            stored = store_as_compiled(reuser, argv, env, [str(unit)] + shared, data)
            assert stored["action_key"], stored
            actions.append({"argv": argv, "output": str(out), "target": target, "source": str(unit), "env": env})
            objs.append(out)
        module = tdir / f"pp4_{target.replace('-', '_')}.so"
        module.write_bytes(b"".join(o.read_bytes() for o in objs))
        depfile.write(str(module) + ".d", str(module), [str(o) for o in objs])  # as the link does
        modules.write_link(state, modules.LinkRecord(str(module), ("c++", "-shared"), None,
                                                     sorted([str(o), reuser.states.state(str(o))] for o in objs), None,
                                                     None, *modules.module_made(module)))
        modules.write_plan(build, modules.PlanRecord(
            target=target, module=module.stem, root=str(root),
            sources=[a["source"] for a in actions if a["target"] == target], objects=[str(o) for o in objs],
            output=str(module), output_abs=str(module.absolute()), cuda_flags=["-O3"], cxx_flags=["-O3"],
            link_flags=[], toolchain={"prefix": str(work / "no-toolchain")}))
        pin.write(modules.plan_path(build, target), module, pin.pin_path_for(module))
    (build / "actions.json").write_text(json.dumps({"actions": actions}))
    certificate.write(build / "pp4.json", build / "actions.json", build / "certificate.json.gz")
    return work


def run_audit(work: Path, capsys) -> tuple[int, str]:
    rc = audit.main([str(work / "build" / "certificate.json.gz")])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_two_paths_to_one_object_are_hashed_once_and_a_change_is_caught_for_both(build, capsys):
    stock = build / "build" / "exl3" / "obj" / "unit0.cu.o"
    facc = build / "build" / "exl3-facc" / "obj" / "unit0.cu.o"
    assert stock.read_bytes() == facc.read_bytes()
    rc, out = run_audit(build, capsys)
    assert rc == 0, out
    files_before = int(out.split(" files hashed")[0].rsplit(" ", 1)[1])
    saved = facc.read_bytes()
    facc.unlink()
    os.link(stock, facc)  # one inode, two objects of the certificate
    try:
        rc, out = run_audit(build, capsys)
        assert rc == 0, out
        assert int(out.split(" files hashed")[0].rsplit(" ", 1)[1]) == files_before - 1
        with open(stock, "r+b") as f:  # changed in place, behind the audit's back: both must fail
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 1]))
        rc, out = run_audit(build, capsys)
        assert rc == 1
        assert f"{stock}: object sha256 is" in out and f"{facc}: object sha256 is" in out
    finally:
        facc.unlink()
        stock.unlink()
        stock.write_bytes(saved)
        facc.write_bytes(saved)
    rc, out = run_audit(build, capsys)
    assert rc == 0, out


def test_a_file_written_after_it_was_hashed_is_hashed_again_through_another_path(tmp_path):
    a, b = tmp_path / "a.h", tmp_path / "b.h"
    a.write_bytes(b"one\n")
    os.link(a, b)
    h = FileHasher()
    first = h.sha256(str(a))
    with open(b, "r+b") as f:
        f.write(b"two\n")
    st = os.stat(b)
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # however coarse the clock
    assert h.sha256(str(b)) != first
    assert h.files_hashed() == 2


def test_large_files_hash_as_small_ones_do(tmp_path):
    import hashlib

    from pp4.files import READ_CHUNK, sha256_file
    for size in (0, 1, READ_CHUNK - 1, READ_CHUNK, 3 * READ_CHUNK + 17):
        p = tmp_path / f"f{size}"
        data = os.urandom(size)
        p.write_bytes(data)
        assert sha256_file(p) == hashlib.sha256(data).hexdigest()
        assert FileHasher().sha256(str(p)) == hashlib.sha256(data).hexdigest()
    assert FileHasher().sha256(str(tmp_path)) is None, "a folder is not an input"
    assert json.dumps(FileHasher().sha256(str(tmp_path / "missing"))) == "null"
