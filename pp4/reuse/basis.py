"""The basis of an object: what its compile ran, read and probed, worked out once per process.

The reuse wrapper and prepass compare it with a stored entry before restoring an object; the audit
compares it with the certificate. Both must compute it the same way, so both use this one class:
the identity of the compilers (pp4.compilers), the bytes of the inputs and input sets
(pp4.actionkey.FileHasher, pp4.inputsets) and the probe digest of the include search (pp4.probes).
"""

from __future__ import annotations

import os
from pathlib import Path

from pp4.reuse import inputsets, probes
from pp4.reuse.actionkey import CompileArgs, FileHasher
from pp4.reuse.relocate import NONE, Relocation
from pp4.toolchain.compilers import Compilers, Identifier, Identity


class Basis:
    def __init__(self, compilers: Compilers, state_dir: str | Path, tmpdir: Path, relocation: Relocation = NONE):
        self.compilers = compilers
        self.hasher = FileHasher()
        self.sets = inputsets.SetChecker(self.hasher, relocation)
        self.prober = probes.Prober(self.hasher, Path(state_dir) / "probe-names.json")
        self.identifier = Identifier(Path(state_dir) / "compilers.json", tmpdir)

    def identity(self, args: CompileArgs, env: dict[str, str]) -> Identity:
        """What this compile runs: the content hashes and built-in include folders."""
        return self.identifier.identity(self.compilers, args.language, env)

    def search_path(self, args: CompileArgs, env: dict[str, str], cwd: str | None = None) -> tuple[str, ...]:
        return probes.search_path(list(args.quote_dirs), list(args.plain_dirs), list(args.system_dirs),
                                  list(args.after_dirs), self.identity(args, env).include_dirs, cwd or os.getcwd())

    def probe_digest(self, args: CompileArgs, env: dict[str, str], own: list[tuple[str, str]],
                     set_ids: list[str], sets_dir: str | Path, cwd: str | None = None) -> str:
        """own: (path, path as recorded) of the unit's own inputs; set_ids: its input sets, read
        from sets_dir."""
        sets = [(sid, self.sets.pairs(sets_dir, sid)) for sid in set_ids]
        return self.prober.unit_digest(own, sets, self.search_path(args, env, cwd))

    def save(self) -> None:
        """Keep what was learnt about the compilers for the next process."""
        self.identifier.save()
        self.prober.save()
