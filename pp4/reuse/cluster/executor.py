"""A compile that missed the store, run on a Ray cluster instead of here (`--executor ray://HOST:PORT`).

The reuse wrapper hands a miss to ClusterExecutor.run. It connects to the cluster as a Ray driver
(HOST:PORT is the address `ray start --head` prints), sends the compile as a task (pp4/reuse/cluster/
node.py: the command as it runs in the fixed execution root, its environment, and the extension's
source tree as content-addressed blobs put into Ray's object store, which a node fetches only where
it lacks them), and waits a bounded time. The node compiles in the same root, observed, and sends
back the object and every observation. Before anything is written, every observation must hold on
this machine (pp4/reuse/pathstates.py): a node that compiled against other bytes (another torch,
another header, another compiler) is caught and its object never used. Then the wrapper writes the
object and stores the compile as it stores a local one: the same key, record and event, plus the
node it ran on.

Whenever the cluster cannot give a checked object (pp4's Ray extra missing, the cluster unreachable
or lost, a node refusing, dying or slower than the timeout, a compile error there), run() says why
once and returns None, and the wrapper compiles here. A cluster found unreachable is left alone by
every process of the build for backoff.RETRY_S.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import attrs

from pp4 import backoff
from pp4 import statedir
from pp4.execution.cluster import DEFAULT_TIMEOUT_S, ClusterError, connect
from pp4.files import write_whole
from pp4.paths import LOCK_DIR, source_tree
from pp4.reuse import pathstates

TASK_RETRIES = 2  # a task whose worker or node dies is run again elsewhere, this many times


@attrs.frozen
class Done:
    node: str
    duration_s: float
    observations: list  # [path, state] pairs, every one checked here
    time_macros: tuple  # (name, where): the time macros its compile could expand (pp4/reuse/timemacros.py)


def _remote_compile():
    import ray

    from pp4.reuse.cluster.node import compile_task

    @ray.remote(num_cpus=1, max_retries=TASK_RETRIES)
    def compile_remote(task: dict, blobs: dict):
        return compile_task(task, lambda sha: ray.get(blobs[sha]))

    return compile_remote


class ClusterExecutor:
    def __init__(self, settings: dict, state_dir: str):
        self.address = settings["address"]
        self.timeout_s = float(settings.get("timeout_s") or DEFAULT_TIMEOUT_S)
        self.toolchain = settings["toolchain"]  # {"cuda_release": "13.0" | None, "path": prefix}
        self.folder = statedir.part(state_dir, statedir.CLUSTER)

    @classmethod
    def from_config(cls, settings: dict | None, state_dir: str) -> "ClusterExecutor | None":
        if not settings or backoff.recently_down(statedir.part(state_dir, statedir.CLUSTER)):
            return None
        return cls(settings, state_dir)

    def warn(self, message: str) -> None:
        print(f"pp4.reuse: warning: {message}; compiling here", file=sys.stderr)

    def down(self, reason: str) -> None:
        if backoff.mark_down(self.folder, reason):
            print(f"pp4.reuse: warning: {reason}; compiling here (the cluster is tried again after "
                  f"{backoff.RETRY_S:.0f} s)", file=sys.stderr)

    def run(self, action, root: str | None, limits, states) -> Done | None:
        """Compile on the cluster and write the checked object; None: not done there (said why),
        compile here. action: the wrapper's Action; states: this machine's (pathstates.States)."""
        if root is None or action.root is None:
            return None  # a source outside every extension tree, or no fixed root here: nothing to send
        try:
            connect(self.address)
        except ClusterError as e:
            self.down(str(e))
            return None
        except Exception as e:  # noqa: BLE001 - Ray's own errors: the cluster cannot be used now
            self.down(f"cluster {self.address}: {type(e).__name__}: {e}")
            return None
        import ray

        args = action.args
        tree = self._tree(root, args.source, states.hasher.sha256)
        task = {
            "command": list(action.command), "env": dict(action.env),
            "tree": tree, "tree_id": hashlib.sha256(json.dumps(tree).encode()).hexdigest(), "root": root,
            "cuda_release": self.toolchain["cuda_release"], "toolchain_path": self.toolchain["path"],
            "lock_text": self._lock_text(),
            "nice": limits.nice, "address_space": limits.address_space, "nvcc_threads": limits.nvcc_threads,
        }
        try:
            blobs = {sha: ray.put(Path(root, rel).read_bytes()) for rel, sha in tree}
            ref = _remote_compile().remote(task, blobs)
        except Exception as e:  # noqa: BLE001
            self.down(f"cluster {self.address}: cannot send the compile: {type(e).__name__}: {e}")
            return None
        try:
            result = ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - the cluster went away meanwhile: nothing left to cancel
                pass
            self.warn(f"no cluster node finished {args.output} within {self.timeout_s:.0f} s")
            return None
        except (ray.exceptions.RayError, ConnectionError) as e:
            self.warn(f"the cluster lost the compile of {args.output} ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
            return None
        if result.get("refused"):
            self.warn(f"cluster node {result['node']} refused {args.output}: {result['refused']}")
            return None
        if result["returncode"] != 0:
            self.warn(f"the compile of {args.output} failed on cluster node {result['node']}")
            return None
        if result.get("unobserved"):
            self.warn(f"cluster node {result['node']} could not vouch for its compile of {args.output}: "
                      f"{result['unobserved']}")
            return None
        changed = pathstates.differences(result["observations"], action.root.real, states)
        if changed:
            self.warn(f"cluster node {result['node']} compiled {args.output} against another machine than this "
                      f"one ({changed[0]}); its object is not used")
            return None
        if result["output"]:
            sys.stderr.write(result["output"])
        write_whole(Path(args.output), result["object"])
        return Done(result["node"], result["duration_s"], result["observations"],
                    tuple(tuple(f) if isinstance(f, list) else (str(f), "its node's gcc -Wdate-time")
                          for f in result.get("time_macros", ())))  # a bare name: a node of an earlier pp4

    def _lock_text(self) -> str | None:
        release = self.toolchain["cuda_release"]
        return None if release is None else (LOCK_DIR / f"cuda-{release}.toml").read_text()

    def _tree(self, root: str, source: str, sha256) -> list[list[str]]:
        """The extension's sources and headers as (path below root, sha256), sorted."""
        out = []
        for p in source_tree(Path(root), [Path(source).absolute()]):
            rel = os.path.relpath(p, root)
            if not rel.startswith(".."):
                out.append([rel, sha256(str(p))])
        return out
