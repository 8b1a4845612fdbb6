"""Notices a build prints once per ninja run, not once per compile: the toolchain variables set
here that do not reach the compilers (pp4/toolchain/compilerenv.py), and what this machine cannot
do (the fixed root, the observer)."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pp4 import ninjarun, statedir
from pp4.toolchain import compilerenv

if TYPE_CHECKING:
    from pp4.execution.run import Ran


def notify_once(state_dir: str, lines: list[str], tag: str | None = None) -> None:
    """Print notices once per ninja run: the first of its processes to claim the run prints them.
    The toolchain variables set here that do not reach the compilers (pp4/toolchain/compilerenv.py), what
    this machine cannot do (the fixed root, the observer), what the store refused. tag: notices of
    one kind whose text differs between processes, said once a run whatever the text."""
    if not lines:
        return
    run_id = ninjarun.run_id()
    if run_id is not None:
        marks = statedir.part(state_dir, statedir.NOTICES)
        tag = tag or hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]
        try:
            marks.mkdir(parents=True, exist_ok=True)
            for old in marks.iterdir():  # runs that are over
                if not Path("/proc", old.name.split("-")[0]).exists():
                    old.unlink(missing_ok=True)
            os.close(os.open(marks / f"{run_id}-{tag}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        except OSError:
            pass
    for line in lines:
        print(f"pp4: notice: {line}", file=sys.stderr)


def env_notices(folded: dict) -> list[str]:
    return compilerenv.notices(dict(os.environ), folded, "build")


def machine_notices(root_problem: str | None, ran: "Ran") -> list[str]:
    lines = []
    if root_problem or ran.root_problem:
        lines.append(f"compiles run where they are, not in the fixed root (/pp4): {root_problem or ran.root_problem}. Objects then "
                     "name this checkout's folders, so other folders and machines do not share them (docs/reuse.md)")
    if ran.trace_problem:
        lines.append(f"compiles are not observed ({ran.trace_problem}): they still run, but nothing new is stored "
                     "(docs/reuse.md)")
    return lines
