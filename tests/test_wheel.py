"""`ninja wheel`: P2P and the fixture built for real, packed as wheels, installed with pip into a
fresh venv that holds torch and what torch needs (pp4 is not importable there), imported and called.
The oracles are pip (install, check, uninstall), zipfile and the modules' own results, not pp4's code."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

FIXTURE = REPO / "tests" / "fixtures" / "multifile"


def ninja_bin() -> str:
    from ninja import BIN_DIR

    return str(Path(BIN_DIR) / "ninja")


# The fresh venv's processes run outside the repository and without PYTHONPATH: pp4 stays unreachable.
OUTSIDE = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def run(cmd, cwd=None, env=None, check=True):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory, toolchain):
    """P2P and the fixture extension built in one scratch tree, and their wheels made."""
    work = tmp_path_factory.mktemp("wheel-build")
    shutil.copytree(FIXTURE, work / "src")
    run([sys.executable, REPO / "configure.py", "--arch", "9.0", "--ext", "p2p", "--ext-spec", "src/ext.toml",
         "--store", work / "store"], work)
    run([ninja_bin()], work)
    out = run([ninja_bin(), "wheel"], work).stdout
    wheels = sorted((work / "dist").glob("*.whl"))
    assert len(wheels) == 2, out
    return work, {w.name.split("-")[0]: w for w in wheels}


def torch_closure() -> set[str]:
    """torch and every distribution its requirements reach here, markers and extras applied."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: dict[str, frozenset] = {}
    pending = [("torch", frozenset())]
    while pending:
        name, extras = pending.pop()
        name = canonicalize_name(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if name in seen and extras <= seen[name]:
            continue
        seen[name] = seen.get(name, frozenset()) | extras
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (extras or {""})):
                continue
            pending.append((req.name, frozenset(req.extras)))
    return set(seen)


@pytest.fixture(scope="module")
def torch_venv(tmp_path_factory) -> Path:
    """A fresh venv whose site-packages holds torch's installed files (linked, not copied: torch
    is 4 GB) and nothing else: no pp4, no attrs, no ninja."""
    root = tmp_path_factory.mktemp("torch-venv") / "venv"
    venv.EnvBuilder(with_pip=True, symlinks=True).create(root)
    py = root / "bin" / "python"
    site = _site(py)
    for name in torch_closure():
        dist = metadata.distribution(name)
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (site / top).exists() and not top.endswith(".pth"):
                (site / top).symlink_to(source)
    assert "No module named 'pp4'" in in_venv(py, "import pp4", check=False).stderr
    return py


def test_a_wheel_is_the_same_bytes_when_made_again(built):
    work, wheels = built
    first = {name: w.read_bytes() for name, w in wheels.items()}
    assert "no work to do" in run([ninja_bin(), "wheel"], work).stdout
    shutil.rmtree(work / "dist")
    for stamp in (work / "build").glob("*/wheel.json"):
        stamp.unlink()
    run([ninja_bin(), "wheel-p2p", "wheel-pp4_fixture"], work)
    assert {name: w.read_bytes() for name, w in wheels.items()} == first
    with zipfile.ZipFile(wheels["pp4_p2p"]) as z:
        infos = z.infolist()
        names = [i.filename for i in infos]
        assert all(i.date_time == (1980, 1, 1, 0, 0, 0) for i in infos)
        assert names[-1].endswith(".dist-info/RECORD")
        assert "pp4_p2p/pp4_p2p.cpython-311-x86_64-linux-gnu.so" in names
        so = z.read("pp4_p2p/pp4_p2p.cpython-311-x86_64-linux-gnu.so")
        meta = z.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert hashlib.sha256(so).hexdigest() == hashlib.sha256(
        next((work / "build" / "p2p").glob("pp4_p2p*.so")).read_bytes()).hexdigest()
    torch_version = metadata.version("torch")
    assert f"Requires-Dist: torch=={torch_version}\n" in meta
    assert "Requires-Python: ==3.11.*" in meta
    assert wheels["pp4_p2p"].name.endswith("-cp311-cp311-linux_x86_64.whl")
    assert "+pp4." in wheels["pp4_p2p"].name


def wheel_in_another_folder(work: Path, scratch: Path) -> Path:
    """The fixture's sources copied to scratch, configured there with work's store, and `ninja wheel` run."""
    shutil.copytree(work / "src", scratch / "src")
    run([sys.executable, REPO / "configure.py", "--arch", "9.0", "--ext-spec", "src/ext.toml",
         "--store", work / "store"], scratch)
    run([ninja_bin(), "wheel"], scratch)
    return scratch


def test_a_changed_source_makes_a_new_wheel_in_place_of_the_old(built, tmp_path):
    work, wheels = built
    scratch = wheel_in_another_folder(work, tmp_path / "tree")
    (old,) = (scratch / "dist").glob("*.whl")
    assert old.read_bytes() == wheels["pp4_fixture"].read_bytes(), "restored in another folder: another wheel"
    ops = scratch / "src" / "src" / "ops.cpp"
    ops.write_text(ops.read_text() + "\nint pp4_fixture_more() { return 7; }  // another module\n")
    out = run([ninja_bin(), "wheel"], scratch).stdout
    (new,) = (scratch / "dist").glob("*.whl")
    assert new.name != old.name and new.name.startswith("pp4_fixture-0+pp4.")
    old_version, new_version = (w.name.split("-")[1] for w in (old, new))
    # The old wheel is gone (pip install dist/*.whl would see two versions), and a line says so.
    assert (f"pp4.wheel: removed {Path('dist') / old.name}, this target's wheel of version {old_version}, which "
            f"version {new_version} replaces (copy it elsewhere before `ninja wheel` to keep both)") in out, out


def _module_sha256(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".so")]
        return hashlib.sha256(z.read(name)).hexdigest()


def test_the_same_module_packed_again_keeps_its_version(built, tmp_path):
    """Issue 55: one module (one sha256) packed twice got two versions, and the first wheel was
    deleted. A comment added to a source changes what the build observed (the certificate) and not
    the module's bytes: the version stays, and the wheel written over is named."""
    work, wheels = built
    scratch = wheel_in_another_folder(work, tmp_path / "tree")
    (first,) = (scratch / "dist").glob("*.whl")
    first_bytes = first.read_bytes()
    kept = tmp_path / "first.whl"  # a copy: the wheel at its path is written over
    kept.write_bytes(first_bytes)
    ops = scratch / "src" / "src" / "ops.cpp"
    ops.write_text(ops.read_text() + "\n// a comment: the same object\n")
    out = run([ninja_bin(), "wheel"], scratch).stdout
    (second,) = (scratch / "dist").glob("*.whl")
    assert _module_sha256(second) == _module_sha256(kept)
    assert second.name == first.name, (first.name, second.name)
    assert second.read_bytes() != first_bytes  # another certificate inside
    assert (f"pp4.wheel: replaced {Path('dist') / first.name} (sha256 {hashlib.sha256(first_bytes).hexdigest()}), "
            "a wheel of the same name and version with other bytes") in out, out



def in_venv(py: Path, code: str, check=True):
    return run([py, "-c", code], cwd=py.parent.parent, env=OUTSIDE, check=check)


def _site(py: Path) -> Path:
    return Path(in_venv(py, "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")} if folder.exists() else set()


def test_install_import_check_refuse_and_uninstall_in_a_torch_only_venv(built, torch_venv):
    _, wheels = built
    py = torch_venv
    site = _site(py)
    before = _listing(site)
    pip = [py, "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "install", "--no-index", *wheels.values()], env=OUTSIDE)
    run([*pip, "check"], env=OUTSIDE)

    code = ("import json, torch, pp4_fixture, pp4_p2p; maps = open('/proc/self/maps').read(); "
            "print(json.dumps([pp4_fixture.scale(6), pp4_fixture.shift(6), pp4_fixture.shift_constant, "
            "sorted(n for n in dir(pp4_p2p) if not n.startswith('_')), torch.cuda.is_initialized(), "
            "'/libcuda.so' in maps, pp4_p2p.pp4_record['wheel']['distribution']]))")
    proc = in_venv(py, code)
    scale, shift, constant, names, cuda_initialised, driver_loaded, dist = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (scale, shift, constant) == (42, 9, 3)
    assert {"can_access_peer", "enable_peer_access", "export_ipc_handle", "open_ipc_handle", "peer_copy"} <= set(names)
    assert not cuda_initialised and not driver_loaded
    assert dist == "pp4-p2p"

    # A changed byte in the installed module: refused before it is loaded, in one line.
    so = next((site / "pp4_p2p").glob("pp4_p2p*.so"))
    original = so.read_bytes()
    so.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    proc = in_venv(py, "import pp4_p2p", check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: pp4_p2p: ") and "changed after the wheel was built" in last, proc.stderr
    so.write_bytes(original)

    # A wheel made for another torch (the installed record's pin edited to another git revision):
    # refused with what was built for, what runs, and what to install.
    record_file = site / "pp4_p2p" / "pp4-build-record.json"
    record_text = record_file.read_text()
    record = json.loads(record_text)
    record["wheel"]["torch"]["git_version"] = "0" * 40
    record_file.write_text(json.dumps(record))
    proc = in_venv(py, "import pp4_p2p", check=False)
    last = proc.stderr.strip().splitlines()[-1]
    assert "built for torch" in last and "git 0000000000" in last and f"torch=={metadata.version('torch')}" in last
    record_file.write_text(record_text)
    in_venv(py, "import pp4_p2p")

    run([*pip, "uninstall", "-y", "pp4-p2p", "pp4-fixture"], env=OUTSIDE)
    assert _listing(site) == before


def test_a_cold_build_in_another_folder_makes_the_same_wheel(built, tmp_path):
    """Another checkout at a longer path, with its own store: every object compiled again, and the
    wheel is byte for byte the first build's (the fixed root; the shipped certificate names no folder
    and no history)."""
    work, wheels = built
    scratch = tmp_path / "a checkout elsewhere" / "tree"
    shutil.copytree(work / "src", scratch / "src")
    run([sys.executable, REPO / "configure.py", "--arch", "9.0", "--ext-spec", "src/ext.toml",
         "--store", tmp_path / "own-store"], scratch)
    run([ninja_bin(), "wheel"], scratch)
    (wheel,) = (scratch / "dist").glob("*.whl")
    assert wheel.name == wheels["pp4_fixture"].name
    assert wheel.read_bytes() == wheels["pp4_fixture"].read_bytes()
    with zipfile.ZipFile(wheel) as z:
        text = b"".join(z.read(n) for n in z.namelist() if not n.endswith(".gz"))
        text += gzip.decompress(z.read("pp4_fixture/pp4-certificate.json.gz"))
    for folder in (str(scratch), str(work), str(tmp_path)):
        assert folder.encode() not in text
    for history in (b'"compiled"', b'"reused"', b"compile_duration_s", b"tier"):
        assert history not in text
