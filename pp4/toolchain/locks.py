"""Toolchain lock files: which compiler wheels, by version and sha256, make up one CUDA release.

One file per supported release lives in toolchain/ (cuda-<major>.<minor>.toml). The lock for a
build is chosen from torch.version.cuda, so adding a release is adding a file.
"""

from __future__ import annotations

import hashlib
import platform
import re
import tomllib
from pathlib import Path

import attrs

from pp4 import paths

LOCK_DIR = paths.LOCK_DIR
_LOCK_NAME = re.compile(r"^cuda-(\d+\.\d+)\.toml$")


class LockError(Exception):
    """A lock file is missing, malformed, or does not fit this machine or torch."""


@attrs.frozen
class WheelPin:
    name: str
    version: str
    filename: str
    sha256: str


@attrs.frozen
class ToolchainLock:
    cuda: str  # "13.0"
    platform: str  # machine architecture the wheels are built for, as platform.machine() says
    wheel_root: str  # folder inside the wheels that holds the CUDA tree
    wheels: tuple[WheelPin, ...]
    path: Path
    sha256: str  # of the lock file's bytes: the toolchain's identity

    @property
    def key(self) -> str:
        return self.sha256[:16]


def supported_releases(lock_dir: Path = LOCK_DIR) -> list[str]:
    found = []
    for p in lock_dir.glob("cuda-*.toml"):
        m = _LOCK_NAME.match(p.name)
        if m:
            found.append(m.group(1))
    return sorted(found, key=lambda r: tuple(int(x) for x in r.split(".")))


def wheel_pins(entries: list[dict]) -> tuple[WheelPin, ...]:
    """The [[wheel]] tables of a lock file (toolchain or source lock) as pins; KeyError when one lacks a field."""
    return tuple(WheelPin(name=w["name"], version=w["version"], filename=w["filename"], sha256=w["sha256"].lower())
                 for w in entries)


def read_lock(path: Path, what: str, error: type[Exception]) -> tuple[dict, str]:
    """(a lock file's TOML, the sha256 of its bytes); ``what`` names the lock in messages and a
    file that is not TOML raises ``error``."""
    data = path.read_bytes()
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise error(f"{what} {path} is not valid TOML: {e}") from None
    return doc, hashlib.sha256(data).hexdigest()


def checked_pins(doc: dict, path: Path, what: str, example: str, error: type[Exception]) -> tuple[WheelPin, ...]:
    """The lock's [[wheel]] pins, each with a well-formed sha256 and a plain .whl file name."""
    try:
        wheels = wheel_pins(doc["wheel"])
    except (KeyError, TypeError) as e:
        raise error(f"{what} {path} lacks the field {e}: see {example} for the format") from None
    for w in wheels:
        if not re.fullmatch(r"[0-9a-f]{64}", w.sha256):
            raise error(f"{what} {path}: wheel {w.name} has a malformed sha256 {w.sha256!r}")
        if not w.filename.endswith(".whl") or "/" in w.filename:
            raise error(f"{what} {path}: wheel {w.name} has a malformed filename {w.filename!r}")
    return wheels


def load_lock(path: Path) -> ToolchainLock:
    what, example = "toolchain lock", "pp4/locks/cuda-13.0.toml"
    doc, sha256 = read_lock(path, what, LockError)
    wheels = checked_pins(doc, path, what, example, LockError)
    try:
        return ToolchainLock(cuda=str(doc["cuda"]), platform=str(doc["platform"]),
                             wheel_root=str(doc["wheel_root"]).strip("/"), wheels=wheels, path=path, sha256=sha256)
    except (KeyError, TypeError) as e:
        raise LockError(f"{what} {path} lacks the field {e}: see {example} for the format") from None


def lock_for_cuda(cuda_version: str | None, lock_dir: Path = LOCK_DIR, machine: str | None = None) -> ToolchainLock:
    """The lock matching a torch build's CUDA release (torch.version.cuda), e.g. "13.0"."""
    releases = supported_releases(lock_dir)
    if not cuda_version:
        raise LockError(
            "the installed torch has no CUDA (torch.version.cuda is None): it is a CPU-only build. "
            f"Install a CUDA build of torch for one of the releases pp4 supports ({', '.join(releases)}), "
            "e.g. `pip install torch --index-url https://download.pytorch.org/whl/cu130`."
        )
    m = re.match(r"^(\d+)\.(\d+)", cuda_version)
    if not m:
        raise LockError(f"cannot read the CUDA release from torch.version.cuda = {cuda_version!r}")
    release = f"{m.group(1)}.{m.group(2)}"
    path = lock_dir / f"cuda-{release}.toml"
    if not path.is_file():
        raise LockError(
            f"torch was built for CUDA {release}, and pp4 has no toolchain lock for it: "
            f"supported releases are {', '.join(releases) or 'none'} (files in {lock_dir}). "
            f"Install a torch built for one of those, add a lock file cuda-{release}.toml, "
            f"or pass --cuda-home with a CUDA {release} toolkit."
        )
    lock = load_lock(path)
    machine = machine or platform.machine()
    if lock.platform != machine:
        raise LockError(
            f"toolchain lock {path} pins wheels for {lock.platform}, but this machine is {machine}: "
            "add a lock for this platform or pass --cuda-home with a matching CUDA toolkit."
        )
    return lock
