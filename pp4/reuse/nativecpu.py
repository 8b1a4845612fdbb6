"""A compile that asks this machine's CPU or GPU is keyed on what the compiler makes of it.

gcc expands `-march=native`, `-mtune=native` and `-mcpu=native` with the `cpuid` instruction, not
by reading a file, so the observer cannot see it; an object built so on one machine and restored on
another (a shared store) could hold instructions that CPU lacks. Which compiles asked is read from
what their programs were started with, not from the command's text (`drivers`): a driver started
with a native option, or whose children's COLLECT_GCC_OPTIONS holds one (a response file, a specs
file, a `CXX` wrapper, `-Xcompiler '-O2 -march=native'`). Each such driver gets one more
observation, on its path:

    native:<flags>:<sha256>

where <flags> are the native options it acted on and <sha256> hashes what `DRIVER -### -E -x c
/dev/null FLAGS` prints here: the options the driver hands cc1, with the CPU's name, feature
switches and cache sizes spelled out. A lookup asks the driver again, so a store shared by
machines whose CPUs the compiler tells apart never hands one's object to the other.

nvcc's `-arch=native` is the same for the GPU: nvcc asks the driver which GPUs are there (and falls
back to its default architecture where none is). An nvcc started with a native architecture
option, or one that opened the GPU driver's files, gets the observation

    native-gpu:<flags>:<sha256>

on its path, <sha256> hashing the architectures `nvcc FLAGS --dryrun -x cu -c /dev/null` hands its
passes here (`-arch=sm_90`, `-arch compute_90`, ...), asked again at every lookup. Any other program
that opens the GPU driver's files makes its compile unstorable.

Out of reach: a program other than a gcc driver that reads the CPU with `cpuid` itself.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex

PREFIX = "native:"
GPU_PREFIX = "native-gpu:"
_NATIVE = re.compile(r"^-m(arch|tune|cpu)=native$")
_GPU_ARCH_OPTIONS = ("-arch", "--gpu-architecture")
# The architectures in nvcc --dryrun's commands for its passes.
_GPU_ARCH_SAID = re.compile(rb"(?:-arch[= ]|--gpu-name[= ]|arch=|code=)((?:compute|sm|lto)_\w+)")


def cpu_flags(words) -> list[str]:
    """The native CPU options among a program's arguments, as the program was started with them."""
    return sorted({w for w in words if _NATIVE.match(w)})


def collect_options(value: str) -> list[str]:
    """The options a gcc driver hands its children in COLLECT_GCC_OPTIONS ('-E' '-march=native' ...):
    its own options after it read response files and specs, so an option found there is one the
    driver acted on however it was given."""
    try:
        return shlex.split(value)
    except ValueError:
        return value.split()


def gpu_flags(argv) -> list[str]:
    """nvcc's native GPU architecture options among its arguments, as `OPTION=native`."""
    found = set()
    for i, arg in enumerate(argv[1:], 1):
        for option in _GPU_ARCH_OPTIONS:
            if arg == f"{option}=native" or (arg == option and i + 1 < len(argv) and argv[i + 1] == "native"):
                found.add(f"{option}=native")
    return sorted(found)


def drivers(trace) -> tuple[dict[str, list[str]], dict[str, list[str]], str | None]:
    """What in a compile asked this machine's CPU or GPU, from what its programs were started with
    (pp4.execution.observe.Trace): ({compiler driver: native CPU options it expanded}, {nvcc: native
    GPU options}, why it cannot be keyed, if it cannot).

    A gcc driver expands -march=native (and -mtune=, -mcpu=) with the cpuid instruction, which no
    filter sees: the option is in the driver's own arguments, or, when it came from a response
    file, a specs file or a wrapper, in the COLLECT_GCC_OPTIONS it hands its children (its options
    as it read them), whoever started it and however it was spelled. nvcc asks the GPU driver
    (/dev/nvidia*, /proc/driver/nvidia) for -arch=native; another program that asks it is asking
    something pp4 cannot key."""
    cpu: dict[str, set[str]] = {}
    gpu: dict[str, set[str]] = {}
    for e in trace.execs:
        if flags := cpu_flags(e.argv[1:]):
            cpu.setdefault(e.program, set()).update(flags)
        options = e.getenv("COLLECT_GCC_OPTIONS")
        if options and (flags := cpu_flags(collect_options(options))):
            driver = _parent_program(trace, e)
            if driver is None:
                return {}, {}, (f"{e.program} was started with {' '.join(flags)} in COLLECT_GCC_OPTIONS by a process "
                                "pp4 did not see start, so pp4 cannot ask that compiler what it makes of this CPU")
            cpu.setdefault(driver, set()).update(flags)
        if os.path.basename(e.program) == "nvcc" and (flags := gpu_flags(e.argv)):
            gpu.setdefault(e.program, set()).update(flags)
    for pid in trace.gpu:
        program = trace.program_of(pid)
        if program is None or os.path.basename(program) != "nvcc":
            return {}, {}, (f"{program or 'a process it did not see start'} asked the GPU driver, which pp4 keys only "
                            "for nvcc (by its dry run)")
        gpu.setdefault(program, set()).update(gpu_flags(_argv_of(trace, pid)) or ["-arch=native"])
    return ({k: sorted(v) for k, v in cpu.items()}, {k: sorted(v) for k, v in gpu.items()}, None)


def _parent_program(trace, e) -> str | None:
    """The program e's parent ran when it started e: the last one it started itself before e."""
    found = None
    for other in trace.execs:
        if other is e:
            break
        if other.pid == e.ppid:
            found = other.program
    return found


def _argv_of(trace, pid: int) -> tuple[str, ...]:
    found: tuple[str, ...] = ()
    for e in trace.execs:
        if e.pid == pid:
            found = e.argv
    return found


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
