"""What a cluster node runs for one compile (pp4/reuse/cluster/executor.py sends it).

The task is the command as it runs in the fixed execution root (pp4/execution/root.py): every
folder at its fixed path, /pp4/torch, /pp4/toolchain, /pp4/src, ... The node mounts its own folders
there: its torch and Python, the pinned toolchain it provisions from the same hash-pinned wheels
into its own pp4 cache (or the --cuda-home path), the source tree rebuilt from content-addressed
blobs it keeps (each blob crosses to a node once), and a scratch working folder. So the command and
the object are the build machine's, byte for byte. It compiles observed, with exactly the task's
environment, and returns the object, the compiler's output and what the compile observed (each
path with the state found there), which the build machine checks against its own machine before
anything is used or stored: a node with another torch, header or compiler is caught there.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import sys
import sysconfig
import tempfile
import uuid
from pathlib import Path

from pp4.execution.root import Root, unavailable
from pp4.execution.run import run
from pp4.files import write_whole
from pp4.reuse import actionkey, observations, pathstates
from pp4.toolchain.limits import Limits
from pp4.toolchain.torchenv import torch_package_dir


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
    """The extension's source tree (mounted at /pp4/src): the build machine's own folder where this
    node sees it with the same bytes (the same machine, a shared file system), else a copy rebuilt
    from blobs kept per node; fetch(sha) gives a blob's bytes."""
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
                  "$PREFIX": sys.prefix, "$TOOLCHAIN": toolchain_here(task)}
        source_root = tree_here(task, fetch)
    except Exception as e:  # noqa: BLE001 - any failure here refuses this node, by name
        shutil.rmtree(work, ignore_errors=True)
        return {"node": name, "refused": f"cannot prepare the compile here: {type(e).__name__}: {e}"}
    try:
        root = Root.make(str(work), places, source_root)
        runs = scratch() / "runs"
        problem = unavailable(str(runs))
        if problem is not None:
            return {"node": name, "refused": f"it cannot run compiles in the fixed root ({problem})"}
        command = list(task["command"])
        args = actionkey.parse_compile(command)
        for p in (args.output, args.depfile):  # relative to the working folder, as ninja's are
            real = root.real(os.path.join(root.cwd, p)) if not os.path.isabs(p) else root.real(p)
            if real is None:
                return {"node": name, "refused": f"its output {p} is not inside the build's folders"}
            Path(real).parent.mkdir(parents=True, exist_ok=True)
        limits = Limits(nice=task["nice"], address_space=task["address_space"], nvcc_threads=task["nvcc_threads"],
                        tmpdir=str(runs))
        ran = run(command, task["env"], limits, runs, root)
        result = {"node": name, "returncode": ran.returncode, "output": ran.stderr.decode(errors="replace"),
                  "duration_s": round(ran.seconds, 3), "time_macros": []}
        if ran.returncode != 0:
            return result
        outputs = {os.path.normpath(os.path.join(root.cwd, p)) for p in (args.output, args.depfile)}
        hasher = actionkey.FileHasher()
        pairs, problem = observations.from_run(ran, outputs, pathstates.States(hasher))
        result["time_macros"] = [list(f) for f in observations.time_macros(ran, pairs, hasher)]
        result["observations"], result["unobserved"] = pairs, problem
        result["object"] = Path(root.real(os.path.normpath(os.path.join(root.cwd, args.output)))).read_bytes()
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)
