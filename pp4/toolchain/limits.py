"""The resource limits every compile and link runs under, chosen at configure time.

configure writes them into build/pp4.json; pp4/execution/limits.py applies them to every compile and link. They
are kept out of the commands, so changing a limit rebuilds nothing and changes no action key.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs


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


def cpu_text(cpus) -> str:
    """(0, 1, 2, 3, 8) -> "0-3,8": parse_cpu_list's notation."""
    cpus = sorted(cpus)
    runs, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            runs.append(f"{start}-{c}" if start != c else f"{c}")
            start = None
    return ",".join(runs)


def cpus_not_allowed(cpus, allowed) -> str | None:
    """Why a process allowed on `allowed` cannot be held to `cpus`, with the fix; None when it can.
    A CPU outside the allowed set (not on this machine, or outside the cgroup's cpuset) makes the
    kernel refuse sched_setaffinity, or quietly narrows it: either way not what --cpus asked."""
    outside = sorted(set(cpus) - set(allowed))
    if not outside:
        return None
    return (f"--cpus {cpu_text(cpus)}: CPU(s) {cpu_text(outside)} are not among those this machine lets pp4 run on "
            f"({cpu_text(allowed)}); re-run configure with --cpus within {cpu_text(allowed)}, or without --cpus "
            "to use them all")
