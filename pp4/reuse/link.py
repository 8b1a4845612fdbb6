"""Run one link as build.ninja does: in the fixed execution root, observed, under the limits, and
record what it observed; or restore the module from the store where that link ran before.

    python -m pp4.reuse.link CONFIG [--env NAME=VALUE]... -- COMMAND...

A link is an action like a compile (pp4/reuse/wrapper.py): its manifest key is the command as it
runs in the root and its environment, its entries what earlier links of that command observed (the
objects' bytes, every library the linker resolved and every place it looked and found nothing, its
programs). Where an entry's every observation holds now and builders on the trust list signed it,
the stored module is put in place (the mode a link gives it) instead of linking: the same inputs,
in the same root, give the same bytes. A link that ran is stored so, signed, in both tiers.

Every file the link read (the objects, each `-l` library as the linker resolved it, linker
scripts, the linker's own programs) goes into the dependency file `<output>.d`, so ninja links
again when any of them changes. Everything it observed, what it looked for and did not find
included (a library in an earlier -L folder, a linker script), goes into its record,
build/.pp4/links/<module>.json (pp4/build/modules.py), with the module's sha256 and file identity:
the certificate lists it, `ninja certify` checks it, the pin is written only for the module it
names, and the check before every ninja run (pp4/reuse/recheck.py) links again a module whose
observations no longer hold, or whose bytes are not what the link made, which ninja's mtimes
cannot show. The command runs with exactly the --env variables
(pp4/toolchain/compilerenv.py).
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import attrs

from pp4 import interrupt, paths
from pp4.build import events
from pp4.build.config import ReuseConfig
from pp4.build.modules import LinkRecord, module_made, write_link
from pp4.execution import depfile
from pp4.execution.root import Root
from pp4.execution.run import run
from pp4.reuse import observations, pathstates
from pp4.reuse.actionkey import FileHasher
from pp4.store.manifests import ManifestEntry
from pp4.toolchain.compilerenv import parse_env_args
from pp4.toolchain.limits import Limits


def to_real(record: LinkRecord):
    """Where the paths a link record observed are on this machine."""
    return Root.from_mounts(record.mounts).real if record.mounts else (lambda p: p)


def output_of(argv: list[str]) -> str | None:
    return argv[argv.index("-o") + 1] if "-o" in argv[:-1] else None


@interrupt.command("pp4.reuse.link")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    action_env, rest = parse_env_args(argv[1:])
    if not argv or len(rest) < 2 or rest[0] != "--":
        print("usage: python -m pp4.reuse.link CONFIG [--env NAME=VALUE]... -- COMMAND...", file=sys.stderr)
        return 2
    cfg = ReuseConfig.load(argv[0])
    events.mark_run(cfg.state_dir)  # where this run starts in ninja's log, for the report
    limits = Limits.from_dict(cfg.limits)
    state_dir = cfg.state_dir
    root = Root.make(os.getcwd(), cfg.places, build=cfg.builddir())
    command = rest[1:]
    out = output_of(command)
    linker = Linker.open(cfg, root, command, action_env, out)
    if linker is not None and linker.restore():
        problem = unloadable(out)  # stored by a pp4 that did not check: refused as a link would be
        if problem is None:
            return 0
        os.unlink(out)
        print(f"pp4.reuse.link: error: {problem}", file=sys.stderr)
        return 1
    ran = run(command, action_env, limits, Path(limits.tmpdir or "/tmp") / "pp4-runs", root, compile=False)
    sys.stderr.buffer.write(ran.root.shown(ran.stderr) if ran.root is not None else ran.stderr)
    if ran.returncode != 0:
        return ran.returncode
    if out is None:
        return 0
    problem = unloadable(out)
    if problem is not None:  # never stored, recorded or certified: the module is removed
        os.unlink(out)
        print(f"pp4.reuse.link: error: {problem}", file=sys.stderr)
        return 1
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
        hasher = linker.reuser.hasher if linker is not None else FileHasher(paths.file_hashes())
        pairs, why = observations.from_run(ran, seen_as, pathstates.States(hasher), settled=inputs)
        sha, identity = module_made(out)
        stored = (linker.store(pairs, ran.seconds, sha) if linker is not None and why is None and ran.root is not None
                  else None)
        hasher.save()
        write_link(state_dir, LinkRecord(os.path.abspath(out), ran.command, ran.root.mounts if ran.root else None,
                                         pairs, why, {"action_key": stored} if stored else None, sha, identity))
    return 0


# What a module of relocatable device code needs from its device link (nvcc -dlink): each
# -rdc=true object registers its code through one of these, which only the device link defines.
_CUDA_LINKED_BINARY = b"__cudaRegisterLinkedBinary_"


def unloadable(path: str) -> str | None:
    """Why the shared object a link wrote cannot be loaded, as its dynamic symbols show; None when
    nothing is known against it (or it is not a shared object: a device link's output)."""
    missing = [n for n in undefined_dynamic_symbols(path) if n.startswith(_CUDA_LINKED_BINARY)]
    if not missing:
        return None
    return (f"{path} cannot load: it leaves {missing[0].decode()} undefined ({len(missing)} such), which relocatable "
            "device code (-rdc=true) gets only from a device link; add dlink=True to the CUDAExtension in setup.py "
            "(or `dlink_flags = [\"-dlink\"]` in a spec), or drop -rdc=true")


def _elf_type(path: Path) -> int | None:
    """An ELF file's e_type (1 a relocatable object, 3 a shared object); None for any other file."""
    try:
        with open(path, "rb") as f:
            head = f.read(0x12)
    except OSError:
        return None
    return struct.unpack_from("<H", head, 0x10)[0] if len(head) == 0x12 and head[:4] == b"\x7fELF" else None


def undefined_dynamic_symbols(path: str) -> list[bytes]:
    """The names of an ELF64 little-endian shared object's undefined dynamic symbols (.dynsym
    entries with section index 0), read from its bytes; [] for any other file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    # ELF magic, 64-bit, little-endian, e_type ET_DYN
    if data[:6] != b"\x7fELF\x02\x01" or struct.unpack_from("<H", data, 0x10)[0] != 3:
        return []
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = []
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != 11 or not entsize:  # SHT_DYNSYM
            continue
        strtab_offset = sections[link][4]
        for at in range(offset + entsize, offset + size, entsize):  # entry 0 is the null symbol
            st_name, _, _, st_shndx = struct.unpack_from("<IBBH", data, at)
            if st_shndx == 0:
                end = data.index(b"\0", strtab_offset + st_name)
                names.append(data[strtab_offset + st_name:end])
    return names


@attrs.define
class Linker:
    """The store's side of one link: its key, the lookup, the restore, the keeping."""
    reuser: object  # pp4.reuse.wrapper.Reuser
    root: Root
    command: tuple
    env: dict
    out: str
    mkey: str

    @classmethod
    def open(cls, cfg: ReuseConfig, root: Root | None, command: list[str], env: dict,
             out: str | None) -> "Linker | None":
        """None where links are not reused: no store, no output, or no root (a command that names
        this checkout's folders would be keyed on them)."""
        if not cfg.store or root is None or out is None:
            return None
        from pp4.reuse.wrapper import Reuser

        return cls.for_reuser(Reuser(cfg), root, command, env, out)

    @classmethod
    def for_reuser(cls, reuser, root: Root, command: list[str], env: dict, out: str) -> "Linker | None":
        """The link through a Reuser the caller has (the prepass's); None where its store is off or
        no root can be made here."""
        from pp4.reuse.wrapper import manifest_key

        if reuser.front is None or not reuser.root_works():
            return None
        fixed = tuple(root.command(list(command)))
        return cls(reuser, root, fixed, env, out, manifest_key(("link",) + fixed, env, True))

    def restore(self) -> bool:
        """The module from the store where an earlier link of this command observed what holds now."""
        from pp4.reuse.wrapper import sound_entry

        reuser = self.reuser
        found = reuser.front.find(self.mkey, lambda e: sound_entry(self.mkey, e),
                                  lambda e: reuser.sets.all_match(reuser.store_sets, e.pack, e.input_sets, self.root))
        reuser.note_refusals()
        if found is None:
            return False
        out = Path(self.out)
        problem = reuser.front.materialize(found, out)
        if problem is not None:
            print(f"pp4.reuse: warning: {problem}; linking {self.out} instead", file=sys.stderr)
            return False
        umask = os.umask(0)
        os.umask(umask)
        # what the linker gives a module it writes; nvcc -dlink writes an object (ELF type ET_REL)
        # without execute bits, and a link that reads it observes its mode
        os.chmod(out, (0o666 if _elf_type(out) == 1 else 0o777) & ~umask)
        entry = found.entry
        sids = entry.input_sets  # one folder each: no file is in two
        depfile.write(self.out + ".d", self.out,
                      bodies=[reuser.sets.depfile_body(reuser.store_sets, entry.pack, sid, self.root) for sid in sids])
        pairs = [pair for sid in sids for pair in reuser.sets.load(reuser.store_sets, entry.pack, sid) or []]
        sha, identity = module_made(out)  # after the chmod, which moves its ctime
        write_link(reuser.cfg.state_dir, LinkRecord(os.path.abspath(self.out), self.command, self.root.mounts,
                                                    sorted(pairs), None,
                                                    {"action_key": found.entry.action_key, "tier": found.tier,
                                                     "signers": list(found.signers)}, sha, identity))
        reuser.hasher.save()
        return True

    def store(self, pairs: list, seconds: float, sha256: str) -> str | None:
        """Keep the module (whose bytes hash to sha256) under what its link observed; its action key,
        or None when not kept."""
        from pp4.reuse import inputsets
        from pp4.reuse.wrapper import action_key, sound_entry

        encoded = inputsets.encode_by_folder(pairs)
        sids = sorted(encoded)
        pack = inputsets.pack(encoded)
        akey = action_key(self.mkey, sids)
        payload = {"manifest_key": self.mkey, "command": list(self.command), "env": self.env,
                   "in_root": True, "link": True, "compiled_for": {"output": os.path.abspath(self.out), "cwd": os.getcwd()},
                   "duration_s": round(seconds, 3)}
        kept = self.reuser.front.keep(self.mkey, ManifestEntry(akey, sids, pack.name), pack, self.out,
                                      sha256, payload, sound=lambda e: sound_entry(self.mkey, e))
        return akey if kept.record is not None else None


if __name__ == "__main__":
    sys.exit(main())
