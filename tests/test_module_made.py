"""A built output is what its link or compile made (issue 63, items 1 and 5), judged from outside.

Real builds of a one-unit C++ spec (g++, no nvcc) with a real store. Oracles independent of the
code under test: the bytes a fresh `--no-reuse` build links and compiles in another folder (a
module and an object built in the fixed root are the same bytes in any folder), the sha256 of the
files as sha256sum would give it, and the exit status and words of `ninja`, `ninja certify`, the
pin command and the loader.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_build import ninja_bin

FIXTURE = REPO / "tests" / "fixtures" / "debuginfo"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ninja(work: Path, *targets: str, ok: bool = True) -> str:
    proc = subprocess.run([ninja_bin(), *targets], cwd=work, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert (proc.returncode == 0) == ok, f"ninja {' '.join(targets)}: rc {proc.returncode}\n{out}"
    return out


def configure(work: Path, *reuse: str) -> None:
    shutil.copytree(FIXTURE, work / "src")
    proc = subprocess.run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", "src/plain.toml",
                           *reuse], cwd=work, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def write_into(path: Path, offset: int = 100) -> None:
    """One byte written in place, as `printf x | dd of=PATH conv=notrunc seek=100` does: the file
    keeps its inode and its folder's time; only its own mtime moves."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"x")


def replace_keeping_time(path: Path, offset: int = 100) -> None:
    """A changed copy renamed over the file, its mtime set back to the file's (`cp -p`, rsync, a
    tool that keeps times): ninja's times, its deps log's included, say nothing changed."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(bytes(data))
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def built(tmp_path_factory, toolchain):
    """(work folder, module, object, fresh module's sha256, fresh object's sha256)."""
    base = tmp_path_factory.mktemp("made")
    fresh, work = base / "fresh", base / "work"
    configure(fresh, "--no-reuse")
    ninja(fresh)
    configure(work, "--store", str(base / "store"))
    ninja(work)
    ninja(work)  # the check after a build, once
    module = next((work / "build" / "pp4_debuginfo").glob("*.so"))
    obj = work / "build" / "pp4_debuginfo" / "obj" / "unit.cpp.o"
    fresh_module = fresh / "build" / "pp4_debuginfo" / module.name
    fresh_obj = fresh / "build" / "pp4_debuginfo" / "obj" / "unit.cpp.o"
    assert sha(module) == sha(fresh_module) and sha(obj) == sha(fresh_obj)
    return work, module, obj, sha(fresh_module), sha(fresh_obj)


def pinned(module: Path) -> str:
    return json.loads(module.with_name(module.name + ".pin.json").read_text())["sha256"]


@pytest.mark.parametrize("change", ["one byte", "strip", "replaced, old time"])
def test_a_module_changed_after_its_link_is_relinked_never_pinned_again(built, change):
    work, module, _, linked, _ = built
    if change == "one byte":
        subprocess.run(f"printf x | dd of='{module}' conv=notrunc seek=100 status=none", shell=True, check=True)
    elif change == "strip":
        subprocess.run(["strip", "--strip-debug", str(module)], check=True)
    else:
        replace_keeping_time(module)
    assert sha(module) != linked
    out = ninja(work)
    assert "no longer match what made them" in out and module.name in out, out
    assert sha(module) == pinned(module) == linked, out
    assert "no work to do" in ninja(work)
    assert "audit passed" in ninja(work, "certify")


def test_an_object_replaced_with_its_old_time_is_restored_or_compiled_again(built):
    """(An object written in place is compiled again by ninja itself: its deps log keeps the
    object's time.)"""
    work, module, obj, linked, compiled = built
    replace_keeping_time(obj)
    out = ninja(work)
    assert "unit.cpp.o" in out and "no longer match what made them" in out, out
    assert sha(obj) == compiled and sha(module) == pinned(module) == linked, out


def test_a_pin_written_by_hand_is_written_again(built):
    work, module, _, linked, _ = built
    pin_file = module.with_name(module.name + ".pin.json")
    pin_file.write_text(json.dumps({**json.loads(pin_file.read_text()), "sha256": "0" * 64}))
    ninja(work)
    assert pinned(module) == linked


def test_a_module_and_its_pin_changed_together_are_refused_everywhere(built):
    """Someone writes the module and a pin that matches it: the pin command, the loader, the wheel
    of what is built and `ninja certify` (none of which builds) all refuse it, naming the module;
    the next `ninja` links it again."""
    from pp4.certify import loader, pin

    work, module, _, linked, _ = built
    pin_file = module.with_name(module.name + ".pin.json")
    write_into(module)
    changed = sha(module)
    refused = subprocess.run([sys.executable, "-m", "pp4.certify.pin", "write", "--plan",
                              str(work / "build" / "pp4_debuginfo" / "plan.json"), "--module", str(module),
                              "--out", str(pin_file)], cwd=work, capture_output=True, text=True)
    assert refused.returncode == 1 and str(module) in refused.stderr, refused.stderr
    assert "run ninja: it relinks or restores it" in refused.stderr
    assert pinned(module) == linked, "a refused pin is not written"
    pin_file.write_text(json.dumps({**json.loads(pin_file.read_text()), "sha256": changed}))
    with pytest.raises(pin.PinError, match="its link made " + linked):
        loader.load(module)  # refused before anything is imported
    out = ninja(work, "certify", ok=False)
    assert module.name in out and "AUDIT FAILED" in out and "audit passed" not in out, out
    out = ninja(work, "wheel-built", ok=False)
    assert module.name in out and "its link made" in out, out
    assert sha(module) == changed, "ninja certify and wheel-built build nothing"
    ninja(work)
    assert sha(module) == pinned(module) == linked


def test_an_evicted_entry_is_a_note_and_a_changed_object_still_fails(built):
    work, module, obj, _, _ = built
    store = work.parent / "store"
    ninja(work)
    assert "audit passed" in ninja(work, "certify")
    subprocess.run([sys.executable, "-m", "pp4.store", "--store", str(store), "gc", "--max-bytes", "0"],
                   check=True, capture_output=True)
    out = ninja(work, "certify")
    assert "audit passed" in out and "note: " in out and "no longer in the store" in out, out
    write_into(obj)
    out = ninja(work, "certify", ok=False)
    assert "AUDIT FAILED" in out and str(obj.relative_to(work)) in out, out
    ninja(work)  # compiled again (its entry is gone): the audit passes again
    assert "audit passed" in ninja(work, "certify")


def test_a_certificate_rewritten_after_the_build_is_written_again(built):
    """A certificate written over with something else (valid gzip, valid JSON, one object's sha256
    changed): `ninja certify` fails on it, the next `ninja` writes it again. (Written in place: one
    renamed into the build folder with its old time is not seen by `ninja`, which does not watch the
    build folder, where it keeps its own files; the audit still fails on it.)"""
    import gzip

    work = built[0]
    ninja(work)
    cert = work / "build" / "certificate.json.gz"
    doc = json.loads(gzip.decompress(cert.read_bytes()))
    doc["objects"][0]["object_sha256"] = "0" * 64
    cert.write_bytes(gzip.compress(json.dumps(doc).encode()))
    out = ninja(work, "certify", ok=False)
    assert "AUDIT FAILED" in out and "certificate" in out, out
    out = ninja(work)
    assert "certificate.json.gz" in out and "no longer match what made them" in out, out
    assert json.loads(gzip.decompress(cert.read_bytes()))["objects"][0]["object_sha256"] != "0" * 64
    assert "audit passed" in ninja(work, "certify")
