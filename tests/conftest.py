"""Shared fixtures: one real provisioned toolchain per test session, in pp4's real cache.

The compiler wheels (100 MB) are downloaded once into the cache named by $PP4_CACHE_DIR (CI points
it inside the checkout); tests that need a cache of their own take the wheels from there.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# Each test process signs with a key of its own, in a configuration folder of its own (every
# configure, ninja and store command the tests start inherits it), never the user's ~/.config/pp4.
os.environ["PP4_CONFIG_DIR"] = __import__("tempfile").mkdtemp(prefix="pp4-config-")
# What builds learn of this machine's speed (pp4/report/progress.py) stays with the test run: the
# tests' compiles (one burns CPU on purpose) would otherwise scale the user's estimates.
os.environ["PP4_SPEED_FILE"] = os.path.join(os.environ["PP4_CONFIG_DIR"], "machine-speed.json")
__import__("pp4.store.signing", fromlist=["new_key"]).new_key(name="pp4-tests")

from pp4 import paths  # noqa: E402
from pp4.toolchain.locks import lock_for_cuda  # noqa: E402
from pp4.toolchain.torchenv import torch_cuda_version  # noqa: E402
from pp4.toolchain.wheelcache import cached_wheel_path, ensure_wheels  # noqa: E402


@pytest.fixture(scope="session")
def shared_cache() -> Path:
    root = paths.cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture(scope="session")
def lock():
    return lock_for_cuda(torch_cuda_version())


@pytest.fixture(scope="session")
def wheelhouse(shared_cache, lock, tmp_path_factory) -> Path:
    """A directory holding the pinned wheels under their own file names (as a user would have)."""
    ensure_wheels(lock, paths.wheel_cache_dir(shared_cache), paths.tmp_dir(shared_cache))
    house = tmp_path_factory.mktemp("wheelhouse")
    for pin in lock.wheels:
        src = cached_wheel_path(paths.wheel_cache_dir(shared_cache), pin)
        try:
            os.link(src, house / pin.filename)
        except OSError:
            shutil.copyfile(src, house / pin.filename)
    return house


@pytest.fixture(scope="session")
def toolchain(shared_cache, lock):
    from pp4.toolchain.provision import provision

    return provision(lock, shared_cache).toolchain


def compile_section(toolchain) -> dict:
    """The "compile" part of a build/pp4.json for tests that drive the reuse wrapper in-process:
    the real pinned nvcc and this machine's host compilers, in the compile environment configure
    would choose."""
    from pp4.toolchain import compilerenv, compilers
    from pp4.toolchain.provision import IDENTITY_FILES

    chosen = compilers.choose({"PATH": os.environ.get("PATH", os.defpath)}, str(toolchain.nvcc),
                              [(rel, str(toolchain.prefix / rel)) for rel in IDENTITY_FILES], [])
    return compilers.compile_section(chosen, compilerenv.Folded(), {})


def content_snapshot(root: Path) -> dict[str, tuple]:
    """snapshot() plus each regular file's sha256: a rewrite with equal size and mtime shows too."""
    snap = snapshot(root)
    for rel in snap:
        p = root / rel
        if p.is_file() and not p.is_symlink():
            snap[rel] += (hashlib.sha256(p.read_bytes()).hexdigest(),)
    return snap


def snapshot(root: Path) -> dict[str, tuple]:
    """Every file and link below root with its content identity and mtime, for 'nothing changed' checks."""
    out = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
    return out


class RedisServer:
    """A real redis-server on a free local port, for the remote tier's tests."""

    def __init__(self, folder: Path, *args: str):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        folder.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(folder), *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        password = args[args.index("--requirepass") + 1] if "--requirepass" in args else None
        import redis

        self.client = redis.Redis(port=self.port, password=password)
        for _ in range(100):
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            raise RuntimeError("redis-server did not start")

    def url(self, password: str | None = None) -> str:
        return f"redis://{':' + password + '@' if password else ''}127.0.0.1:{self.port}/0"

    def keys(self, kind: str = "*") -> list[str]:
        return sorted(k.decode() for k in self.client.keys(f"pp4:{kind}/*"))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def store_as_compiled(reuser, argv: list[str], env: dict, files: list[str], data: bytes) -> dict:
    """Store `data` as the object of `argv`, as a compile that observed `files` (their states now)
    stores it, through pp4's own Reuser; writes its event. For tests that need many stored objects
    without a compiler."""
    from pp4.reuse.actionkey import parse_compile

    action = reuser.action(parse_compile(argv), env)
    out = __import__("pathlib").Path(action.args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    pairs = [[p, reuser.states.state(p)] for p in files]
    reuser.write_depfile(action, pairs)
    stored = reuser.store_compile(action, pairs, None, 1.0)
    reuser.event(action, status="compiled", compile_duration_s=1.0, **stored)
    return stored


# The remote tier's values as a store writer sees them (pp4/store/remote/tier.py documents the
# layout): zstd frames of an object's bytes, or of a group's JSON. Read and written here with the
# zstandard and json modules alone, as anyone with write access to the store could.
def zstd_frame(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


def unzstd(frame: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdDecompressor().decompress(frame)


def group_doc(frame: bytes) -> dict:
    """A remote group's JSON, with its set packs' frames by name under "pack_frames" (the value is
    the JSON, a newline, then the frames end to end, as "packs" gives their names and sizes)."""
    import json

    head, _, tail = unzstd(frame).partition(b"\n")
    doc = json.loads(head)
    doc["pack_frames"], at = {}, 0
    for name, size in doc["packs"]:
        doc["pack_frames"][name] = tail[at:at + size]
        at += size
    return doc


def group_frame(doc: dict) -> bytes:
    import json

    doc = dict(doc)
    frames = doc.pop("pack_frames", {})
    doc["packs"] = [[name, len(frames[name])] for name in sorted(frames)]
    return zstd_frame(json.dumps(doc).encode() + b"\n" + b"".join(frames[name] for name in sorted(frames)))


def group_of(storage, action_key: str) -> tuple[str, dict]:
    """(key, JSON) of the remote group that holds an action's record."""
    for key in storage.keys("ent"):
        doc = group_doc(storage.get(key))
        if action_key in doc["records"]:
            return key, doc
    raise KeyError(action_key)
