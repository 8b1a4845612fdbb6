"""`-march=native` and its kin: a compile that asks the host compiler for this machine's CPU is
keyed on what the compiler makes of it here.

gcc expands `-march=native`, `-mtune=native` and `-mcpu=native` with the `cpuid` instruction, not
by reading a file, so the observer cannot see it; an object built so on one machine and restored on
another (a shared store) could hold instructions that CPU lacks. Such a compile gets one more
observation, on its host compiler's path:

    native:<flags>:<sha256>

where <flags> are the native options of its command (space-separated) and <sha256> hashes what
`COMPILER -### -E -x c /dev/null FLAGS` prints here: the options the driver hands cc1, with the CPU's
name, feature switches and cache sizes spelled out. A lookup asks the compiler again, so a store
shared by machines whose CPUs the compiler tells apart never hands one's object to the other.

nvcc's `-arch=native` (`--gpu-architecture=native`, or the value as the next argument) is the same
for the GPU: nvcc asks the driver which GPUs are there (and falls back to its default architecture
where none is: a store shared by a machine without a GPU and one with would hand over the wrong
architecture's code). Such a compile gets the observation

    native-gpu:<flags>:<sha256>

on nvcc's path, <sha256> hashing the architectures `nvcc FLAGS --dryrun -x cu -c /dev/null` hands
its passes here (`-arch=sm_90`, `-arch compute_90`, ...), asked again at every lookup.

Not seen: a native option inside a response file, a specs file or an nvcc options file (their bytes
are keyed, but the CPU or GPU is not).
"""

from __future__ import annotations

import hashlib
import os
import re

PREFIX = "native:"
GPU_PREFIX = "native-gpu:"
_NATIVE = re.compile(r"^-m(arch|tune|cpu)=native$")
_GPU_ARCH_OPTIONS = ("-arch", "--gpu-architecture")
# The architectures in nvcc --dryrun's commands for its passes.
_GPU_ARCH_SAID = re.compile(rb"(?:-arch[= ]|--gpu-name[= ]|arch=|code=)((?:compute|sm|lto)_\w+)")


def flags_in(argv) -> list[str]:
    """The native CPU options a command passes, to gcc directly or through nvcc's host-compiler
    options (`-Xcompiler -march=native,-O3`, `--compiler-options=...`): every comma-separated part
    of every argument is looked at."""
    found = set()
    for arg in argv[1:]:
        for spelling in ("-Xcompiler=", "--compiler-options="):
            if arg.startswith(spelling):
                arg = arg[len(spelling):]
        found.update(part for part in arg.split(",") if _NATIVE.match(part))
    return sorted(found)


def gpu_flags_in(argv) -> list[str]:
    """nvcc's native GPU architecture options, as `-arch=native` whichever way they are spelled."""
    if os.path.basename(argv[0]) != "nvcc":
        return []
    found = set()
    for i, arg in enumerate(argv[1:], 1):
        for option in _GPU_ARCH_OPTIONS:
            if arg == f"{option}=native" or (arg == option and i + 1 < len(argv) and argv[i + 1] == "native"):
                found.add(f"{option}=native")
    return sorted(found)


def gpu_state(nvcc: str, flags: list[str]) -> str:
    """The architectures nvcc at this (real) path makes of the flags on this machine."""
    import subprocess

    try:
        proc = subprocess.run([nvcc, *flags, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                              capture_output=True, env={"PATH": os.defpath, "LC_ALL": "C"}, timeout=60)
        said = b" ".join(sorted(set(_GPU_ARCH_SAID.findall(proc.stdout + proc.stderr)))) + b" rc " + \
            str(proc.returncode).encode()
    except (OSError, subprocess.SubprocessError) as e:
        said = f"cannot run: {e}".encode()
    return f"{GPU_PREFIX}{' '.join(flags)}:{hashlib.sha256(said).hexdigest()}"


def host_compiler(argv) -> str | None:
    """The compiler that expands the native options: nvcc's -ccbin, else the command's own."""
    if os.path.basename(argv[0]) != "nvcc":
        return argv[0]
    for i, arg in enumerate(argv):
        if arg in ("-ccbin", "--compiler-bindir") and i + 1 < len(argv):
            return argv[i + 1]
        for spelling in ("-ccbin=", "--compiler-bindir="):
            if arg.startswith(spelling):
                return arg[len(spelling):]
    return None


def state(compiler: str, flags: list[str]) -> str:
    """What the compiler at this (real) path makes of the flags on this machine."""
    import subprocess  # here: most compiles have no native option, and every edge imports this module

    try:
        proc = subprocess.run([compiler, "-###", "-E", "-x", "c", os.devnull, *flags], capture_output=True,
                              env={"PATH": os.defpath, "LC_ALL": "C"}, timeout=60)
        said = proc.stdout + proc.stderr + str(proc.returncode).encode()
    except (OSError, subprocess.SubprocessError) as e:
        said = f"cannot run: {e}".encode()
    return f"{PREFIX}{' '.join(flags)}:{hashlib.sha256(said).hexdigest()}"


def flags_of(recorded: str) -> list[str]:
    prefix = GPU_PREFIX if recorded.startswith(GPU_PREFIX) else PREFIX
    return recorded[len(prefix):].rpartition(":")[0].split()
