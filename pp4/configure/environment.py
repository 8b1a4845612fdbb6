"""The environment variables configure folded into the build, kept current: a change to one of them
makes the next `ninja` run configure again, as an edited spec does.

configure takes values from its environment into build.ninja: the toolchain variables of
pp4/toolchain/compilerenv.py (FOLDED), the ones setuptools adds to a setup.py's compiles (CFLAGS,
CPPFLAGS), and every variable a project's setup.py read while it declared its extensions
(pp4/sources/setuppy.py records them). configure writes their values into a stamp file, the
generator edge's input; an edge that runs in every ninja run compares each value with the one
configure saw, in the shell that runs it (no Python start-up: a no-op ninja stays a no-op), and only
where one differs runs this module, which rewrites the stamp (so configure runs) and says which
variable changed. The stamp is rewritten only when its content changes, and its edge has restat.

    python -m pp4.configure.environment STAMP [--output FILE]... NAME...

configure's other outputs (pp4.json, actions.json, each plan) are checked by the same edge: one that
is missing makes configure run again (they are not the generator edge's outputs, see
pp4/plan/ninjafile.py).

Stamp format (JSON): {"format": 1, "values": {NAME: value or null (unset)}}.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

from pp4.files import write_if_changed

FORMAT = 1
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def values(names, env=None) -> dict[str, str | None]:
    env = os.environ if env is None else env
    return {name: env.get(name) for name in sorted(set(names))}


def stamp_text(vals: dict[str, str | None]) -> str:
    return json.dumps({"format": FORMAT, "values": vals}, indent=1, sort_keys=True) + "\n"


def write(stamp: Path, vals: dict[str, str | None]) -> bool:
    """The stamp for these values; True when its content changed."""
    return write_if_changed(Path(stamp), stamp_text(vals))


def shell_test(vals: dict[str, str | None]) -> str | None:
    """A POSIX shell condition true exactly when every variable has its value (unset where None),
    or None where one cannot be said in a shell word on one line (a name that is no shell name, a
    value with a newline): the edge then always asks Python."""
    tests = []
    for name, value in sorted(vals.items()):
        if not _NAME.match(name) or (value is not None and ("\n" in value or "\r" in value)):
            return None
        # ${N+x}${N-} is "" when N is unset and "x" + its value when it is set (empty included).
        tests.append(f'[ "${{{name}+x}}${{{name}-}}" = {shlex.quote("" if value is None else "x" + value)} ]')
    return " && ".join(tests) if tests else "true"


def changes(old: dict, new: dict) -> list[str]:
    return [f"{name} is {_shown(new.get(name))} here but was {_shown(old.get(name))} when configure ran"
            for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]


def _shown(value: str | None) -> str:
    return "unset" if value is None else repr(value)


def main(argv: list[str]) -> int:
    stamp, rest = Path(argv[0]), argv[1:]
    outputs = [rest[i + 1] for i in range(0, len(rest) - 1, 2) if rest[i] == "--output"]
    names = rest[2 * len(outputs):]
    try:
        old = json.loads(stamp.read_text()).get("values")
    except (OSError, ValueError, AttributeError):
        old = None  # no stamp (a deleted build folder): configure runs, nothing to say
    new = values(names)
    missing = [p for p in outputs if not os.path.exists(p)]
    if write(stamp, new) and old is not None:
        for line in changes(old, new):
            print(f"pp4: {line}: configure runs again to take it")
    elif missing:  # same values, an output of configure gone: a newer stamp runs configure
        os.utime(stamp)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
