"""A content-addressed cache of the compiler wheels a lock pins.

A wheel is stored as wheels/<sha256>.whl and only after its bytes hash to the pinned value, so a
file in the cache is correct by its name. Wheels come from pip (the user's index, proxy and
configuration apply; pip's own cache is off and its temporary files stay inside pp4's cache) or,
for machines without an index, from a directory of already-downloaded wheels.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pp4.files import sha256_file
from pp4.toolchain.locks import ToolchainLock, WheelPin


class WheelError(Exception):
    """A wheel could not be had, or its bytes do not match the lock."""


def cached_wheel_path(cache: Path, pin: WheelPin) -> Path:
    return cache / f"{pin.sha256}.whl"


def _admit(candidate: Path, pin: WheelPin, cache: Path, origin: str) -> Path:
    """Move or copy a downloaded wheel into the cache if, and only if, its hash matches."""
    actual = sha256_file(candidate)
    if actual != pin.sha256:
        raise WheelError(
            f"{pin.filename} from {origin} has sha256 {actual}, but the lock pins {pin.sha256}. "
            "The file is corrupt or not the pinned release: delete it (or fix the wheel directory) "
            "and provision again; pp4 installs no other bytes."
        )
    final = cached_wheel_path(cache, pin)
    staging = cache / f".{pin.sha256}.{os.getpid()}.part"
    shutil.copyfile(candidate, staging)
    with open(staging, "rb") as f:
        os.fsync(f.fileno())
    os.replace(staging, final)
    return final


def _pip_download(pins: list[WheelPin], dest: Path, scratch: Path) -> None:
    requirements = dest / "requirements.txt"
    requirements.write_text("".join(f"{p.name}=={p.version} --hash=sha256:{p.sha256}\n" for p in pins))
    env = dict(os.environ)
    # pip writes its HTTP cache, self-check state and build scratch elsewhere unless told not to.
    env.update(
        PIP_NO_CACHE_DIR="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
        TMPDIR=str(scratch),
        # pip runs `rustc --version` for its user agent; a rustup proxy then writes settings into
        # $RUSTUP_HOME (default ~/.rustup). Point it into the scratch folder that is deleted after.
        RUSTUP_HOME=str(dest / "rustup-home"),
    )
    # On a terminal pip shows its progress (the compiler wheels are a few hundred MB); elsewhere
    # it stays quiet and its messages come back only when it fails.
    terminal = sys.stderr.isatty()
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
        "--no-cache-dir", "--disable-pip-version-check", *([] if terminal else ["-q"]), "-d", str(dest),
        "-r", str(requirements),
    ]
    print(f"pp4: downloading {len(pins)} pinned compiler wheel(s) with pip, once per cache "
          f"({', '.join(p.name for p in pins)})", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, env=env, stdout=None if terminal else subprocess.PIPE,
                          stderr=None if terminal else subprocess.PIPE, text=True)
    if proc.returncode != 0:
        said = "its messages are above" if terminal else (proc.stderr or "").strip()[-2000:]
        raise WheelError(
            "pip could not download the pinned compiler wheels "
            f"({', '.join(f'{p.name}=={p.version}' for p in pins)}):\n{said}\n"
            "On a machine without a package index, copy the wheels into a directory and pass "
            "--wheel-dir DIR (or set PP4_WHEELHOUSE=DIR)."
        )


def ensure_wheels(lock: ToolchainLock, cache: Path, scratch: Path, wheel_dir: Path | None = None) -> dict[str, Path]:
    """Every pinned wheel in the cache, hash-checked; returns name -> cached path."""
    cache.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(parents=True, exist_ok=True)
    wheel_dir = wheel_dir or (Path(os.environ["PP4_WHEELHOUSE"]) if os.environ.get("PP4_WHEELHOUSE") else None)
    found: dict[str, Path] = {}
    missing: list[WheelPin] = []
    for pin in lock.wheels:
        path = cached_wheel_path(cache, pin)
        if path.is_file():
            found[pin.name] = path
        elif wheel_dir is not None and (wheel_dir / pin.filename).is_file():
            found[pin.name] = _admit(wheel_dir / pin.filename, pin, cache, str(wheel_dir))
        else:
            missing.append(pin)
    if missing:
        with tempfile.TemporaryDirectory(dir=scratch, prefix="download-") as tmp:
            _pip_download(missing, Path(tmp), scratch)
            for pin in missing:
                got = Path(tmp) / pin.filename
                if not got.is_file():
                    raise WheelError(f"pip reported success but {pin.filename} is not in {tmp}")
                found[pin.name] = _admit(got, pin, cache, "pip")
    return found


def verify_cached_wheels(lock: ToolchainLock, cache: Path) -> list[str]:
    """Problems with the cached wheels: a wheel whose bytes no longer match its name."""
    problems = []
    for pin in lock.wheels:
        path = cached_wheel_path(cache, pin)
        if path.is_file() and sha256_file(path) != pin.sha256:
            problems.append(f"{path} does not hash to its pinned sha256 (corrupt cache entry)")
    return problems
