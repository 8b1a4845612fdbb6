"""Run one link as build.ninja does: in the fixed execution root, observed, under the limits.

    python -m pp4.execution.launch CONFIG [--env NAME=VALUE]... -- COMMAND...

Every file the link read (the objects, each `-l` library as the linker resolved it, linker
scripts, the linker's own programs) goes into the dependency file `<output>.d`, so ninja links
again when any of them changes. The command runs with exactly the --env variables
(pp4/toolchain/compilerenv.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pp4 import interrupt
from pp4.execution import depfile
from pp4.execution.root import Root
from pp4.execution.run import run
from pp4.toolchain.compilerenv import parse_env_args
from pp4.toolchain.limits import Limits


def output_of(argv: list[str]) -> str | None:
    return argv[argv.index("-o") + 1] if "-o" in argv[:-1] else None


@interrupt.command("pp4.execution.launch")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    action_env, rest = parse_env_args(argv[1:])
    if not argv or len(rest) < 2 or rest[0] != "--":
        print("usage: python -m pp4.execution.launch CONFIG [--env NAME=VALUE]... -- COMMAND...", file=sys.stderr)
        return 2
    config = json.loads(Path(argv[0]).read_text())
    limits = Limits.from_dict(config["limits"])
    reuse = config.get("reuse", {})
    root = Root.make(os.getcwd(), reuse.get("relocation") or {}, build=str(Path(reuse["state_dir"]).parent)) \
        if reuse.get("state_dir") else None
    command = rest[1:]
    ran = run(command, action_env, limits, Path(limits.tmpdir or "/tmp") / "pp4-runs", root, compile=False)
    sys.stderr.buffer.write(ran.root.shown(ran.stderr) if ran.root is not None else ran.stderr)
    if ran.returncode != 0:
        return ran.returncode
    out = output_of(command)
    if out is not None:
        if ran.trace is not None:
            files = depfile.files_read(ran)
        else:  # not observed: the link's own inputs at least
            files = [os.path.abspath(a) for a in command[1:] if a.endswith((".o", ".a", ".so")) and os.path.isfile(a)]
        depfile.write(out + ".d", out, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
