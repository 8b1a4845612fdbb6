"""How pp4 reaches a Ray cluster that runs compiles (`--executor ray://HOST:PORT`): the address,
whether it answers, a driver connection that ships pp4's own code to the workers, its CPUs.
configure asks it for -j; pp4/reuse/cluster/ sends the compiles."""

from __future__ import annotations

import os
import socket
from pathlib import Path

DEFAULT_TIMEOUT_S = 3600.0  # a node gets this long for one compile (EXL3's longest: 266 s on the H200)
CONNECT_TIMEOUT_S = 5.0
PP4_PACKAGE = Path(__file__).resolve().parent.parent


class ClusterError(Exception):
    pass


def parse_address(text: str) -> str:
    """HOST:PORT of `--executor ray://HOST:PORT`; `ray` alone: $RAY_ADDRESS. ClusterError otherwise."""
    if text == "ray":
        address = os.environ.get("RAY_ADDRESS", "")
        if not address:
            raise ClusterError("--executor ray: no cluster address: pass --executor ray://HOST:PORT (the address "
                               "`ray start --head` prints) or set RAY_ADDRESS")
    elif text.startswith("ray://"):
        address = text[len("ray://"):]
    else:
        raise ClusterError(f"--executor {text}: not a Ray cluster; use ray://HOST:PORT (the address `ray start "
                           "--head` prints)")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"--executor {text}: {address!r} is not HOST:PORT")
    return address


def reachable(address: str) -> str | None:
    """None when something answers at the cluster's address, else why not. (ray.init itself waits
    minutes for a dead address.)"""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            return None
    except OSError as e:
        return f"cluster {address} does not answer ({e.strerror or e})"


def connect(address: str) -> None:
    """This process as a driver of the cluster, with pp4's own code shipped to its workers."""
    try:
        import ray
    except ImportError:
        raise ClusterError("the Ray client is not installed (pip install 'pp4[ray]')") from None
    problem = reachable(address)
    if problem:
        raise ClusterError(problem)
    if not ray.is_initialized():
        ray.init(address=address, namespace="pp4", logging_level="ERROR", log_to_driver=False,
                 configure_logging=False, runtime_env={"py_modules": [str(PP4_PACKAGE)]})


def cluster_cpus(address: str) -> int:
    """The cluster's CPUs, for configure's compile pool."""
    connect(address)
    import ray

    return int(ray.cluster_resources().get("CPU", 0))
