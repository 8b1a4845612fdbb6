"""Sources and flags: which extensions pp4 knows how to build, and what each one is made of.

An extension is a Python module built from C, C++ and CUDA sources. The worker's P2P and EXL3
decode extensions are spec files it owns (BUILTIN_SPECS); the EXL3 variants come from pinned
upstream sources (pp4.sources.exl3); a user's own extensions are described by a TOML file passed
to configure with --ext-spec (docs/specs.md has the whole format), or read from a project's
setup.py with --setup-py (pp4.sources.setuppy). One module per file:

    name = "myext"                        # the importable module name (TORCH_EXTENSION_NAME)
    sources = ["src/a.cpp", "../shared/b.cu"]   # relative to the spec file's folder, or absolute
    include_dirs = ["include"]
    define_macros = ["NDEBUG", "WITH_CUDA=1"]
    undef_macros = []
    libraries = ["cublas"]                # -l, after torch's
    library_dirs = []                     # -L, relative or absolute
    cxx_flags = ["-O3"]
    cuda_flags = ["-O3", "--use_fast_math"]   # no architecture flags: --arch decides those
    ld_flags = []
    dlink_flags = ["-dlink"]              # a device link (nvcc -dlink) of the objects into the module, as
                                          # BuildExtension's dlink=True; implied by -rdc=true in cuda_flags
    kind = "cuda"                         # or "cpp" (torch's CppExtension: no CUDA libraries)
    flavor = "jit"                        # or "setuptools": flags as BuildExtension gives a setup.py

or several, each in an ``[[extension]]`` table with the same fields.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import attrs

PACKAGE_DIR = Path(__file__).resolve().parent
# The files of a source tree that can change what it compiles to.
# What compiles each kind of source. A .c file goes to the C++ compiler, as torch's BuildExtension
# sends it (its ninja rule runs $cxx on every non-CUDA source).
COMPILED_SUFFIXES = {".c": "cxx", ".cc": "cxx", ".cpp": "cxx", ".cxx": "cxx", ".cu": "cuda"}
KINDS = ("cuda", "cpp")
FLAVORS = ("jit", "setuptools")
SPEC_FIELDS = ("name", "target", "kind", "flavor", "root", "sources", "include_dirs", "define_macros", "undef_macros",
               "libraries", "library_dirs", "cxx_flags", "cuda_flags", "ld_flags", "dlink_flags")
# nvcc options that choose GPU architectures: configure's --arch is the one place that does.
_ARCH_OPTIONS = ("-gencode", "--generate-code", "-arch", "--gpu-architecture", "-code", "--gpu-code")
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MACRO_NAME = _MODULE_NAME


# The extensions this repository ships, by their --ext name: spec files the worker owns
# (pp4_worker/specs/, beside pp4 in a checkout and in site-packages), read as data through
# from_spec, so pp4 never imports the worker's package.
WORKER_SPECS = PACKAGE_DIR.parent.parent / "pp4_worker" / "specs"
BUILTIN_SPECS = {"p2p": WORKER_SPECS / "p2p.toml", "exl3-decode": WORKER_SPECS / "exl3-decode.toml"}


class ExtensionError(Exception):
    """An extension's description is wrong: a missing source, a bad name, a clash."""


@attrs.frozen
class Extension:
    """What one module is built from: the input to the compile plan."""

    target: str  # the ninja target that builds it, e.g. "p2p", "exl3-facc"
    module: str  # importable module name, also TORCH_EXTENSION_NAME
    root: Path  # relative sources, include and library dirs are relative to this; objects are named from it
    sources: tuple[str, ...]
    include_dirs: tuple[str, ...] = ()
    cxx_flags: tuple[str, ...] = ()
    cuda_flags: tuple[str, ...] = ()
    ld_flags: tuple[str, ...] = ()
    # nvcc's flags of the device link (`nvcc OBJECTS -o dlink.o ...`, BuildExtension's nvcc_dlink);
    # empty: no device link
    dlink_flags: tuple[str, ...] = ()
    define_macros: tuple[tuple[str, str | None], ...] = ()  # (NAME, VALUE or None), as setuptools has them
    undef_macros: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()
    library_dirs: tuple[str, ...] = ()
    kind: str = "cuda"  # "cpp": torch's CppExtension, linked without the CUDA libraries
    # Whose flags: "jit" as torch.utils.cpp_extension.load builds, "setuptools" as BuildExtension
    # builds a setup.py (Python's compiler flags, -I rather than -isystem: pp4/plan/modules.py).
    flavor: str = "jit"
    # Files whose change alters the source list or flags: configure re-runs when they change.
    spec_files: tuple[Path, ...] = ()
    # Provenance for the build record: e.g. {"exllamav3": "1.6.5", "sha256": ...}
    provenance: dict = attrs.field(factory=dict, hash=False)

    def source_paths(self) -> list[Path]:
        """Absolute and normalized (no `..`): the paths ninja, the depfiles and the certificate use."""
        return [_under(self.root, s) for s in self.sources]

    def include_paths(self) -> list[Path]:
        return [_under(self.root, d) for d in self.include_dirs]

    def library_paths(self) -> list[Path]:
        return [_under(self.root, d) for d in self.library_dirs]


def _under(root: Path, path: str) -> Path:
    """root/path, with `..` resolved (ninja and the depfiles name files without it). A path with no
    `..` is kept as written (EXL3's include folder "." stays root/., as its keys were made)."""
    joined = root / path
    return Path(os.path.normpath(joined)) if ".." in Path(path).parts else joined


def from_spec(path: Path) -> list[Extension]:
    """The extensions a TOML file describes (see this module's docstring)."""
    path = Path(os.path.abspath(path.expanduser()))  # normalized: a root spelled with .. must still match its sources
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ExtensionError(f"extension spec {path} does not exist") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ExtensionError(f"extension spec {path} is not valid TOML: {e}") from None
    if "extension" in doc:
        tables = doc.pop("extension")
        if doc:
            raise ExtensionError(f"extension spec {path}: with [[extension]] tables, every field belongs in one "
                                 f"of them ({', '.join(sorted(doc))} is outside)")
        if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
            raise ExtensionError(f"extension spec {path}: `extension` must be [[extension]] tables, one per module")
        return [from_fields(t, path.parent, path, f"{path} [[extension]] #{i + 1}") for i, t in enumerate(tables)]
    return [from_fields(doc, path.parent, path, str(path))]


def from_fields(doc: dict, spec_dir: Path, spec_file: Path, where: str, provenance: dict | None = None) -> Extension:
    """One extension from its spec fields, relative paths taken from ``spec_dir``; ``where`` names
    them in messages."""
    unknown = set(doc) - set(SPEC_FIELDS)
    if unknown:
        raise ExtensionError(f"extension spec {where}: unknown field(s) {', '.join(sorted(unknown))} "
                             f"(the fields are {', '.join(SPEC_FIELDS)})")
    if "name" not in doc or "sources" not in doc:
        raise ExtensionError(f"extension spec {where} needs at least `name` and `sources`")

    def strings(key):
        v = doc.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ExtensionError(f"extension spec {where}: `{key}` must be a list of strings")
        return tuple(v)

    sources = strings("sources")
    include_dirs = strings("include_dirs")
    library_dirs = strings("library_dirs")
    if "root" in doc:
        root = given_root(doc["root"], spec_dir, sources, where)
    else:
        root = project_root(spec_dir, [p for p in (*sources, *include_dirs, *library_dirs) if not os.path.isabs(p)])

    def from_root(paths: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(p if os.path.isabs(p) else os.path.relpath(_under(spec_dir, p), root) for p in paths)

    cuda_flags = strings("cuda_flags")
    dlink_flags = strings("dlink_flags")
    if "dlink_flags" not in doc and relocatable(cuda_flags):
        dlink_flags = ("-dlink",)  # relocatable device code links only through a device link
    kind = doc.get("kind", "cuda" if any(s.endswith(".cu") for s in sources) else "cpp")
    if kind not in KINDS:
        raise ExtensionError(f"extension spec {where}: `kind` is {kind!r}; it is \"cuda\" or \"cpp\"")
    flavor = doc.get("flavor", "jit")
    if flavor not in FLAVORS:
        raise ExtensionError(f"extension spec {where}: `flavor` is {flavor!r}; it is \"jit\" (torch's load()) or "
                             "\"setuptools\" (a setup.py under BuildExtension)")
    return Extension(
        target=str(doc.get("target", doc["name"])),
        module=str(doc["name"]),
        root=root,
        sources=from_root(sources),
        include_dirs=from_root(include_dirs),
        cxx_flags=strings("cxx_flags"),
        cuda_flags=cuda_flags,
        ld_flags=strings("ld_flags"),
        dlink_flags=dlink_flags,
        define_macros=tuple(parse_macro(m, where) for m in doc.get("define_macros", [])),
        undef_macros=strings("undef_macros"),
        libraries=strings("libraries"),
        library_dirs=from_root(library_dirs),
        kind=kind,
        flavor=flavor,
        spec_files=(spec_file,),
        provenance=provenance or {},
    )


def relocatable(cuda_flags) -> bool:
    """Whether nvcc flags ask for relocatable device code (-rdc=true, -dc, ...), whose objects need
    a device link before the module can load."""
    flags = list(cuda_flags)
    for i, f in enumerate(flags):
        if f in ("-dc", "--device-c"):
            return True
        for opt in ("-rdc", "--relocatable-device-code"):
            if f.startswith(opt + "="):
                return f.split("=", 1)[1].lower() == "true"
            if f == opt and i + 1 < len(flags):
                return flags[i + 1].lower() == "true"
    return False


def project_root(spec_dir: Path, relative: list[str]) -> Path:
    """The folder an extension's relative paths share with its spec's folder: a spec in proj/pp4/
    naming ../csrc/a.cu has its root at proj/, so objects are named csrc/a.cu.o, the pin covers
    the project's tree and keys stay the same wherever the project is checked out. Never the file
    system's root or the home folder (the pin hashes every source file below the root)."""
    shared = Path(os.path.commonpath([str(spec_dir), *(str(_under(spec_dir, p).parent) for p in relative)]))
    return spec_dir if shared in (Path(shared.anchor), Path.home()) else shared


def given_root(value, spec_dir: Path, sources: tuple[str, ...], where: str) -> Path:
    """A spec's `root`: the folder objects are named from and the pin covers, as a spec written by
    `--write-spec` names its project's folder, so that the spec builds the same commands wherever it
    is kept. Every source must be inside it; never the file system's root or the home folder."""
    if not isinstance(value, str) or not value:
        raise ExtensionError(f"extension spec {where}: `root` must be a folder (a string), not {value!r}")
    root = Path(os.path.normpath(_under(spec_dir, value)))
    if root in (Path(root.anchor), Path.home()):
        raise ExtensionError(f"extension spec {where}: `root` is {root}: pp4 hashes every source below the root; "
                             "name the project's folder")
    outside = [s for s in sources if os.path.relpath(_under(spec_dir, s), root).startswith("..")]
    if outside:
        raise ExtensionError(f"extension spec {where}: the source {outside[0]} is outside `root` ({root}); "
                             "the root must hold every source")
    return root


def parse_macro(item, where: str) -> tuple[str, str | None]:
    """"NAME", "NAME=VALUE" or [NAME, VALUE] (setuptools' define_macros pairs)."""
    if isinstance(item, str):
        name, eq, value = item.partition("=")
        pair = (name, value if eq else None)
    elif isinstance(item, list) and len(item) in (1, 2) and all(isinstance(x, str) for x in item):
        pair = (item[0], item[1] if len(item) == 2 else None)
    else:
        raise ExtensionError(f"extension spec {where}: a define_macros entry is \"NAME\", \"NAME=VALUE\" or "
                             f"[\"NAME\", \"VALUE\"], not {item!r}")
    if not _MACRO_NAME.match(pair[0]):
        raise ExtensionError(f"extension spec {where}: {pair[0]!r} is not a macro name")
    return pair


def architecture_flags(flags) -> list[str]:
    """The flags (with their values) that choose GPU architectures."""
    return without_architecture_flags(flags)[1]


def without_architecture_flags(flags) -> tuple[tuple[str, ...], list[str]]:
    """(the flags without those that choose GPU architectures, the removed ones)."""
    kept, removed, flags, i = [], [], list(flags), 0
    while i < len(flags):
        name = flags[i].split("=", 1)[0]
        if name in _ARCH_OPTIONS:
            takes_value = "=" not in flags[i] and i + 1 < len(flags)
            removed.append(" ".join(flags[i:i + 1 + takes_value]))
            i += 1 + takes_value
        else:
            kept.append(flags[i])
            i += 1
    return tuple(kept), removed


def validate(extensions: list[Extension]) -> None:
    """Everything that would otherwise fail late, deep in a compile or at import time."""
    seen_modules: dict[str, str] = {}
    seen_targets: set[str] = set()
    projects: dict[str, str] = {}  # a project's wheel target -> its setup.py
    taken = {n for e in extensions for n in (e.target, f"wheel-{e.target}")} | RESERVED_TARGETS
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
        if ext.kind not in KINDS:
            raise ExtensionError(f"extension {ext.target}: kind {ext.kind!r} is neither cuda nor cpp")
        for src in ext.source_paths():
            language = COMPILED_SUFFIXES.get(src.suffix)
            if language is None:
                raise ExtensionError(f"extension {_named(ext)}: {src} is not a source pp4 compiles "
                                     "(C .c, C++ .cpp/.cc/.cxx, CUDA .cu)")
            if language == "cuda" and ext.kind == "cpp":
                raise ExtensionError(f"extension {_named(ext)}: {src} is CUDA, but the extension is kind \"cpp\" "
                                     "(torch's CppExtension); make it kind \"cuda\"")
            try:
                with open(src, "rb") as f:
                    f.read(1)
            except FileNotFoundError:
                raise ExtensionError(f"extension {_named(ext)}: source {src} does not exist") from None
            except PermissionError:
                raise ExtensionError(f"extension {_named(ext)}: source {src} is not readable (check its permissions)") from None
            except IsADirectoryError:
                raise ExtensionError(f"extension {_named(ext)}: source {src} is a directory, not a file; "
                                     "list the source files themselves") from None
            except OSError as e:
                raise ExtensionError(f"extension {_named(ext)}: source {src} cannot be read ({e.strerror})") from None
        project = project_wheel_target(ext)
        if project and project in taken:
            raise ExtensionError(f"{ext.provenance['setup.py']}: its project's wheel target {project!r} is also the "
                                 "name of an extension's target or wheel; rename that extension's target")
        if project and projects.setdefault(project, ext.provenance["setup.py"]) != ext.provenance["setup.py"]:
            raise ExtensionError(f"{projects[project]} and {ext.provenance['setup.py']} both name their project "
                                 f"{ext.provenance.get('project')!r}: configure one of them at a time")
        duplicates = sorted({str(p) for p in ext.source_paths() if ext.source_paths().count(p) > 1})
        if duplicates:
            raise ExtensionError(f"extension {_named(ext)}: {duplicates[0]} is listed twice")
        arch = architecture_flags(ext.cuda_flags)
        if arch:
            raise ExtensionError(
                f"extension {_named(ext)}: cuda_flags choose GPU architectures ({', '.join(arch)}); pp4 builds for "
                "the architectures configure's --arch names (repeat it for several, e.g. --arch 8.0 --arch 9.0): "
                "remove them from cuda_flags")
        cuda_sources = [src for src in ext.source_paths() if src.suffix == ".cu"]
        if cuda_sources:  # g++ takes such paths as they are; nvcc does not
            for path in [*cuda_sources, *ext.include_paths()]:
                if "$" in str(path):
                    raise ExtensionError(
                        f"extension {ext.target}: the path {path} contains a `$`, which nvcc expands as a shell "
                        "variable when it runs its sub-tools (the compile would fail on a file that does not "
                        "exist); move or rename the folder to a path without `$`")
        for inc in ext.include_paths():
            if not inc.is_dir():
                raise ExtensionError(f"extension {_named(ext)}: include directory {inc} does not exist")
        for lib in ext.library_paths():
            if not lib.is_dir():
                raise ExtensionError(f"extension {_named(ext)}: library directory {lib} does not exist")


def project_wheel_target(ext: Extension) -> str | None:
    """`ninja wheel-PROJECT`: the wheel of the setup.py project ext was read from (the project's
    distribution name as pip normalizes it), or None for an extension not read from a setup.py."""
    setup_py, name = ext.provenance.get("setup.py"), ext.provenance.get("project")
    if not setup_py:
        return None
    return "wheel-" + re.sub(r"[-_.]+", "-", name or Path(setup_py).parent.name).lower()


def _named(ext: Extension) -> str:
    """The target, and the spec file it came from when a user's TOML file describes it."""
    specs = [str(f) for f in ext.spec_files if f.suffix == ".toml" or f.name == "setup.py"]
    return f"{ext.target} ({specs[0]})" if specs else ext.target


# build.ninja's own targets; "built" too, whose wheel target would be `wheel-built`.
RESERVED_TARGETS = {"all", "toolchain", "certify", "compdb", "build.ninja", "clean", "wheel", "wheel-built", "built", "report"}
