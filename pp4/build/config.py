"""`build/pp4.json`, the build's configuration: the limits, the reuse settings and the compilers
configure chose. configure writes it through write(); everything else reads it through load(),
which refuses a file written by another format version with what to do, instead of reading keys
that mean something else now (or are missing) without a word.

    {"format": 2, "limits": {...}, "reuse": {"store", "state_dir", ...}, "compile": {...}}
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs

from pp4.files import write_if_changed

FORMAT = 2  # 1: no "format" key (every pp4 before the build folder had an owner)
CONFIG = "pp4.json"
ACTIONS = "actions.json"  # every compile and link command (configure.py writes it)


class BuildFolderError(Exception):
    """A build folder's document is missing, damaged or of another format."""


@attrs.frozen
class BuildConfig:
    limits: dict
    reuse: dict
    compile: dict
    path: Path = attrs.field(eq=False)

    @property
    def state_dir(self) -> str:
        return self.reuse["state_dir"]

    @property
    def store(self) -> str | None:
        return self.reuse.get("store")

    def reuse_config(self) -> ReuseConfig:
        """The reuse part, typed; BuildFolderError where it lacks what every configure writes."""
        r, c = self.reuse, self.compile
        try:
            return ReuseConfig(store=r["store"], roots=tuple(sorted(r["roots"], key=len, reverse=True)),
                               state_dir=r["state_dir"], limits=self.limits, compilers=c["compilers"],
                               folded=c.get("folded", {}), remote=r.get("remote"), places=r.get("relocation") or {},
                               executor=r.get("executor"), name_macros=tuple(r.get("name_macros") or ()),
                               trust=r.get("trust") or {}, toolchain=r.get("toolchain"))
        except KeyError as e:
            raise BuildFolderError(f"{self.path} has no {e.args[0]!r}: run `python configure.py` again") from None


@attrs.frozen
class ReuseConfig:
    """What the reuse rule (pp4/reuse/wrapper.py), the link (pp4/reuse/link.py) and the audit read of
    a build's configuration: its "reuse" part, and the limits and compilers' facts they run under."""
    store: str | None  # None: reuse is off, every compile runs
    roots: tuple[str, ...]  # extension source roots, longest first
    state_dir: str
    limits: dict  # the "limits" part, as pp4/toolchain/limits.py's Limits.from_dict reads it
    compilers: dict  # as pp4/toolchain/compilers.py's Compilers.from_dict reads it
    folded: dict  # the toolchain variables configure folded into build.ninja, as it saw them
    remote: dict | None = None  # {"url" (no password), "mode", "ttl"}: the remote tier, if any
    places: dict = attrs.field(factory=dict)  # {"$TORCH": folder, ...}: mounted at fixed paths in the root
    executor: dict | None = None  # {"address", "timeout_s", "toolchain"}: misses compile on a Ray cluster
    name_macros: tuple[str, ...] = ()  # the macros that carry a module's name (pp4/reuse/variants.py)
    # {"keys": [public key lines of configure --trust], "require_signers": N, "signing_key": path}:
    # whose entries this build restores and the key it signs with (pp4/store/signing.py)
    trust: dict = attrs.field(factory=dict)
    toolchain: dict | None = None  # the toolchain's identity: content hashes of nvcc, cicc, ptxas, ...

    @classmethod
    def load(cls, where: str | Path) -> "ReuseConfig":
        """The reuse settings of a build folder, or of the pp4.json file named (BuildFolderError as load's)."""
        return load(where).reuse_config()

    def tmpdir(self) -> Path:
        tmp = self.limits.get("tmpdir")
        return Path(tmp) if tmp else Path(os.environ.get("TMPDIR", "/tmp"))

    def runs_dir(self) -> Path:
        """Where each compile's scratch folder (its temporary folder, its trace) is made."""
        return self.tmpdir() / "pp4-runs"

    def builddir(self) -> str:
        return str(Path(self.state_dir).parent)

    def root_for(self, source: str) -> str | None:
        src = os.path.abspath(source)
        return next((r for r in self.roots if src.startswith(r + os.sep)), None)


def config_path(builddir: str | Path) -> Path:
    return Path(builddir) / CONFIG


def actions_path(builddir: str | Path) -> Path:
    return Path(builddir) / ACTIONS


def load(where: str | Path) -> BuildConfig:
    """The configuration of a build folder, or of the pp4.json file named."""
    path = Path(where)
    if path.is_dir():
        path = config_path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise BuildFolderError(f"{path} does not exist: run `python -m pp4.configure` in the folder build.ninja "
                               "is to be in") from None
    except (OSError, ValueError) as e:
        raise BuildFolderError(f"{path} cannot be read ({e}): run `python -m pp4.configure` again") from None
    found = doc.get("format", 1) if isinstance(doc, dict) else None
    if found != FORMAT:
        raise BuildFolderError(f"{path} was written by another version of pp4 (format {found}; this pp4 reads "
                               f"format {FORMAT}): run `python -m pp4.configure` again with the same options "
                               "(build/configure.json records them)")
    try:
        return BuildConfig(doc["limits"], doc["reuse"], doc["compile"], path)
    except KeyError as e:
        raise BuildFolderError(f"{path} has no {e.args[0]!r}: run `python -m pp4.configure` again") from None


def write(builddir: str | Path, limits: dict, reuse: dict, compile: dict) -> bool:
    """Write the configuration where its content changed; whether it did."""
    doc = {"format": FORMAT, "limits": limits, "reuse": reuse, "compile": compile}
    return write_if_changed(config_path(builddir), json.dumps(doc, indent=1, sort_keys=True) + "\n")


def builddir_of(folder: str | Path = ".") -> Path | None:
    """The build folder of the build configured in folder (its build.ninja's `builddir`), or None
    where there is none."""
    try:
        with open(Path(folder) / "build.ninja") as f:
            for line in f:
                if line.startswith("builddir = "):
                    return Path(folder) / line[len("builddir = "):].strip().replace("$ ", " ").replace("$$", "$")
    except OSError:
        return None
    return None


def of_folder(folder: str | Path = ".") -> BuildConfig | None:
    """The configuration of the build configured in folder (where its build.ninja is, naming its
    build folder), or None where there is none or it cannot be read."""
    builddir = builddir_of(folder)
    try:
        return load(builddir) if builddir is not None else None
    except BuildFolderError:
        return None
