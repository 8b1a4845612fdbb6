"""Sources and flags: which extensions pp4 knows how to build, and what each one is made of.

An extension is a Python module built from C++ and CUDA sources. pp4 ships the P2P extension; the
EXL3 variants come from pinned upstream sources (pp4.exl3); a user's own extension is described by
a small TOML file passed to configure with --ext-spec:

    name = "myext"            # the importable module name (TORCH_EXTENSION_NAME)
    sources = ["src/a.cpp", "src/b.cu"]   # relative to the spec file's folder
    include_dirs = ["include"]            # optional, relative too
    cxx_flags = ["-O3"]                   # optional
    cuda_flags = ["-O3", "--use_fast_math"]  # optional
    ld_flags = []                         # optional
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import attrs

PACKAGE_DIR = Path(__file__).resolve().parent
# The files of a source tree that can change what it compiles to.
SOURCE_SUFFIXES = {".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hh", ".hpp", ".hxx", ".inl", ".inc"}
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ExtensionError(Exception):
    """An extension's description is wrong: a missing source, a bad name, a clash."""


@attrs.frozen
class Extension:
    """What one module is built from: the input to the compile plan."""

    target: str  # the ninja target that builds it, e.g. "p2p", "exl3-facc"
    module: str  # importable module name, also TORCH_EXTENSION_NAME
    root: Path  # sources and include dirs are relative to this
    sources: tuple[str, ...]
    include_dirs: tuple[str, ...] = ()
    cxx_flags: tuple[str, ...] = ()
    cuda_flags: tuple[str, ...] = ()
    ld_flags: tuple[str, ...] = ()
    # Files whose change alters the source list or flags: configure re-runs when they change.
    spec_files: tuple[Path, ...] = ()
    # Defines whose value may differ between two reusable compiles when no input mentions them
    # (the module name, the pybind11 internals id): see docs/reuse.md.
    erasable_defines: tuple[str, ...] = ("TORCH_EXTENSION_NAME",)
    # Provenance for the build record: e.g. {"exllamav3": "1.6.5", "sha256": ...}
    provenance: dict = attrs.field(factory=dict, hash=False)

    def source_paths(self) -> list[Path]:
        return [self.root / s for s in self.sources]


def p2p() -> Extension:
    """pp4's own transport extension: peer access, peer copies, CUDA IPC handles."""
    root = PACKAGE_DIR / "ext" / "p2p"
    return Extension(
        target="p2p",
        module="pp4_p2p",
        root=root,
        sources=("p2p.cu", "bindings.cpp"),
        cxx_flags=("-O2",),
        cuda_flags=("-O2",),
        spec_files=(Path(__file__).resolve(),),
    )


def from_spec(path: Path) -> Extension:
    """A user's extension described by a TOML file (see this module's docstring)."""
    path = Path(os.path.abspath(path.expanduser()))  # normalized: a root spelled with .. must still match its sources
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ExtensionError(f"extension spec {path} does not exist") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ExtensionError(f"extension spec {path} is not valid TOML: {e}") from None
    unknown = set(doc) - {"name", "target", "sources", "include_dirs", "cxx_flags", "cuda_flags", "ld_flags"}
    if unknown:
        raise ExtensionError(f"extension spec {path}: unknown field(s) {', '.join(sorted(unknown))}")
    if "name" not in doc or "sources" not in doc:
        raise ExtensionError(f"extension spec {path} needs at least `name` and `sources`")

    def strings(key):
        v = doc.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ExtensionError(f"extension spec {path}: `{key}` must be a list of strings")
        return tuple(v)

    return Extension(
        target=str(doc.get("target", doc["name"])),
        module=str(doc["name"]),
        root=path.parent,
        sources=strings("sources"),
        include_dirs=strings("include_dirs"),
        cxx_flags=strings("cxx_flags"),
        cuda_flags=strings("cuda_flags"),
        ld_flags=strings("ld_flags"),
        spec_files=(path,),
    )


def validate(extensions: list[Extension]) -> None:
    """Everything that would otherwise fail late, deep in a compile or at import time."""
    seen_modules: dict[str, str] = {}
    seen_targets: set[str] = set()
    for ext in extensions:
        if not _MODULE_NAME.match(ext.module):
            raise ExtensionError(
                f"extension {ext.target}: module name {ext.module!r} is not a Python identifier "
                "(letters, digits and _ only, not starting with a digit)"
            )
        if ext.module in seen_modules:
            raise ExtensionError(
                f"extensions {seen_modules[ext.module]} and {_named(ext)} both build the module {ext.module!r}: "
                "two modules of one name cannot be imported into one process. Give one of them another name."
            )
        if ext.target in seen_targets or ext.target in RESERVED_TARGETS:
            raise ExtensionError(f"extension target name {ext.target!r} is used twice or is reserved")
        seen_modules[ext.module] = _named(ext)
        seen_targets.add(ext.target)
        if not ext.sources:
            raise ExtensionError(f"extension {ext.target} has no sources")
        for src in ext.source_paths():
            if src.suffix not in (".cpp", ".cc", ".cxx", ".cu"):
                raise ExtensionError(f"extension {ext.target}: {src} is neither C++ (.cpp/.cc/.cxx) nor CUDA (.cu)")
            try:
                with open(src, "rb") as f:
                    f.read(1)
            except FileNotFoundError:
                raise ExtensionError(f"extension {ext.target}: source {src} does not exist") from None
            except PermissionError:
                raise ExtensionError(f"extension {ext.target}: source {src} is not readable (check its permissions)") from None
            except IsADirectoryError:
                raise ExtensionError(f"extension {ext.target}: source {src} is a directory, not a file; "
                                     "list the source files themselves") from None
            except OSError as e:
                raise ExtensionError(f"extension {ext.target}: source {src} cannot be read ({e.strerror})") from None
        cuda_sources = [src for src in ext.source_paths() if src.suffix == ".cu"]
        if cuda_sources:  # g++ takes such paths as they are; nvcc does not
            for path in [*cuda_sources, *(ext.root / inc for inc in ext.include_dirs)]:
                if "$" in str(path):
                    raise ExtensionError(
                        f"extension {ext.target}: the path {path} contains a `$`, which nvcc expands as a shell "
                        "variable when it runs its sub-tools (the compile would fail on a file that does not "
                        "exist); move or rename the folder to a path without `$`")
        for inc in ext.include_dirs:
            if not (ext.root / inc).is_dir():
                raise ExtensionError(f"extension {ext.target}: include directory {ext.root / inc} does not exist")


def _named(ext: Extension) -> str:
    """The target, and the spec file it came from when a user's TOML file describes it."""
    specs = [str(f) for f in ext.spec_files if f.suffix == ".toml"]
    return f"{ext.target} ({specs[0]})" if specs else ext.target


RESERVED_TARGETS = {"all", "toolchain", "certify", "compdb", "build.ninja", "clean"}


def may_be_shared(source: str | Path) -> bool:
    """Could this unit's object be shared between variants? A cheap look at its own text, for
    scheduling only (the reuse rule decides): no visible use of the module name or pybind11."""
    try:
        text = Path(source).read_bytes()
    except OSError:
        return False
    return not any(w in text for w in (b"TORCH_EXTENSION_NAME", b"pybind11", b"torch/extension.h", b"torch/python.h"))
