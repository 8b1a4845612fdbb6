"""The build's resource limits, applied to the process that becomes a compiler or linker.

The limits (CPU list, nice level, address-space cap, nvcc thread count) are chosen at configure time
and read from build/pp4.json, so changing them changes no compile command: ninja rebuilds nothing
for it, and no action key changes. nvcc's --threads only says how many architectures nvcc compiles
at once and does not change its output.

No GPU is visible to a compiler (CUDA_VISIBLE_DEVICES is empty) and nothing here touches CUDA, so a
build never creates a CUDA context. GPU runs guard resident memory instead of address space: CUDA
maps large virtual ranges that an RLIMIT_AS would refuse (docs/configure.md).
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

from pp4.toolchain.limits import Limits


def apply(limits: Limits) -> None:
    """Limit this process; the compiler it becomes, and every child of that, inherits the limits."""
    if limits.cpus:
        os.sched_setaffinity(0, limits.cpus)
    if limits.nice:
        os.nice(limits.nice)
    if limits.address_space:
        resource.setrlimit(resource.RLIMIT_AS, (limits.address_space, limits.address_space))


def command_for(limits: Limits, argv: list[str]) -> list[str]:
    if limits.nvcc_threads and Path(argv[0]).name == "nvcc" and "--threads" not in argv and "-t" not in argv:
        return [argv[0], "--threads", str(limits.nvcc_threads), *argv[1:]]
    return argv
