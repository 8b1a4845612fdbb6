"""Provision the pinned CUDA compiler: wheels -> a prefix where bin/nvcc works with no environment.

The prefix lives at <cache>/toolchains/cuda-<release>-<key>, where the key hashes the lock file, the
set of torch library headers laid into it and the layout (LAYOUT), so a prefix's name says exactly
what is in it and how it is checked: two pp4 versions that lay out or check a prefix differently
never share one, and so never take each other's for damaged and replace it under a running build.

Layout (what nvcc.profile expects when there is no targets/ folder):
    bin/ nvcc ptxas cudafe++ fatbinary nvlink ... nvcc.profile    nvvm/bin/cicc  nvvm/libdevice/
    include/ (runtime, crt, cccl, and torch's library headers)    lib/ (libcudart.so -> .so.13)
    lib64 -> lib

Guarantees:
- Idempotent: a prefix that passes the check is left alone, so a re-run writes nothing.
- Minimal: every file gets the mtime of its wheel entry, and a file that an older prefix of the
  same release already holds with the same sha256 is copied from it rather than extracted.
- Never under a reader: nothing of another prefix is linked or changed, since a build may be
  compiling with it. A hard link would share its inodes, and making one changes the inode's ctime,
  which a compile in flight reads as its input changing under it (pp4/reuse/observations.py,
  changed_during): its object would be kept out of the store.
- Atomic: a prefix is built in a staging folder, its manifest written last, and renamed into place;
  a SIGKILL at any point leaves either the old prefix or none, never one that passes the check.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import os
import shutil
import stat
import sys
import time
import zipfile
from pathlib import Path

import attrs

from pp4 import paths
from pp4.files import fsync_dir, locked, sha256_file
from pp4.toolchain.locks import ToolchainLock
from pp4.toolchain.torchenv import HeaderFile, library_headers
from pp4.toolchain.wheelcache import ensure_wheels

from pp4.toolchain.prefixcheck import MANIFEST, MANIFEST_VERSION, check_prefix, read_manifest  # noqa: F401 (theirs)
# Tools whose bytes decide what nvcc produces; the reuse rule hashes them as the toolchain identity.
IDENTITY_FILES = (
    "bin/nvcc", "bin/nvcc.profile", "bin/ptxas", "bin/cudafe++", "bin/fatbinary", "bin/nvlink",
    "bin/crt/link.stub", "bin/crt/prelink.stub", "nvvm/bin/cicc", "nvvm/libdevice/libdevice.10.bc",
)
# What a prefix holds and how it is checked; part of the prefix's name. Bump it when either changes.
# 2: donors' files copied, not hard-linked; the layout hashed into the key.
LAYOUT = 2
_EXECUTABLE_DIRS = ("bin/", "nvvm/bin/")
_LINKS = {"lib64": "lib", "lib/libcudart.so": "libcudart.so.13"}


def _pause_for_test(step: str) -> None:
    """Fault-injection point: tests SIGKILL provisioning at exactly this step (PP4_TEST_PAUSE=<step>)."""
    if os.environ.get("PP4_TEST_PAUSE") == step:
        marker = os.environ.get("PP4_TEST_PAUSE_MARKER")
        if marker:
            Path(marker).write_text(step)
        time.sleep(3600)


class ToolchainError(Exception):
    """The toolchain could not be provisioned or does not pass its check."""


@attrs.frozen
class Toolchain:
    """A CUDA compiler ready to use: the pinned prefix, or a user's --cuda-home override."""

    prefix: Path
    cuda: str  # "13.0"
    key: str  # what identifies the prefix's content; "override:<path>" for --cuda-home
    pinned: bool

    @property
    def nvcc(self) -> Path:
        return self.prefix / "bin" / "nvcc"

    @property
    def include_dir(self) -> Path:
        return self.prefix / "include"

    @property
    def lib_dir(self) -> Path:
        return self.prefix / "lib64" if (self.prefix / "lib64").exists() else self.prefix / "lib"


@attrs.frozen
class _Planned:
    """One file the prefix must hold, and where its bytes come from."""

    relpath: str
    sha256: str | None  # expected, when the source states it (wheel RECORD)
    mtime_ns: int
    mode: int
    wheel: Path | None = None
    member: str | None = None
    source: Path | None = None


# ---------------------------------------------------------------------------------------------
# what goes into the prefix


def _record_hashes(zf: zipfile.ZipFile) -> dict[str, str]:
    """member -> sha256 hex from the wheel's RECORD, so extraction can be checked file by file."""
    import base64

    record = next((n for n in zf.namelist() if n.endswith(".dist-info/RECORD")), None)
    hashes = {}
    if record:
        for line in zf.read(record).decode().splitlines():
            parts = line.rsplit(",", 2)
            if len(parts) == 3 and parts[1].startswith("sha256="):
                v = parts[1][len("sha256="):]
                hashes[parts[0]] = base64.urlsafe_b64decode(v + "=" * (-len(v) % 4)).hex()
    return hashes


def _mode_for(relpath: str) -> int:
    # Read-only for everyone, executable where nvcc runs things: works for a non-root user, and
    # nothing edits a prefix's file by accident.
    return 0o555 if relpath.startswith(_EXECUTABLE_DIRS) else 0o444


def _plan(lock: ToolchainLock, wheels: dict[str, Path], headers: list[HeaderFile]) -> list[_Planned]:
    root = lock.wheel_root + "/"
    planned: dict[str, _Planned] = {}
    for pin in lock.wheels:
        with zipfile.ZipFile(wheels[pin.name]) as zf:
            hashes = _record_hashes(zf)
            for info in zf.infolist():
                if info.is_dir() or not info.filename.startswith(root):
                    continue
                rel = info.filename[len(root):]
                if rel.startswith(".metadata/"):
                    continue  # NVIDIA's packaging scan logs, not part of the toolkit
                mtime = calendar.timegm(info.date_time + (0, 0, -1)) * 10**9
                planned[rel] = _Planned(rel, hashes.get(info.filename), mtime, _mode_for(rel),
                                        wheel=wheels[pin.name], member=info.filename)
    for h in headers:
        rel = "include/" + h.relpath
        if rel in planned:
            continue  # the compiler wheels' own copy wins
        planned[rel] = _Planned(rel, h.sha256, h.source.stat().st_mtime_ns, 0o444, source=h.source)
    return [planned[k] for k in sorted(planned)]


def prefix_key(lock: ToolchainLock, headers: list[HeaderFile]) -> str:
    h = hashlib.sha256()
    h.update(lock.sha256.encode())
    h.update(f"\0layout {LAYOUT}.{MANIFEST_VERSION}".encode())
    for f in headers:
        h.update(f"\0{f.dist}\0{f.relpath}\0{f.sha256}".encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# the check


# ---------------------------------------------------------------------------------------------
# building a prefix


def _reusable_files(toolchains: Path, release: str) -> dict[tuple[str, str], Path]:
    """(relpath, sha256) -> a file an existing good prefix of the same release already holds."""
    reusable: dict[tuple[str, str], Path] = {}
    for other in sorted(toolchains.glob(f"cuda-{release}-*")):
        if not other.is_dir():
            continue
        manifest = read_manifest(other)
        if manifest is None:
            continue
        for rel, (sha, size, mode, mtime_ns) in manifest["files"].items():
            p = other / rel
            try:
                st = p.lstat()
            except OSError:
                continue
            if st.st_size == size and st.st_mtime_ns == mtime_ns and stat.S_ISREG(st.st_mode):
                reusable.setdefault((rel, sha), p)
    return reusable


def _copy_checked(donor: Path, dest: Path, sha256: str) -> bool:
    """Copy a donor's bytes, hashing them on the way: True when they hash to sha256 (its size and
    mtime say it is unchanged, but only its bytes prove it). Reading changes nothing of the donor."""
    h = hashlib.sha256()
    try:
        with open(donor, "rb") as src, open(dest, "wb") as out:
            while chunk := src.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
    except OSError:
        return False
    return h.hexdigest() == sha256


def _write_file(item: _Planned, dest: Path, wheels_open: dict[Path, zipfile.ZipFile]) -> str:
    h = hashlib.sha256()
    with open(dest, "wb") as out:
        if item.wheel is not None:
            if item.wheel not in wheels_open:
                wheels_open[item.wheel] = zipfile.ZipFile(item.wheel)
            zf = wheels_open[item.wheel]
            src = zf.open(item.member)
        else:
            src = open(item.source, "rb")
        with src:
            while chunk := src.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
    digest = h.hexdigest()
    origin = item.member if item.wheel is not None else str(item.source)
    if item.sha256 is not None and digest != item.sha256:
        raise ToolchainError(f"{origin} hashes to {digest}, but its wheel RECORD says {item.sha256}: corrupt wheel or install")
    return digest


def _build(staging: Path, planned: list[_Planned], reusable: dict, manifest_head: dict) -> tuple[int, int]:
    files: dict[str, list] = {}
    written = copied = 0
    wheels_open: dict[Path, zipfile.ZipFile] = {}
    try:
        for item in planned:
            dest = staging / item.relpath
            dest.parent.mkdir(parents=True, exist_ok=True)
            donor = reusable.get((item.relpath, item.sha256)) if item.sha256 else None
            if donor is not None and _copy_checked(donor, dest, item.sha256):
                digest = item.sha256
                copied += 1
            else:
                digest = _write_file(item, dest, wheels_open)
                written += 1
            os.chmod(dest, item.mode)
            os.utime(dest, ns=(item.mtime_ns, item.mtime_ns))
            files[item.relpath] = [digest, dest.stat().st_size, item.mode, item.mtime_ns]
            if written + copied == 100:
                _pause_for_test("extracting")
    finally:
        for zf in wheels_open.values():
            zf.close()
    for rel, target in _LINKS.items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, staging / rel)
    manifest = dict(manifest_head, version=MANIFEST_VERSION, files=files, links=dict(_LINKS))
    tmp = staging / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    _pause_for_test("manifest")
    os.replace(tmp, staging / MANIFEST)  # last: a staging folder without it is never trusted
    _pause_for_test("staged")
    return written, copied


def _sweep(toolchains: Path) -> None:
    """Leftovers of killed runs: staging and trash folders. Called with the lock held."""
    for p in toolchains.iterdir():
        if p.name.startswith((".staging-", ".trash-")):
            _rmtree(p)


def _rmtree(p: Path) -> None:
    def make_writable(func, path, _exc):
        os.chmod(os.path.dirname(path), 0o755)
        os.chmod(path, 0o755)
        func(path)

    shutil.rmtree(p, onexc=make_writable) if sys.version_info >= (3, 12) else shutil.rmtree(p, onerror=make_writable)


@attrs.frozen
class ProvisionResult:
    toolchain: Toolchain
    written: int  # files whose bytes were written
    copied: int  # files copied from an older prefix
    seconds: float


def provision(lock: ToolchainLock, cache_root: Path | None = None, wheel_dir: Path | None = None,
              with_torch_headers: bool = True, repair: bool = True) -> ProvisionResult:
    t0 = time.monotonic()
    cache_root = cache_root or paths.cache_dir()
    toolchains = paths.toolchains_dir(cache_root)
    skip = {w.name for w in lock.wheels}
    headers = library_headers(lock.wheel_root, skip) if with_torch_headers else []
    key = prefix_key(lock, headers)
    prefix = toolchains / f"cuda-{lock.cuda}-{key}"
    toolchain = Toolchain(prefix=prefix, cuda=lock.cuda, key=key, pinned=True)
    if prefix.is_dir() and not check_prefix(prefix, key):
        return ProvisionResult(toolchain, 0, 0, time.monotonic() - t0)
    with locked(toolchains):
        if prefix.is_dir() and not check_prefix(prefix, key):  # another process finished it meanwhile
            return ProvisionResult(toolchain, 0, 0, time.monotonic() - t0)
        if prefix.exists() and not repair:
            raise ToolchainError("\n".join(check_prefix(prefix, key)))
        _sweep(toolchains)
        wheels = ensure_wheels(lock, paths.wheel_cache_dir(cache_root), paths.tmp_dir(cache_root), wheel_dir)
        planned = _plan(lock, wheels, headers)
        reusable = _reusable_files(toolchains, lock.cuda)
        staging = toolchains / f".staging-{key}-{os.getpid()}"
        head = {
            "key": key, "cuda": lock.cuda, "lock": lock.path.name, "lock_sha256": lock.sha256,
            "wheels": [attrs.asdict(w) for w in lock.wheels],
            "torch_headers": sorted({h.dist for h in headers}),
        }
        written, copied = _build(staging, planned, reusable, head)
        if prefix.exists():
            # Damaged or foreign: move it aside first, so the rename below never merges trees.
            trash = toolchains / f".trash-{key}-{os.getpid()}"
            os.rename(prefix, trash)
            _pause_for_test("swapping")
            os.rename(staging, prefix)
            _rmtree(trash)
        else:
            os.rename(staging, prefix)
        fsync_dir(toolchains)
    return ProvisionResult(toolchain, written, copied, time.monotonic() - t0)


def override(cuda_home: Path) -> Toolchain:
    """A user's own CUDA toolkit (--cuda-home): used as it is, checked by pp4.compat like any other."""
    cuda_home = cuda_home.expanduser().absolute()
    if not (cuda_home / "bin" / "nvcc").is_file():
        raise ToolchainError(f"--cuda-home {cuda_home} has no bin/nvcc: point it at the root of a CUDA toolkit")
    return Toolchain(prefix=cuda_home, cuda="", key=f"override:{cuda_home}", pinned=False)


def identity(toolchain: Toolchain) -> dict[str, str]:
    """sha256 of each file that decides what nvcc produces (for build records and the reuse rule)."""
    manifest = read_manifest(toolchain.prefix) if toolchain.pinned else None
    out = {}
    for rel in IDENTITY_FILES:
        if manifest is not None and rel in manifest["files"]:
            out[rel] = manifest["files"][rel][0]
        elif (toolchain.prefix / rel).is_file():
            out[rel] = sha256_file(toolchain.prefix / rel)
    return out


# ---------------------------------------------------------------------------------------------
# command line
