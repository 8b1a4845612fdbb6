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

Not seen: a native option inside a response file or a specs file (their bytes are keyed, but the
CPU is not).
"""

from __future__ import annotations

import hashlib
import os
import re

PREFIX = "native:"
_NATIVE = re.compile(r"^-m(arch|tune|cpu)=native$")


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
    return recorded[len(PREFIX):].rpartition(":")[0].split()
