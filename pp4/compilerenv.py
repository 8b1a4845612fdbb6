"""The environment every nvcc and host-compiler process runs in.

nvcc reads NVCC_PREPEND_FLAGS / NVCC_APPEND_FLAGS / NVCC_CCBIN from the environment, which would
make a command line lie about what it compiles, so they are removed. Temporary files go to a folder
pp4 owns. No GPU is visible: a compile never needs one, and must not create a CUDA context.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# Variables that change what nvcc does without appearing on its command line.
HIDDEN_NVCC_INPUTS = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN")
# Variables that point at some other CUDA; nvcc itself ignores them, but tools we call might not.
FOREIGN_CUDA = ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDAToolkit_ROOT")


def compiler_env(tmpdir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    for name in HIDDEN_NVCC_INPUTS + FOREIGN_CUDA:
        env.pop(name, None)
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["TMPDIR"] = str(tmpdir)
    return env


def host_compiler() -> Path | None:
    """The C++ compiler nvcc will call (it runs the first g++/gcc on PATH unless -ccbin says otherwise)."""
    found = shutil.which("g++") or shutil.which("c++")
    return Path(found).resolve() if found else None
