"""Run one compile or link under the build's resource limits, then become the compiler.

    python -m pp4.reuse.launch LIMITS.json [--env NAME=VALUE]... -- COMMAND...

The limits (CPU list, nice level, address-space cap, nvcc thread count) are chosen at configure time
and read from a file, so changing them does not change any compile command: ninja does not rebuild
for it, and the action key of the reuse rule stays the same. The command after `--` is exactly what
is compiled; the launcher adds nothing to it except nvcc's --threads, which only says how many
architectures nvcc compiles at once and does not change its output. The command runs in exactly the
environment given by the --env arguments (pp4.compilerenv), plus a temporary folder and no GPU.

No GPU is visible to the compiler (CUDA_VISIBLE_DEVICES is empty) and nothing here touches CUDA, so
a build never creates a CUDA context. GPU runs guard resident memory instead of address space:
CUDA maps large virtual ranges that an RLIMIT_AS would refuse (docs/configure.md).
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

from pp4 import interrupt
from pp4.toolchain.compilerenv import parse_env_args, process_env
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


@interrupt.command("pp4.reuse.launch")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    action_env, rest = parse_env_args(argv[1:])
    if not argv or len(rest) < 2 or rest[0] != "--":
        print("usage: python -m pp4.reuse.launch LIMITS.json [--env NAME=VALUE]... -- COMMAND...", file=sys.stderr)
        return 2
    limits = Limits.from_file(Path(argv[0]))
    command = command_for(limits, rest[1:])
    env = process_env(action_env, Path(limits.tmpdir) if limits.tmpdir else Path(os.environ.get("TMPDIR", "/tmp")))
    if limits.tmpdir:
        Path(limits.tmpdir).mkdir(parents=True, exist_ok=True)
    apply(limits)
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        print(f"pp4.launch: cannot run {command[0]}: {e}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
