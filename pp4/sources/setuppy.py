"""A project's extensions read from its setup.py: ``configure.py --setup-py PATH``.

The setup.py runs in a child Python (the one configure runs under, so it sees the same torch) in
its own folder, as `pip install .` would run it on a CUDA build machine: CUDA_HOME is pp4's
toolchain and its nvcc is first on PATH, TORCH_CUDA_ARCH_LIST and FORCE_CUDA say CUDA is wanted, and
torch.cuda.is_available() answers True. Before it runs, ``setuptools.setup`` and torch's ``CUDAExtension``/``CppExtension``
are replaced by recorders: each extension is recorded with exactly the arguments the project gave
(not torch's additions, which pp4's plan makes itself) and setup() stops the run. Nothing is
built or installed.

What the project's arguments cannot mean in pp4 is refused by name (device linking, prebuilt
objects); architecture flags in its nvcc arguments are dropped with a notice, since configure's
--arch chooses the architectures. The environment variables the project's code read on the way
(`if os.environ.get("MYPROJ_CUDA"): ...`) are recorded (ReadSetup.env_read): configure keeps them,
and a change to one runs configure again (pp4/configure/environment.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs

from pp4.execution import cputime
from pp4.sources.extensions import (
    SPEC_FIELDS, Extension, ExtensionError, from_fields, without_architecture_flags
)

# What a setup.py may use before pp4 stops it, in CPU-seconds of all its processes, never in wall
# time: a machine whose cores all compile, and the nice 19 that `ninja wheel`'s stage runs at, stretch
# a setup.py's wall time without bound and say nothing about the project (issue 55).
SETUP_CPU_LIMIT_S = 300.0
_POLL_S = 0.5  # how often its CPU time is read while it runs
# Extension arguments with no effect on what is compiled or linked.
_IGNORED = {"language", "optional", "depends", "py_limited_api", "export_symbols", "swig_opts"}

# Runs in the child: argv = [setup.py, output.json]. Kept free of pp4 imports (the child's
# sys.path is the project's, not pp4's).
_RECORDER = r'''
import json, os, runpy, sys, traceback

setup_py, out_path = sys.argv[1], sys.argv[2]
records = []
result = {"extensions": records}


class _Stop(BaseException):
    pass


def _absolute(paths):
    paths = [os.fspath(p) for p in (paths or [])]  # setup.py files pass pathlib paths too
    return [p if os.path.isabs(p) else os.path.abspath(p) for p in paths]


def _record(kind, name, sources, kwargs):
    fields = dict(kwargs, name=name, sources=_absolute(sources))
    for key in ("include_dirs", "library_dirs", "runtime_library_dirs"):
        if key in fields:
            fields[key] = _absolute(fields[key])
    fields["define_macros"] = [list(m) for m in fields.get("define_macros") or []]
    return {"kind": kind, "fields": {k: v for k, v in fields.items() if v is not None}}


class _Recorded:
    def __init__(self, record):
        self.pp4_record = record
        self.name = record["fields"]["name"]


def _factory(kind):
    def make(name, sources, *args, **kwargs):
        if args:
            raise TypeError(f"pp4 records {kind} extensions by keyword; {name} passes {len(args)} more positional arguments")
        return _Recorded(_record(kind, name, sources, kwargs))
    return make


def _setup(*args, **kwargs):
    result["setup_called"] = False
    result["project"] = {k: str(kwargs[k]) for k in ("name", "version") if kwargs.get(k) is not None}
    if "name" not in result["project"]:  # declared in pyproject.toml or setup.cfg: setuptools reads them
        try:
            from setuptools.dist import Distribution
            dist = Distribution()
            dist.parse_config_files()
            if dist.get_name() not in (None, "", "UNKNOWN"):
                result["project"]["name"] = dist.get_name()
        except Exception:
            pass
    build_ext = (kwargs.get("cmdclass") or {}).get("build_ext")
    if isinstance(build_ext, type):  # a project's own build_ext (a CMake build) builds what BuildExtension would not
        bases = [c.__qualname__ for c in build_ext.__mro__]
        if "BuildExtension" not in bases:
            result["build_ext"] = build_ext.__qualname__
    for ext in kwargs.get("ext_modules") or []:
        if isinstance(ext, _Recorded):
            records.append(ext.pp4_record)
        else:  # a plain setuptools Extension
            fields = {k: getattr(ext, k) for k in ("include_dirs", "define_macros", "undef_macros", "libraries",
                                                   "library_dirs", "runtime_library_dirs", "extra_compile_args",
                                                   "extra_link_args", "extra_objects")}
            records.append(_record("extension", ext.name, ext.sources, fields))
    result["setup_called"] = True
    raise _Stop


import setuptools
setuptools.setup = _setup
try:
    import distutils.core
    distutils.core.setup = _setup
except ImportError:
    pass
try:
    import torch
    import torch.utils.cpp_extension as cpp_extension
    torch.cuda.is_available = lambda: True
    cpp_extension.CUDAExtension = _factory("cuda")
    cpp_extension.CppExtension = _factory("cpp")
except ImportError:
    pass
try:  # BuildExtension.with_options(...): what the project asks of build_ext, for configure's notices
    _with_options = cpp_extension.BuildExtension.with_options.__func__

    def _recorded_options(cls, **options):
        result.setdefault("build_ext_options", {}).update({k: repr(v) for k, v in options.items()})
        return _with_options(cls, **options)

    cpp_extension.BuildExtension.with_options = classmethod(_recorded_options)
except (NameError, AttributeError):  # no torch here, or a torch without it
    pass

# Which environment variables the project's own code reads (its setup.py and the modules of its
# folder, and what they call), one key at a time: os.environ's class is swapped, so a module that
# holds os.environ under another name is seen too. A copy of the whole environment (for a
# subprocess) is no read of any one variable.
_project = os.path.dirname(os.path.abspath(setup_py)) + os.sep
_read = result["env_read"] = []


def _from_project():
    if result.get("setup_called") is not None:  # setuptools' own reads in setup(): pp4 stops it there
        return False
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_project) and "site-packages" not in name and "dist-packages" not in name:
            return True
        frame = frame.f_back
    return False


class _LoggedEnviron(type(os.environ)):
    def __getitem__(self, key):
        if key not in _read and _from_project():
            _read.append(key)
        return super().__getitem__(key)

    def copy(self):
        return {k: super(_LoggedEnviron, self).__getitem__(k) for k in self}


os.environ.__class__ = _LoggedEnviron

sys.argv = [setup_py, "build_ext"]
sys.path.insert(0, os.path.dirname(setup_py))
try:
    runpy.run_path(setup_py, run_name="__main__")
except _Stop:
    pass
except SystemExit as e:
    if not result.get("setup_called") and e.code not in (None, 0):
        result["error"] = f"it exited with {e.code!r} before calling setup()"
except ModuleNotFoundError as e:
    result["missing_module"] = e.name
except BaseException as e:
    result["error"] = "".join(traceback.format_exception_only(type(e), e)).strip()
    result["traceback"] = traceback.format_exc()[-3000:]
text = json.dumps(result, default=os.fspath)
with open(out_path + ".tmp", "w") as f:
    f.write(text)
os.replace(out_path + ".tmp", out_path)
'''


@attrs.frozen
class ReadSetup:
    """What one setup.py declares, as pp4 builds it, and what pp4 changed on the way."""

    setup_py: Path
    extensions: tuple[Extension, ...]
    notices: tuple[str, ...]
    # The environment variables its code read (pp4 sets the ones of SET_BY_PP4 itself)
    env_read: tuple[str, ...] = ()


def setup_py_path(path: Path) -> Path:
    path = Path(os.path.abspath(path.expanduser()))
    if path.is_dir():
        path = path / "setup.py"
    if not path.is_file():
        raise ExtensionError(f"--setup-py {path}: no such file (give a setup.py, or the folder that holds it)")
    return path


# What setup_env sets whatever the caller's environment holds: never a variable the build depends on.
SET_BY_PP4 = frozenset({"CUDA_HOME", "CUDA_PATH", "FORCE_CUDA", "TORCH_CUDA_ARCH_LIST", "PYTHONDONTWRITEBYTECODE",
                        "PATH"})


def setup_env(toolchain_prefix: Path, archs: list[str]) -> dict:
    """The environment a setup.py runs in under pp4: a CUDA build machine's, with pp4's toolchain."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(CUDA_HOME=str(toolchain_prefix), CUDA_PATH=str(toolchain_prefix), FORCE_CUDA="1",
               TORCH_CUDA_ARCH_LIST=";".join(archs), PYTHONDONTWRITEBYTECODE="1",
               # some declare their CUDA modules only where `nvcc` runs (torchsort 0.1.10)
               PATH=os.pathsep.join([str(toolchain_prefix / "bin"), *filter(None, [env.get("PATH")])]))
    return env


def run_child(script: str, setup_py: Path, args: list[str], toolchain_prefix: Path, archs: list[str],
              python: str = sys.executable, cpu_limit_s: float = SETUP_CPU_LIMIT_S) -> dict:
    """Run script (argv: setup.py, report.json, *args) in setup.py's folder; the report it wrote.
    It is stopped, with every process it started, once they have used cpu_limit_s CPU-seconds
    together; however long it waits for a CPU, it is not stopped for that."""
    with tempfile.TemporaryDirectory(prefix="pp4-setup-py-") as tmp:
        out = Path(tmp) / "report.json"
        script_file = Path(tmp) / "child.py"
        script_file.write_text(script)
        # A process group of its own: its processes are counted together and stopped together.
        proc = subprocess.Popen([python, str(script_file), str(setup_py), str(out), *args], cwd=setup_py.parent,
                                env=setup_env(toolchain_prefix, archs), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0)
        started = time.monotonic()
        try:
            while True:
                try:
                    _, stderr = proc.communicate(timeout=_POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    used = cputime.group_cpu_seconds(proc.pid)
                    if used >= cpu_limit_s:
                        raise ExtensionError(
                            f"{setup_py} used {used:.1f} CPU-seconds (all its processes together, read from /proc) "
                            f"in {time.monotonic() - started:.0f} s of wall time without finishing: pp4 stops a "
                            f"setup.py at {cpu_limit_s:g} CPU-seconds (does it compile or download something "
                            "before setup()?)") from None
        finally:
            if proc.returncode is None:  # stopped above, or interrupted: none of its processes outlives it
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
        if not out.is_file():
            raise ExtensionError(f"{setup_py} could not be run (exit {proc.returncode}):\n{stderr[-3000:]}")
        report = json.loads(out.read_text())
        report["stderr"] = stderr
        return report


def record(setup_py: Path, toolchain_prefix: Path, archs: list[str], python: str = sys.executable) -> dict:
    """Run setup.py under the recorders; the child's report (extensions, or what went wrong)."""
    return run_child(_RECORDER, setup_py, [], toolchain_prefix, archs, python)


def read(setup_py: Path, toolchain_prefix: Path, archs: list[str], python: str = sys.executable) -> ReadSetup:
    """The extensions of one setup.py, as Extension records built the way BuildExtension builds them."""
    setup_py = setup_py_path(setup_py)
    report = record(setup_py, toolchain_prefix, archs, python)
    if "missing_module" in report:
        raise ExtensionError(f"{setup_py} imports the module {report['missing_module']!r}, which {python} does not "
                             f"have: install it there (pp4 runs setup.py with the Python configure runs under, to see "
                             "the same torch), or describe the extensions in a spec file (--ext-spec)")
    if "error" in report:
        raise ExtensionError(f"{setup_py} failed before declaring its extensions: {report['error']}\n"
                             f"{report.get('traceback', '')}".rstrip())
    if not report.get("setup_called"):
        raise ExtensionError(f"{setup_py} finished without calling setup(): is it the project's setup.py?")
    if not report["extensions"]:
        raise ExtensionError(f"{setup_py} declares no CUDAExtension or CppExtension (ext_modules is empty here): "
                             "nothing for pp4 to build")
    exts, notices = [], list(build_ext_notices(setup_py, report.get("build_ext_options") or {}))
    project = report.get("project") or {}
    for rec in report["extensions"]:
        if not rec["fields"].get("sources"):
            own = report.get("build_ext")
            raise ExtensionError(f"{setup_py} extension {rec['fields']['name']!r} lists no sources"
                                 + (f": its setup.py builds it with its own build_ext ({own}, e.g. a CMake build), "
                                    if own else ": ")
                                 + "which pp4 cannot build; build this project with its own setup.py (`pip wheel .`), "
                                 "or describe its sources in a spec file (--ext-spec)")
        ext, notes = to_extension(rec, setup_py, project.get("name") or setup_py.parent.name, archs)
        exts.append(ext)
        notices += notes
    env_read = tuple(sorted(set(report.get("env_read") or ()) - SET_BY_PP4))
    return ReadSetup(setup_py, tuple(exts), tuple(notices), env_read)


def build_ext_notices(setup_py: Path, options: dict[str, str]) -> list[str]:
    """What pp4 does not follow of `BuildExtension.with_options(...)`, one notice each."""
    notices = []
    if options.get("no_python_abi_suffix") not in (None, "False"):
        notices.append(f"{setup_py}: BuildExtension.with_options(no_python_abi_suffix=True) is not followed in the "
                       "build folder: pp4 names each module with Python's ABI suffix (NAME.cpython-...so), as plain "
                       "BuildExtension does; `import NAME` finds it, and the project's wheel (`ninja wheel`) names it "
                       "NAME.so, as the project's setup.py does")
    for name in sorted(set(options) - {"no_python_abi_suffix", "use_ninja"}):
        notices.append(f"{setup_py}: BuildExtension.with_options({name}={options[name]}) is not followed by pp4")
    return notices


def to_extension(rec: dict, setup_py: Path, project: str, archs: list[str]) -> tuple[Extension, list[str]]:
    """One recorded extension as spec fields, then as an Extension; notices of what pp4 changed."""
    f = dict(rec["fields"])
    name = f.pop("name")
    where = f"{setup_py} extension {name!r}"
    if f.get("extra_objects"):
        raise ExtensionError(f"{where}: pp4 cannot build extra_objects (prebuilt objects) yet; build this project "
                             "with its own setup.py")
    unknown = set(f) - {"sources", "include_dirs", "define_macros", "undef_macros", "libraries", "library_dirs",
                        "runtime_library_dirs", "extra_compile_args", "extra_link_args", "dlink", "dlink_libraries",
                        "extra_objects"} - _IGNORED
    if unknown:
        raise ExtensionError(f"{where}: pp4 does not know the argument(s) {', '.join(sorted(unknown))}")
    if rec["kind"] == "extension":
        kind = "cuda" if any(s.endswith(".cu") for s in f["sources"]) else "cpp"
    else:
        kind = rec["kind"]
    args = f.get("extra_compile_args") or {}
    # BuildExtension: a dict gives each compiler its own list; a plain list goes to both.
    cxx, nvcc = (args.get("cxx", []), args.get("nvcc", [])) if isinstance(args, dict) else (list(args), list(args))
    nvcc, removed = without_architecture_flags(nvcc)
    dlink, dropped = without_architecture_flags(_dlink_flags(f, args))
    dlink, removed = list(dlink), [*removed, *dropped]
    notices = [f"{where}: its nvcc flags {' '.join(removed)} are dropped; configure's --arch chooses the "
               "architectures"] if removed else []
    if "-dlto" in dlink:
        dlink = [a for a in dlink if a != "-dlto"]
        notices.append(f"{where}: the device link's -dlto (BuildExtension adds it for dlink=True) is left out: "
                       "the pinned toolchain has no libnvvm for link-time optimization, and objects compiled "
                       "without -dlto carry no code for it")
    ld = list(f.get("extra_link_args") or []) + [f"-Wl,-rpath,{d}" for d in f.get("runtime_library_dirs") or []]
    module = name.rsplit(".", 1)[-1]  # BuildExtension's TORCH_EXTENSION_NAME: the last part of a dotted name
    fields = {
        "name": module, "target": name, "kind": kind, "flavor": "setuptools", "sources": f["sources"],
        "include_dirs": f.get("include_dirs") or [],
        "define_macros": [[m[0]] if len(m) < 2 or m[1] is None else [m[0], str(m[1])]
                          for m in f.get("define_macros") or []],
        "undef_macros": f.get("undef_macros") or [], "libraries": f.get("libraries") or [],
        "library_dirs": f.get("library_dirs") or [], "cxx_flags": list(cxx), "cuda_flags": list(nvcc),
        "ld_flags": ld, "dlink_flags": dlink,
    }
    ext = from_fields(fields, setup_py.parent, setup_py, where, provenance={"setup.py": str(setup_py), "project": project,
                                                                               "archs": list(archs)})
    return ext, notices


def _dlink_flags(f: dict, args) -> list[str]:
    """The device link's nvcc flags as CUDAExtension makes them (nvcc_dlink): with dlink=True or
    dlink_libraries, the project's nvcc_dlink then -dlink, -L for each library folder, -l for each
    dlink library and -dlto; a project's own nvcc_dlink alone otherwise. Empty: no device link."""
    own = list(args.get("nvcc_dlink", [])) if isinstance(args, dict) else []
    if f.get("dlink") or f.get("dlink_libraries"):
        return [*own, "-dlink", *(f"-L{d}" for d in f.get("library_dirs") or []),
                *(f"-l{x}" for x in f.get("dlink_libraries") or []), "-dlto"]
    return own


def spec_text(read_setup: ReadSetup, spec_path: Path) -> str:
    """The spec file that builds the same extensions (paths relative to where it is written)."""
    spec_dir = Path(os.path.abspath(spec_path)).parent
    lines = [f"# The extensions of {read_setup.setup_py}, as pp4 reads them (configure.py --setup-py).",
             f"# Build them from this file with: python -m pp4.configure --ext-spec {spec_path}"]
    for note in read_setup.notices:
        lines.append(f"# {note}")
    for ext in read_setup.extensions:
        lines += ["", "[[extension]]"]
        values = {
            "name": ext.module, "target": ext.target, "kind": ext.kind, "flavor": ext.flavor,
            # The project's folder, named: a spec kept elsewhere then builds the same commands (and
            # finds the same objects in the store) as --setup-py, instead of a root above both.
            "root": os.path.relpath(ext.root, spec_dir),
            "sources": [os.path.relpath(p, spec_dir) for p in ext.source_paths()],
            "include_dirs": [os.path.relpath(p, spec_dir) for p in ext.include_paths()],
            "define_macros": [[n] if v is None else [n, v] for n, v in ext.define_macros],
            "undef_macros": list(ext.undef_macros), "libraries": list(ext.libraries),
            "library_dirs": [os.path.relpath(p, spec_dir) for p in ext.library_paths()],
            "cxx_flags": list(ext.cxx_flags), "cuda_flags": list(ext.cuda_flags), "ld_flags": list(ext.ld_flags),
            "dlink_flags": list(ext.dlink_flags),
        }
        for key in SPEC_FIELDS:
            value = values[key]
            if value or key in ("name", "sources"):
                lines.append(f"{key} = {_toml(value)}")
    return "\n".join(lines) + "\n"


def _toml(value) -> str:
    """A string or a (nested) list of strings as TOML: JSON's string escapes are TOML's basic-string ones."""
    if isinstance(value, str):
        return json.dumps(value)
    return "[" + ", ".join(_toml(v) for v in value) + "]"
