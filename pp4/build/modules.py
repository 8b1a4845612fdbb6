"""Each module's records in the build folder: what configure planned for it (`build/<target>/plan.json`)
and what its link observed (`build/.pp4/links/<module>.json`). Their writers and readers go through
here, typed, instead of reading keys of each other's dicts.

The plan is at format 1, which has no "format" key (every pp4 before the build folder had an
owner wrote it so; its bytes are unchanged). The link record is at format 2: format 1 (no "format"
key) did not say what the link made; 2 adds "format", the module's "sha256" as the link wrote or the
store restored it, and its file's "identity" then (dev, inode, size, mtime_ns, ctime_ns: a check that
finds it unchanged need not hash). A later format writes its number, and a reader
refuses a record of another format as config.py refuses a pp4.json: a plan with what to do (re-run
configure, which writes it), a link record by reading as none: nothing then says what the link made,
so the check before ninja decides removes the module and ninja links it again, and its pin is not
written (pp4/certify/pin.py).

    plan.json   {"target", "module", "root", "sources", "objects", "output", "output_abs",
                 "cuda_flags", "cxx_flags", "link_flags", "toolchain": {"prefix", "key", "pinned",
                 "files"}, "provenance"}
    links/*.json {"format": 2, "output", "command", "mounts", "observations", "not_observed", "reuse",
                  "sha256", "identity"}
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs

from pp4 import statedir
from pp4.build.config import BuildFolderError
from pp4.files import sha256_fd, write_if_changed, write_whole

PLAN = "plan.json"
PLAN_FORMAT = 1  # 1: no "format" key
LINK_FORMAT = 2  # 1: no "format" key; 2: "format", "sha256", "identity"


def _format(doc: dict) -> int:
    return doc.get("format", 1)


# -- the plan --------------------------------------------------------------------------------------

@attrs.frozen
class PlanRecord:
    """What configure planned for one module target: its sources, objects, output, flags and
    toolchain (the pin's source key covers the flags, the toolchain and the sources' bytes:
    pp4/certify/pin.py), and where it came from (provenance: a spec, a setup.py)."""
    target: str
    module: str
    root: str  # the extension's source root
    sources: list = attrs.field(hash=False)
    objects: list = attrs.field(hash=False)
    output: str  # the module, as build.ninja names it
    output_abs: str
    cuda_flags: list = attrs.field(hash=False)
    cxx_flags: list = attrs.field(hash=False)
    link_flags: list = attrs.field(hash=False)
    toolchain: dict = attrs.field(hash=False)  # {"prefix", "key", "pinned", "files"}
    provenance: dict = attrs.field(factory=dict, hash=False)

    def to_json(self) -> dict:
        return attrs.asdict(self, recurse=False)

    @property
    def toolchain_prefix(self) -> str:
        return self.toolchain["prefix"]


def plan_path(builddir: str | Path, target: str) -> Path:
    return Path(builddir) / target / PLAN


def load_plan_file(path: str | Path) -> PlanRecord:
    """A plan.json by its path; BuildFolderError where it is missing, damaged or of another format."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise BuildFolderError(f"{path} does not exist: its target is not configured here (run `python configure.py`)") from None
    except (OSError, ValueError) as e:
        raise BuildFolderError(f"{path} cannot be read ({e}): run `python configure.py` again") from None
    found = _format(doc) if isinstance(doc, dict) else None
    if found != PLAN_FORMAT:
        raise BuildFolderError(f"{path} was written by another version of pp4 (format {found}; this pp4 reads "
                               f"format {PLAN_FORMAT}): run `python configure.py` again with the same options "
                               "(build/configure.json records them)")
    names = {f.name for f in attrs.fields(PlanRecord)}
    try:
        return PlanRecord(**{k: v for k, v in doc.items() if k in names})
    except TypeError as e:
        raise BuildFolderError(f"{path} lacks what configure writes ({e}): run `python configure.py` again") from None


def load_plan(builddir: str | Path, target: str) -> PlanRecord:
    return load_plan_file(plan_path(builddir, target))


def write_plan(builddir: str | Path, plan: PlanRecord) -> bool:
    """Write a target's plan where its content changed; whether it did."""
    return write_if_changed(plan_path(builddir, plan.target), json.dumps(plan.to_json(), indent=1, sort_keys=True) + "\n")


# -- the link record -------------------------------------------------------------------------------

@attrs.frozen
class LinkRecord:
    """What one link observed: [path as it saw it, state] pairs (in the root's paths, mounts
    saying where they are here), or why there are none."""
    output: str
    command: tuple[str, ...] = attrs.field(converter=tuple)
    mounts: list | None = attrs.field(hash=False)
    observations: list = attrs.field(hash=False)
    not_observed: str | None = None
    # {"action_key", "tier", "signers"} when the module was restored from the store, not linked;
    # {"action_key"} alone when this link was stored under it
    reuse: dict | None = attrs.field(default=None, hash=False)
    sha256: str | None = None  # the module's, as the link made it (None: not read, a record of no module)
    identity: list | None = attrs.field(default=None, hash=False)  # file_identity() of the module then

    def made(self, path: str | Path) -> str | None:
        """Why the file at path is not the module this link made (None: it is). Its identity first:
        the same file unwritten since, which needs no hashing; its bytes only where that moved (a
        copy, a touch, a write in place all move ctime, which no tool can set back)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as e:
            return f"it cannot be read ({e.strerror})"
        try:
            st = os.fstat(fd)
            if self.identity is not None and list(identity_of(st)) == list(self.identity):
                return None
            sha = sha256_fd(fd, st.st_size)
        finally:
            os.close(fd)
        return None if sha == self.sha256 else f"its sha256 is {sha}, its link made {self.sha256}"


def identity_of(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What says a file is unwritten since: device, inode, size, mtime and ctime, as FileHasher keys files."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def module_made(path: str | Path) -> tuple[str, list]:
    """(sha256, identity) of a module just written: the link record keeps both."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        sha = sha256_fd(fd, st.st_size)
        if identity_of(os.fstat(fd)) != identity_of(st):  # written while read: hash says nothing, identity neither
            return sha, None
        return sha, list(identity_of(st))
    finally:
        os.close(fd)


def pin_path_for(module: str | Path) -> Path:
    """A module's pin file (pp4/certify/pin.py writes it)."""
    module = Path(module)
    return module.with_name(module.name + ".pin.json")


def link_path(state_dir: str | Path, output: str) -> Path:
    return statedir.part(state_dir, statedir.LINKS) / (os.path.abspath(output).replace(os.sep, "__") + ".json")


def read_link(state_dir: str | Path, output: str) -> LinkRecord | None:
    """A module's link record; None when there is none, it is damaged or of another format."""
    try:
        doc = json.loads(link_path(state_dir, output).read_text())
        if _format(doc) != LINK_FORMAT:
            return None
        return LinkRecord(doc["output"], doc["command"], doc["mounts"], doc["observations"], doc.get("not_observed"),
                          doc.get("reuse"), doc["sha256"], doc.get("identity"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_link(state_dir: str | Path, record: LinkRecord) -> None:
    write_whole(link_path(state_dir, record.output),
                json.dumps({"format": LINK_FORMAT, **attrs.asdict(record)}, sort_keys=True))
