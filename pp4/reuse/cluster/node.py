"""What a cluster node runs for one compile (pp4/reuse/cluster/executor.py sends it).

The task names every folder by a placeholder: $TORCH, $TOOLCHAIN, $PYINC and $PREFIX (as keys do,
pp4/reuse/relocate.py), $ROOT (the extension's source tree) and $CWD (the build's working folder).
The node puts its own folders back: its torch and Python, the pinned toolchain it provisions from
the same hash-pinned wheels into its own pp4 cache (or the --cuda-home path, which must hold the
same bytes), the source tree rebuilt from content-addressed blobs it keeps (each blob crosses to a
node once), and a scratch working folder. It refuses, by its name, when its compilers hash
differently from the build machine's. It compiles with exactly the task's environment (the
allow-list configure chose) and returns the object, the compiler's output, and every input the
dependency file names with the sha256 of the bytes it read, so that the build machine can check
them against its own before anything is stored.
"""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path

from pp4.files import sha256_file, write_whole
from pp4.reuse import actionkey
from pp4.reuse.launch import command_for
from pp4.reuse.relocate import Relocation
from pp4.toolchain.compilerenv import process_env
from pp4.toolchain.compilers import Compilers, Identifier
from pp4.toolchain.limits import Limits
from pp4.toolchain.torchenv import torch_package_dir

NODE_NAMES = ("$TORCH", "$TOOLCHAIN", "$PYINC", "$PREFIX", "$ROOT", "$CWD")


def node_name() -> str:
    try:
        import ray

        node = ray.get_runtime_context().get_node_id()[:12]
    except Exception:  # outside a Ray worker (tests of this function)
        node = "local"
    return f"{socket.gethostname()}/{node}"


def scratch() -> Path:
    base = Path(os.environ.get("PP4_NODE_DIR") or Path(tempfile.gettempdir()) / f"pp4-node-{os.getuid()}")
    base.mkdir(parents=True, exist_ok=True)
    return base


def toolchain_here(task: dict) -> str:
    """This node's $TOOLCHAIN: the pinned release provisioned into this node's pp4 cache, or the
    --cuda-home folder the build machine used."""
    if task["cuda_release"] is None:
        return task["toolchain_path"]
    from pp4.toolchain.locks import lock_for_cuda
    from pp4.toolchain.provision import provision

    # The build machine's lock file, as it sent it: the same wheel pins whatever pp4 this node has.
    text = task["lock_text"].encode()
    lock_dir = scratch() / "locks" / hashlib.sha256(text).hexdigest()
    lock_file = lock_dir / f"cuda-{task['cuda_release']}.toml"
    if not lock_file.exists():
        write_whole(lock_file, text)
    return str(provision(lock_for_cuda(task["cuda_release"], lock_dir=lock_dir)).toolchain.prefix)


def tree_here(task: dict, fetch) -> str:
    """The extension's source tree: the build machine's own folder where this node sees it with
    the same bytes (the same machine, a shared file system), since nvcc names an anonymous
    namespace after the source's real path (pp4/reuse/actionkey.py); else a copy rebuilt from blobs
    kept per node; fetch(sha) gives a blob's bytes."""
    shared = task["root"]
    hasher = actionkey.FileHasher()  # None for a file that is missing here
    if os.path.isdir(shared) and all(hasher.sha256(os.path.join(shared, rel)) == sha for rel, sha in task["tree"]):
        return shared
    base = scratch()
    blobs = base / "blobs"
    blobs.mkdir(exist_ok=True)
    tree = base / "trees" / task["tree_id"]
    if tree.is_dir():
        return str(tree)
    staging = base / "trees" / f".{task['tree_id']}.{uuid.uuid4().hex}"
    for rel, sha in task["tree"]:
        blob = blobs / sha
        if not blob.exists():
            write_whole(blob, fetch(sha))
        dest = staging / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(blob, dest)
    try:
        os.rename(staging, tree)  # complete or absent: another task may have placed it first
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return str(tree)


def compile_task(task: dict, fetch) -> dict:
    """Run one compile here; the result the build machine checks (executor.Result's fields)."""
    name = node_name()
    work = scratch() / "work" / uuid.uuid4().hex
    work.mkdir(parents=True)
    try:
        places = {"$TORCH": str(torch_package_dir()), "$PYINC": sysconfig.get_paths()["include"],
                  "$PREFIX": sys.prefix, "$TOOLCHAIN": toolchain_here(task), "$ROOT": tree_here(task, fetch),
                  "$CWD": str(work)}
    except Exception as e:  # noqa: BLE001 - any failure here refuses this node, by name
        shutil.rmtree(work, ignore_errors=True)
        return {"node": name, "refused": f"cannot prepare the compile here: {type(e).__name__}: {e}"}
    here = Relocation.from_dict(places, NODE_NAMES)
    try:
        argv = [here.local(a) for a in task["argv"]]
        env = {k: here.local(v) for k, v in task["env"].items()}
        compilers = Compilers.from_dict(mapped_strings(task["compilers"], here.local))
        tmp = work / ".tmp"
        tmp.mkdir()
        identity = Identifier(scratch() / "compilers.json", tmp).identity(compilers, task["language"], env)
        if identity.hashes != task["identity"]:
            differ = sorted(k for k in set(identity.hashes) | set(task["identity"])
                            if identity.hashes.get(k) != task["identity"].get(k))
            return {"node": name, "refused": f"its compilers differ from the build machine's ({', '.join(differ[:4])})"}
        args = actionkey.parse_compile(argv)
        run = command_for(Limits(nvcc_threads=task["nvcc_threads"]), argv)
        for p in (args.output, args.depfile):
            (work / p).parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        proc = subprocess.run(run, cwd=work, env=process_env(env, tmp), capture_output=True,
                              preexec_fn=lambda: _limit(task["nice"], task["address_space"]))
        duration = time.monotonic() - t0
        result = {"node": name, "returncode": proc.returncode, "output": (proc.stdout + proc.stderr).decode(errors="replace"),
                  "duration_s": round(duration, 3)}
        if proc.returncode != 0:
            return result
        deps = [os.path.join(work, p) for p in actionkey.parse_depfile((work / args.depfile).read_text())]
        result["inputs"] = [[here.portable(os.path.normpath(p)), sha256_file(p)] for p in deps]
        result["object"] = (work / args.output).read_bytes()
        result["source_realpath"] = os.path.realpath(os.path.join(work, args.source))
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _limit(nice: int, address_space: int | None) -> None:
    """The build's niceness and address-space cap for the compiler (its CPU list is the build
    machine's, not this node's)."""
    if nice:
        os.nice(nice)
    if address_space:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))


def mapped_strings(doc, fn):
    """doc (JSON-like) with fn applied to every string in it."""
    if isinstance(doc, str):
        return fn(doc)
    if isinstance(doc, list):
        return [mapped_strings(x, fn) for x in doc]
    if isinstance(doc, dict):
        return {k: mapped_strings(v, fn) for k, v in doc.items()}
    return doc
