"""The pinned toolchain: lock choice, hash-checked wheels, idempotent and atomic provisioning."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, content_snapshot, snapshot

from pp4.toolchain import provision as tc
from pp4.toolchain.locks import LockError, load_lock, lock_for_cuda, supported_releases
from pp4.toolchain.wheelcache import WheelError, ensure_wheels

# --------------------------------------------------------------------------- locks


def test_lock_chosen_from_torch_cuda_release():
    lock = lock_for_cuda("13.0")
    assert lock.cuda == "13.0"
    names = {w.name: w.version for w in lock.wheels}
    assert names["nvidia-cuda-nvcc"] == "13.0.88"
    assert names["nvidia-nvvm"] == "13.0.88"
    assert names["nvidia-cuda-crt"] == "13.0.88"
    assert names["nvidia-cuda-cccl"] == "13.0.85"
    assert "13.0" in supported_releases()


def test_torch_release_without_lock_lists_supported_releases():
    with pytest.raises(LockError) as e:
        lock_for_cuda("12.6")
    msg = str(e.value)
    assert "torch was built for CUDA 12.6, and pp4 has no toolchain lock for it" in msg
    assert "supported releases are 13.0" in msg
    assert "cuda-12.6.toml" in msg


def test_cpu_only_torch_is_refused_clearly():
    with pytest.raises(LockError, match=r"torch\.version\.cuda is None\): it is a CPU-only build"):
        lock_for_cuda(None)


def test_adding_a_release_is_adding_a_file(tmp_path):
    shutil.copy(REPO / "pp4" / "locks" / "cuda-13.0.toml", tmp_path / "cuda-13.0.toml")
    text = (tmp_path / "cuda-13.0.toml").read_text().replace('cuda = "13.0"', 'cuda = "13.9"')
    (tmp_path / "cuda-13.9.toml").write_text(text)
    assert supported_releases(tmp_path) == ["13.0", "13.9"]
    assert lock_for_cuda("13.9.1", lock_dir=tmp_path).cuda == "13.9"


def test_malformed_lock_names_the_file(tmp_path):
    bad = tmp_path / "cuda-13.0.toml"
    bad.write_text('cuda = "13.0"\nplatform = "x86_64"\nwheel_root = "nvidia/cu13"\n[[wheel]]\nname = "x"\n')
    with pytest.raises(LockError, match=r"cuda-13.0.toml lacks the field 'version'"):
        load_lock(bad)


@pytest.mark.parametrize("change,message", [
    (("550c0d04", "550C0D0"), r"wheel exllamav3 has a malformed sha256"),
    (("-py3-none-any.whl", "-py3-none-any.zip"), r"wheel exllamav3 has a malformed filename"),
    (('project = "exllamav3"\n', ""), r"exllamav3.toml lacks the field 'project'"),
    (("[[wheel]]", "[[wheel]]\nname = 'again'\nversion = '1'\nfilename = 'a.whl'\nsha256 = '" + "0" * 64 + "'\n[[wheel]]"),
     r"must pin exactly one artifact, it pins 2"),
    (("[[wheel]]", "[[wheel"), r"is not valid TOML"),
])
def test_the_source_lock_refuses_bad_pins_by_name(tmp_path, change, message):
    from pp4.sources.exl3 import Exl3Error
    from pp4.sources.exl3 import load_lock as load_source_lock

    bad = tmp_path / "exllamav3.toml"
    text = (REPO / "pp4" / "locks" / "exllamav3.toml").read_text()
    assert change[0] in text
    bad.write_text(text.replace(change[0], change[1], 1))
    with pytest.raises(Exl3Error, match=message):
        load_source_lock(bad)
    assert load_source_lock(REPO / "pp4" / "locks" / "exllamav3.toml").wheel.sha256.startswith("550c0d04")


# --------------------------------------------------------------------------- wheels


def test_wheel_with_wrong_hash_is_refused_and_not_cached(tmp_path, lock, wheelhouse):
    bad_house = tmp_path / "house"
    bad_house.mkdir()
    pin = next(w for w in lock.wheels if w.name == "nvidia-cuda-crt")
    data = bytearray((wheelhouse / pin.filename).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bad_house / pin.filename).write_bytes(bytes(data))
    single = _lock_with(tmp_path, lock, ["nvidia-cuda-crt"])
    cache = tmp_path / "cache"
    with pytest.raises(WheelError) as e:
        ensure_wheels(single, cache, tmp_path / "scratch", wheel_dir=bad_house)
    assert f"{pin.filename} from {bad_house} has sha256" in str(e.value)
    assert f"but the lock pins {pin.sha256}" in str(e.value)
    assert list(cache.iterdir()) == []


def _lock_with(tmp_path, lock, names):
    """A lock holding only some of the real lock's wheels (the real pins, hashes included)."""
    lines = [f'cuda = "{lock.cuda}"', f'platform = "{lock.platform}"', f'wheel_root = "{lock.wheel_root}"']
    for w in lock.wheels:
        if w.name in names:
            lines += ["[[wheel]]", f'name = "{w.name}"', f'version = "{w.version}"',
                      f'filename = "{w.filename}"', f'sha256 = "{w.sha256}"']
    d = tmp_path / f"locks-{'-'.join(names)}"
    d.mkdir(exist_ok=True)
    (d / f"cuda-{lock.cuda}.toml").write_text("\n".join(lines) + "\n")
    return load_lock(d / f"cuda-{lock.cuda}.toml")


def test_pip_download_writes_nothing_outside_the_cache(tmp_path, lock):
    """The real pip path, on the smallest pinned wheel: HOME and TMPDIR stay untouched."""
    single = _lock_with(tmp_path, lock, ["nvidia-cuda-crt"])
    home, tmpdir, cache = tmp_path / "home", tmp_path / "tmpdir", tmp_path / "cache"
    for d in (home, tmpdir):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "XDG_"))}
    env.update(HOME=str(home), TMPDIR=str(tmpdir), PP4_CACHE_DIR=str(cache))
    code = (
        "import sys; from pathlib import Path; from pp4.toolchain.locks import load_lock; from pp4.toolchain.wheelcache import ensure_wheels;"
        f"ensure_wheels(load_lock(Path({str(single.path)!r})), Path({str(cache / 'wheels')!r}), Path({str(cache / 'tmp')!r}))"
    )
    before = snapshot(home), snapshot(tmpdir), snapshot(REPO / "pp4")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    # Only an unreachable index is a reason to skip; a pin no index has ("Could not find a version")
    # is a wrong lock and must fail.
    if proc.returncode != 0 and any(w in proc.stderr.lower() for w in ("connection", "network is unreachable",
                                                                          "temporary failure in name resolution")):
        pytest.skip(f"no package index reachable: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr
    assert (snapshot(home), snapshot(tmpdir), snapshot(REPO / "pp4")) == before
    pin = single.wheels[0]
    assert (cache / "wheels" / f"{pin.sha256}.whl").is_file()


# --------------------------------------------------------------------------- provisioning


def _provision(cache, wheelhouse, env_extra=None, wait=True):
    """Provision in a child process (so it can be killed), through the command line."""
    env = dict(os.environ, PP4_CACHE_DIR=str(cache), **(env_extra or {}))
    cmd = [sys.executable, "-m", "pp4.toolchain", "provision", "--wheel-dir", str(wheelhouse)]
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return p
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    return out


def test_provisioned_nvcc_works_with_no_environment(toolchain, tmp_path):
    src = tmp_path / "k.cu"
    src.write_text('#include <cublas_v2.h>\n#include <cub/cub.cuh>\n__global__ void k(float* x) { x[threadIdx.x] *= 2; }\n')
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)}  # nothing pointing at CUDA
    proc = subprocess.run([str(toolchain.nvcc), "-E", "-x", "cu", str(src), "-o", str(tmp_path / "k.ii")],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    mode = (toolchain.prefix / "bin" / "nvcc").stat().st_mode
    assert mode & 0o005 == 0o005, "nvcc must be executable by other users too"
    assert (toolchain.prefix / "lib64").resolve() == (toolchain.prefix / "lib").resolve()
    assert (toolchain.prefix / "lib" / "libcudart.so").resolve().name == "libcudart.so.13"
    assert (toolchain.prefix / "include" / "cublas_v2.h").is_file()


def test_reprovisioning_touches_no_file(tmp_path, wheelhouse):
    cache = tmp_path / "cache"
    _provision(cache, wheelhouse)
    before = content_snapshot(cache)
    out = _provision(cache, wheelhouse)
    assert "0 files written, 0 copied from an older prefix" in out
    after = content_snapshot(cache)
    changed = [k for k in set(before) | set(after) if before.get(k) != after.get(k)]
    assert changed == []
    assert len(after) > 1800


def test_changing_one_wheel_rewrites_only_its_changed_files(tmp_path, lock, wheelhouse):
    """A new cccl wheel with one header edited: the new prefix writes that one file, copies the rest."""
    cache = tmp_path / "cache"
    first = tc.provision(lock, cache, wheelhouse)
    pin = next(w for w in lock.wheels if w.name == "nvidia-cuda-cccl")
    house2 = tmp_path / "house2"
    shutil.copytree(wheelhouse, house2)
    edited = "nvidia/cu13/include/cccl/cuda/std/version"
    new_wheel = house2 / pin.filename
    _rewrite_member(wheelhouse / pin.filename, new_wheel, edited, b"\n// edited by a test\n")
    sha = hashlib.sha256(new_wheel.read_bytes()).hexdigest()
    locks2 = tmp_path / "locks2"
    locks2.mkdir()
    (locks2 / lock.path.name).write_text(lock.path.read_text().replace(pin.sha256, sha))
    lock2 = load_lock(locks2 / lock.path.name)
    second = tc.provision(lock2, cache, house2)
    assert second.toolchain.prefix != first.toolchain.prefix
    assert second.written == 1
    assert second.copied == first.written - 1
    # copied, not linked: the older prefix's inodes are not shared, so a build using it sees no change
    old_nvcc, new_nvcc = first.toolchain.nvcc.stat(), second.toolchain.nvcc.stat()
    assert old_nvcc.st_mtime_ns == new_nvcc.st_mtime_ns and old_nvcc.st_ino != new_nvcc.st_ino
    assert old_nvcc.st_nlink == 1
    assert tc.check_prefix(second.toolchain.prefix, deep=True) == []
    assert tc.check_prefix(first.toolchain.prefix, deep=True) == []


def _rewrite_member(src: Path, dest: Path, member: str, append: bytes) -> None:
    """Copy a wheel, appending bytes to one member and fixing its RECORD line, as a new release would."""
    import base64

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        new_data = zin.read(member) + append
        digest = base64.urlsafe_b64encode(hashlib.sha256(new_data).digest()).rstrip(b"=").decode()
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename == member:
                data = new_data
            elif info.filename.endswith("RECORD"):
                lines = [f"{member},sha256={digest},{len(new_data)}" if ln.startswith(member + ",") else ln
                         for ln in data.decode().splitlines()]
                data = ("\n".join(lines) + "\n").encode()
            zout.writestr(info, data)


@pytest.mark.parametrize("step", ["extracting", "manifest", "staged", "swapping"])
def test_sigkill_at_any_step_never_leaves_a_passing_prefix(tmp_path, lock, wheelhouse, step):
    cache = tmp_path / "cache"
    if step == "swapping":  # the swap only happens when a damaged prefix is replaced
        tc.provision(lock, cache, wheelhouse)
        prefix = next((cache / "toolchains").glob("cuda-*"))
        os.chmod(prefix / "bin", 0o755)
        (prefix / "bin" / "ptxas").unlink()
    marker = tmp_path / "paused"
    p = _provision(cache, wheelhouse, {"PP4_TEST_PAUSE": step, "PP4_TEST_PAUSE_MARKER": str(marker)}, wait=False)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert p.poll() is None, p.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    prefixes = list((cache / "toolchains").glob("cuda-*"))
    if step == "staged":
        assert prefixes == []  # complete in staging, but never renamed: not there
    for prefix in prefixes:
        assert tc.check_prefix(prefix) != [], f"a killed run left {prefix} looking complete"
    _provision(cache, wheelhouse)  # the next run repairs
    (prefix,) = (cache / "toolchains").glob("cuda-*")
    assert tc.check_prefix(prefix, deep=True) == []
    assert not [p for p in (cache / "toolchains").iterdir() if p.name.startswith((".staging", ".trash"))]


def test_damaged_prefix_is_detected_and_repaired_minimally(tmp_path, lock, wheelhouse):
    cache = tmp_path / "cache"
    result = tc.provision(lock, cache, wheelhouse)
    prefix = result.toolchain.prefix
    os.chmod(prefix / "include", 0o755)
    (prefix / "include" / "cuda_fp16.h").unlink()
    (prefix / "include" / "stray.h").write_text("// could shadow a real header\n")
    problems = tc.check_prefix(prefix)
    assert any("cuda_fp16.h: missing" in p for p in problems)
    assert any("stray.h: not part of the toolchain" in p for p in problems)
    again = tc.provision(lock, cache, wheelhouse)
    assert again.written == 1 and again.copied == result.written - 1
    assert tc.check_prefix(prefix, deep=True) == []


def test_check_command_reports_damage(tmp_path, lock, wheelhouse):
    cache = tmp_path / "cache"
    prefix = tc.provision(lock, cache, wheelhouse).toolchain.prefix
    target = prefix / "nvvm" / "libdevice" / "libdevice.10.bc"
    os.chmod(target, 0o644)
    with open(target, "r+b") as f:  # same size, same mtime, one flipped byte: only --deep sees it
        st = os.fstat(f.fileno())
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    os.chmod(target, 0o444)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    env = dict(os.environ, PP4_CACHE_DIR=str(cache))
    fast = subprocess.run([sys.executable, "-m", "pp4.toolchain", "check"], cwd=REPO, env=env, capture_output=True, text=True)
    deep = subprocess.run([sys.executable, "-m", "pp4.toolchain", "check", "--deep"], cwd=REPO, env=env, capture_output=True, text=True)
    assert fast.returncode == 0
    assert deep.returncode == 1
    assert "libdevice.10.bc: content does not hash to" in deep.stderr
