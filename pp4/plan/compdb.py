"""Filter `ninja -t compdb` output into a compile_commands.json that clangd can use.

Ninja records the launcher in front of each compile (`test -e ... || python -S -I .../pp4/reuse/client.py
CONFIG ... --`, or `python -m pp4.reuse CONFIG ... --`); clangd needs the compiler first, so each
command is cut to what follows the launcher's `--`.
"""

from __future__ import annotations

import json
import shlex
import sys

from pp4 import interrupt


def strip_launcher(command: str) -> str:
    args = shlex.split(command)
    if "--" not in args:
        return command
    client = any(a.endswith("/pp4/reuse/client.py") for a in args)
    module = "-m" in args and args.index("-m") + 1 < len(args) and args[args.index("-m") + 1] == "pp4.reuse"
    return shlex.join(args[args.index("--") + 1:]) if client or module else command


@interrupt.command("pp4.plan.compdb")
def main() -> int:
    entries = json.load(sys.stdin)
    for e in entries:
        if "command" in e:
            e["command"] = strip_launcher(e["command"])
    json.dump(entries, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
