"""Run one link as build.ninja does: in the fixed execution root, observed, under the limits, and
record what it observed.

    python -m pp4.reuse.link CONFIG [--env NAME=VALUE]... -- COMMAND...

Every file the link read (the objects, each `-l` library as the linker resolved it, linker
scripts, the linker's own programs) goes into the dependency file `<output>.d`, so ninja links
again when any of them changes. Everything it observed, what it looked for and did not find
included (a library in an earlier -L folder, a linker script), goes into its record,
build/.pp4/links/<module>.json: the certificate lists it, `ninja certify` checks it, and the
check before every ninja run (pp4/reuse/recheck.py) links again a module whose observations no
longer hold, which ninja's mtimes cannot show. The command runs with exactly the --env variables
(pp4/toolchain/compilerenv.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import attrs

from pp4 import interrupt, statedir
from pp4.execution import depfile
from pp4.execution.root import Root
from pp4.execution.run import run
from pp4.files import write_whole
from pp4.reuse import observed
from pp4.reuse.actionkey import FileHasher
from pp4.toolchain.compilerenv import parse_env_args
from pp4.toolchain.limits import Limits


@attrs.frozen
class LinkRecord:
    """What one link observed: [path as it saw it, state] pairs (in the root's paths, mounts
    saying where they are here), or why there are none."""
    output: str
    command: tuple[str, ...] = attrs.field(converter=tuple)
    mounts: list | None = attrs.field(hash=False)
    observations: list = attrs.field(hash=False)
    not_observed: str | None = None

    def to_real(self):
        """Where the paths it observed are on this machine."""
        return Root.from_mounts(self.mounts).real if self.mounts else (lambda p: p)


def record_path(state_dir: str | Path, output: str) -> Path:
    return statedir.part(state_dir, statedir.LINKS) / (os.path.abspath(output).replace(os.sep, "__") + ".json")


def read(state_dir: str | Path, output: str) -> LinkRecord | None:
    """A module's link record; None when there is none or it is damaged."""
    try:
        doc = json.loads(record_path(state_dir, output).read_text())
        return LinkRecord(doc["output"], doc["command"], doc["mounts"], doc["observations"], doc.get("not_observed"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write(state_dir: str | Path, record: LinkRecord) -> None:
    write_whole(record_path(state_dir, record.output), json.dumps(attrs.asdict(record), sort_keys=True))


def output_of(argv: list[str]) -> str | None:
    return argv[argv.index("-o") + 1] if "-o" in argv[:-1] else None


@interrupt.command("pp4.reuse.link")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    action_env, rest = parse_env_args(argv[1:])
    if not argv or len(rest) < 2 or rest[0] != "--":
        print("usage: python -m pp4.reuse.link CONFIG [--env NAME=VALUE]... -- COMMAND...", file=sys.stderr)
        return 2
    config = json.loads(Path(argv[0]).read_text())
    limits = Limits.from_dict(config["limits"])
    reuse = config.get("reuse", {})
    state_dir = reuse.get("state_dir")
    root = Root.make(os.getcwd(), reuse.get("relocation") or {}, build=str(Path(state_dir).parent)) if state_dir else None
    command = rest[1:]
    ran = run(command, action_env, limits, Path(limits.tmpdir or "/tmp") / "pp4-runs", root, compile=False)
    sys.stderr.buffer.write(ran.root.shown(ran.stderr) if ran.root is not None else ran.stderr)
    if ran.returncode != 0:
        return ran.returncode
    out = output_of(command)
    if out is None:
        return 0
    if ran.trace is not None:
        files = depfile.files_read(ran)
    else:  # not observed: the link's own inputs at least
        files = [os.path.abspath(a) for a in command[1:] if a.endswith((".o", ".a", ".so")) and os.path.isfile(a)]
    depfile.write(out + ".d", out, files)
    if state_dir:
        fix = ran.root.fixed if ran.root is not None else (lambda p: p)
        seen_as = {os.path.normpath(os.path.join(ran.root.cwd if ran.root else os.getcwd(), fix(os.path.abspath(out))))}
        # The objects it links are this build's own outputs, written just before it started: their
        # times say nothing of a change during the link, and their bytes are observed like any file's.
        inputs = {fix(os.path.abspath(a)) for a in command[1:] if os.path.isfile(a)}
        hasher = FileHasher(statedir.part(state_dir, statedir.HASHES))
        pairs, why = observed.from_run(ran, seen_as, observed.States(hasher), settled=inputs)
        hasher.save()
        write(state_dir, LinkRecord(os.path.abspath(out), ran.command, ran.root.mounts if ran.root else None,
                                    pairs, why))
    return 0


if __name__ == "__main__":
    sys.exit(main())
