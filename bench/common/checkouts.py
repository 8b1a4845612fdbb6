"""pp4 at other git revisions beside this checkout, for benches that compare revisions in one run."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def with_revisions(revisions: list[str], prefix: str):
    """Yield (scratch folder, [(name, checkout)]): this checkout first, then a detached worktree per
    revision under the scratch folder; all of it is removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    checkouts = [("HEAD (this checkout)", REPO)]
    try:
        for rev in revisions:
            wt = tmp / f"rev-{rev}"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(wt), rev], check=True)
            checkouts.append((rev, wt))
        yield tmp, checkouts
    finally:
        for _, path in checkouts[1:]:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def compile_section() -> dict:
    """The "compile" part of a build/pp4.json for benches that drive the reuse wrapper without
    configure: the pinned nvcc (provisioned into pp4's cache if it is not there yet) and this
    machine's host compilers, as configure would choose them."""
    import os

    from pp4.toolchain import compilerenv, compilers
    from pp4.toolchain.locks import lock_for_cuda
    from pp4.toolchain.provision import IDENTITY_FILES, provision
    from pp4.toolchain.torchenv import torch_cuda_version

    tc = provision(lock_for_cuda(torch_cuda_version())).toolchain
    chosen = compilers.choose({"PATH": os.environ.get("PATH", os.defpath)}, str(tc.nvcc),
                              [(rel, str(tc.prefix / rel)) for rel in IDENTITY_FILES], [])
    return compilers.compile_section(chosen, compilerenv.Folded(), {})


def pp4_modules():
    """pp4's reuse, actionkey, certificate and pin modules, from the package layout of this
    checkout or the flat one of revisions before it (a bench runs both side by side)."""
    from types import SimpleNamespace

    try:
        from pp4.certify import certificate, pin
        from pp4.reuse import actionkey
        from pp4.reuse import wrapper as reuse
    except ImportError:
        from pp4 import actionkey, certificate, pin, reuse
    return SimpleNamespace(reuse=reuse, actionkey=actionkey, certificate=certificate, pin=pin)


class ReuseAPI:
    """The calls a bench makes on pp4.reuse, at this checkout's revision or an older one: since the
    compile environment became part of each action, lookups, stores and events take it."""

    def __init__(self, reuse_module, env: dict):
        import inspect

        self.reuse = reuse_module
        self.env = env
        self.with_env = "env" in inspect.signature(reuse_module.Reuser.store_compile).parameters

    def lookup(self, reuser, args):
        return reuser.lookup(args, self.env) if self.with_env else reuser.lookup(args)

    def store_compile(self, reuser, args, started: float, duration: float) -> dict:
        if self.with_env:
            return reuser.store_compile(args, self.env, started, duration)
        return reuser.store_compile(args, started, duration)

    def compiled_event(self, reuser, args, stored: dict, duration: float) -> None:
        if self.with_env:
            reuser.event(args, status="compiled", compile_duration_s=duration, **stored)
        else:
            reuser.event(args, status="compiled", compile_duration_s=duration, toolchain=reuser.toolchain_id, **stored)

    def hit_event(self, reuser, args, hit, seconds: float, via: str) -> None:
        if self.with_env:
            reuser.hit_event(args, self.env, hit, seconds, via=via)
        else:
            reuser.hit_event(args, hit, seconds, via=via)
