"""Run one compile or link under the build's resource limits, then become the compiler.

    python -m pp4.plan.launch LIMITS.json [--env NAME=VALUE]... -- COMMAND...

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

import json
import os
import resource
import sys
from pathlib import Path

import attrs

from pp4.toolchain.compilerenv import parse_env_args, process_env


@attrs.frozen
class Limits:
    cpus: tuple[int, ...] | None = None  # sched_setaffinity; None leaves the inherited set
    nice: int = 0  # added to the current niceness
    address_space: int | None = None  # bytes, RLIMIT_AS per compile process
    nvcc_threads: int | None = None  # nvcc --threads
    tmpdir: str | None = None  # where nvcc and g++ write their temporary files

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, doc: dict) -> "Limits":
        doc = dict(doc)
        doc["cpus"] = tuple(doc["cpus"]) if doc.get("cpus") is not None else None
        return cls(**doc)

    @classmethod
    def from_file(cls, path: Path) -> "Limits":
        """From a limits file, or from the "limits" part of build/pp4.json."""
        doc = json.loads(path.read_text())
        return cls.from_dict(doc.get("limits", doc))


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


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """"0-3,8,10-11" -> (0, 1, 2, 3, 8, 10, 11), the taskset/cgroup notation."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = part.split("-", 1)
                if int(lo) > int(hi):
                    raise ValueError
                cpus.update(range(int(lo), int(hi) + 1))
            elif part:
                cpus.add(int(part))
    except ValueError:
        raise ValueError(f"{text!r} is not a CPU list: write it like 0-3,8 (ranges and single CPUs)") from None
    if not cpus:
        raise ValueError(f"{text!r} names no CPU")
    return tuple(sorted(cpus))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    action_env, rest = parse_env_args(argv[1:])
    if not argv or len(rest) < 2 or rest[0] != "--":
        print("usage: python -m pp4.plan.launch LIMITS.json [--env NAME=VALUE]... -- COMMAND...", file=sys.stderr)
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
