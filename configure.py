#!/usr/bin/env python3
"""Configure pp4: choose the compiler, the extensions and the limits, then write build.ninja.

    python configure.py [options] && ninja

Top-down: read the options; get the pinned toolchain (or the --cuda-home override) and check it
against torch; pick the target architectures; make the compile plan of each extension; write the
limits, the plans and build.ninja, each only when its content changes. build.ninja re-runs this
script, with the same options, when configure.py, build.ninja.in or a source list changes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from pp4 import interrupt  # noqa: E402
from pp4 import ninjarun  # noqa: E402
from pp4 import paths  # noqa: E402
from pp4 import statedir  # noqa: E402
from pp4.build import config as buildconfig  # noqa: E402
from pp4.files import write_if_changed  # noqa: E402
from pp4.plan import estimate  # noqa: E402
from pp4.plan import modules as plan  # noqa: E402
from pp4.plan import ninjafile  # noqa: E402
from pp4.plan.torchflags import setuptools_flags, torch_build_flags  # noqa: E402
from pp4.report import progress  # noqa: E402
from pp4.sizes import human_duration, parse_size  # noqa: E402
from pp4.execution import root as fixed_root  # noqa: E402
from pp4.execution import cluster  # noqa: E402
from pp4.execution import machine  # noqa: E402
from pp4.sources import exl3  # noqa: E402
from pp4.sources import extensions  # noqa: E402
from pp4.sources import listing  # noqa: E402
from pp4.sources import setuppy  # noqa: E402
from pp4.store.remote import redact  # noqa: E402
from pp4.store.remote import tier  # noqa: E402
from pp4.toolchain import archs as arch_names  # noqa: E402
from pp4.toolchain import compat  # noqa: E402
from pp4.toolchain import compilerenv  # noqa: E402
from pp4.toolchain import compilers  # noqa: E402
from pp4.toolchain import provision as toolchain  # noqa: E402
from pp4.toolchain.limits import Limits, parse_cpu_list  # noqa: E402
from pp4.toolchain.locks import LockError, lock_for_cuda  # noqa: E402
from pp4.toolchain.torchenv import TorchError, torch_cuda_version, torch_package_dir  # noqa: E402
from pp4.toolchain.wheelcache import WheelError  # noqa: E402

BUILTIN_EXTENSIONS = ["p2p", "exl3", "exl3-facc", "exl3-decode"]
DEFAULT_EXTENSIONS = BUILTIN_EXTENSIONS
DURATION_TABLES = ROOT / "pp4" / "plan" / "durations"
COMPILE_MEMORY_GUESS = 5 << 30  # the heaviest known unit (EXL3 bindings.cpp) peaks at 4.5 GB


class ConfigureError(Exception):
    pass


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="configure.py",
        description="Write build.ninja for pp4's torch extensions, compiled with the pinned nvcc.",
        epilog="Then run `ninja` (everything), or `ninja TARGET` for one of: toolchain, compdb, or an extension.",
    )
    ap.add_argument("--arch", action="append", default=[], metavar="X.Y",
                    help="GPU compute capability to build for, e.g. 9.0 (repeatable, or a list: 8.0,9.0+PTX; a/f "
                         "suffix allowed, and +PTX to embed PTX too). "
                         "Default: the visible GPUs' (nvidia-smi); with none visible you must give it.")
    ap.add_argument("--builddir", default="build", help="where objects and modules go (default: build)")
    ap.add_argument("--replace", action="store_true",
                    help="write build.ninja here even where it is another configuration's (another --builddir's) or "
                         "not pp4's: without it configure refuses and says how to keep both")
    ap.add_argument("--dist-dir", default="dist", help="where `ninja wheel` puts the modules' wheels (default: dist)")
    ap.add_argument("--ext", action="append", default=[], choices=BUILTIN_EXTENSIONS,
                    help=f"a built-in extension to build (repeatable; default: {', '.join(DEFAULT_EXTENSIONS)}, "
                         "unless --ext-spec is given)")
    ap.add_argument("--exl3-source", type=Path, metavar="PATH",
                    help="build EXL3 from this exllamav3 checkout instead of the pinned release")
    ap.add_argument("--ext-spec", action="append", default=[], type=Path, metavar="FILE.toml",
                    help="also build the extensions a TOML file describes (docs/specs.md)")
    ap.add_argument("--setup-py", action="append", default=[], type=Path, metavar="PATH",
                    help="also build the CUDAExtension/CppExtension modules a project's setup.py declares (the file "
                         "or its folder; repeatable). It is run with setup() intercepted: nothing is installed")
    ap.add_argument("--write-spec", type=Path, metavar="DIR",
                    help="write each --setup-py project's extensions as a spec file into DIR, for inspection")
    ap.add_argument("--cuda-home", type=Path, help="use this CUDA toolkit instead of the pinned wheels "
                    "(still checked against torch)")
    ap.add_argument("--cache-dir", type=Path, help="pp4's cache: wheels, toolchains (default: $PP4_CACHE_DIR or ~/.cache/pp4)")
    ap.add_argument("--wheel-dir", type=Path, help="take the pinned compiler wheels from this folder instead of pip")
    limits = ap.add_argument_group("resource limits, applied to every compile and link")
    limits.add_argument("-j", "--jobs", type=int, help="compiles at once (a ninja pool). Default: the CPUs "
                        "allowed, at most one per 5 GiB of available memory")
    limits.add_argument("--cpus", help="CPU list the compilers may run on, e.g. 0-7,16 (default: all allowed now)")
    limits.add_argument("--nice", type=int, default=10, help="niceness added to each compile (default: 10)")
    limits.add_argument("--max-memory", help="address-space limit per compile process, e.g. 16G (default: none)")
    limits.add_argument("--compiler-threads", type=int, default=1,
                        help="nvcc --threads: architectures one nvcc compiles at once (default: 1)")
    reuse = ap.add_argument_group("object reuse (see docs/reuse.md)")
    reuse.add_argument("--store", type=Path, help="the object store (default: $PP4_STORE_DIR, else <cache dir>/store)")
    reuse.add_argument("--no-reuse", action="store_true", help="compile everything; store and reuse nothing")
    reuse.add_argument("--remote-store", metavar="URL",
                       help="a store shared with other machines behind the local one: redis://[:PASSWORD@]HOST[:PORT][/DB], "
                            "rediss://... (TLS) or file:///SHARED/FOLDER; a password may instead come from "
                            "$PP4_REMOTE_PASSWORD (see docs/store.md)")
    reuse.add_argument("--remote-store-mode", choices=("read", "readwrite"), default="readwrite",
                       help="readwrite (default): fetch hits and send fresh compiles; read: fetch only")
    reuse.add_argument("--trust", action="append", default=[], type=Path, metavar="FILE.pub",
                       help="restore entries signed by this builder's key too (a public key file: `python -m pp4.store "
                            "keys show` prints one); repeatable. Your own key and the keys of `python -m pp4.store keys "
                            "trust` are always trusted (docs/store.md, signed entries)")
    reuse.add_argument("--require-signers", type=int, default=1, metavar="N",
                       help="restore only entries N trusted builders signed, each having compiled the same bytes "
                            "(default: 1)")
    reuse.add_argument("--signing-key", type=Path, metavar="FILE",
                       help="the private key this build signs what it stores with (default: "
                            "$PP4_CONFIG_DIR/keys/signing.key, made on first use)")
    reuse.add_argument("--remote-expire-days", type=float, metavar="DAYS",
                       help="a remote value nobody read for this long expires (Redis; default: the server's "
                            "maxmemory-policy decides)")
    on_cluster = ap.add_argument_group("compiling on a cluster (see docs/cluster.md)")
    on_cluster.add_argument("--executor", metavar="ray://HOST:PORT",
                            help="run compiles that miss the store on this Ray cluster (`ray` alone: $RAY_ADDRESS); "
                                 "-j defaults to the cluster's CPUs")
    on_cluster.add_argument("--executor-timeout", type=float, metavar="SECONDS",
                            help=f"a compile not back from the cluster after this long is run here (default: "
                                 f"{cluster.DEFAULT_TIMEOUT_S:.0f})")
    env = ap.add_argument_group("the compile environment (see docs/reuse.md): compilers get only what pp4 chose")
    env.add_argument("--compile-env", action="append", default=[], metavar="NAME=VALUE",
                     help="also pass this variable to every compiler and linker (repeatable; part of the key)")
    return ap.parse_args(argv)


GENERATED_MARK = "# " + ninjafile.GENERATED


def other_configuration(root: Path, builddir: Path) -> str | None:
    """Why writing build.ninja here would replace another build, if it would: a build.ninja that is
    not pp4's, or pp4's for another build folder that still holds its configuration (a second
    configure here with another --builddir once replaced the first one's silently: issue 55)."""
    path = root / "build.ninja"
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{path} cannot be read ({e.strerror}), so configure cannot tell whose it is; move it away first"
    if not text.startswith(GENERATED_MARK):
        return (f"{path} was not written by pp4's configure.py (its first line is not {GENERATED_MARK!r}): writing "
                "this build's would replace it. Run configure in another folder (build.ninja goes in the current "
                "folder), or pass --replace to replace it")
    variables = ninjafile.read_variables(text)
    if "config" not in variables:
        return None  # pp4's, from before build.ninja named its configuration: nothing to compare
    config = Path(shlex.split(variables["config"])[0])
    old_builddir = config.parent
    if old_builddir == builddir or not config.is_file():
        return None  # the same build, or one whose build folder is gone: nothing to keep
    args = variables.get("configure_args", "")
    shown = os.path.relpath(old_builddir, root) if old_builddir.is_relative_to(root) else str(old_builddir)
    return (f"{path} is the build of another configuration, --builddir {shown} (configured with: {args}); "
            f"writing this one's (--builddir {os.path.relpath(builddir, root) if builddir.is_relative_to(root) else builddir}) "
            "would replace it, and ninja here would build this one only. To keep both, run configure in another "
            "folder (build.ninja goes in the current folder, objects under --builddir): "
            f"mkdir ../other && cd ../other && python {ROOT / 'configure.py'} ... --builddir DIR. To replace it, "
            "pass --replace (its build folder stays on disk)")


def check_option_values(args) -> None:
    """Values argparse's types let through but no build can use: refused before any work."""
    if args.jobs is not None and args.jobs < 1:
        raise ConfigureError(f"-j/--jobs {args.jobs}: at least one compile must be allowed to run "
                             "(leave it out for the default: the CPUs allowed, at most one per 5 GiB of memory)")
    if args.compiler_threads < 1:
        raise ConfigureError(f"--compiler-threads {args.compiler_threads}: nvcc compiles at least one architecture "
                             "at a time (its 0, one thread per CPU, would step over --cpus and -j)")
    if not -20 <= args.nice <= 19:
        raise ConfigureError(f"--nice {args.nice}: niceness is -20 to 19 (a compile can only be made nicer: 0 to 19)")
    for arch in arch_names.split(args.arch):  # the spelling now; nvcc's own list once it is provisioned
        arch_names.parse(arch)


# ------------------------------------------------------------------------------------------------
# toolchain and architectures


def get_toolchain(args) -> tuple[toolchain.Toolchain, list[str], list[str]]:
    """The toolchain, the extra build.ninja inputs it brings, and the provisioning arguments."""
    if args.cuda_home:
        return toolchain.override(args.cuda_home), [], []
    lock = lock_for_cuda(torch_cuda_version())
    cache_root = _cache_root(args)
    result = toolchain.provision(lock, cache_root, args.wheel_dir)
    if result.written or result.linked:
        print(f"configure: provisioned {result.toolchain.prefix} ({result.written} files written)")
    tc_args = ["--cuda", lock.cuda, "--cache-dir", str(cache_root)]
    if args.wheel_dir:
        tc_args += ["--wheel-dir", str(args.wheel_dir.absolute())]
    return result.toolchain, [str(lock.path)], tc_args


def visible_gpu_archs() -> list[str]:
    """Compute capabilities of the visible GPUs, from nvidia-smi: no CUDA context is created."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        proc = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if proc.returncode != 0:
        return []
    return sorted({line.strip() for line in proc.stdout.splitlines() if line.strip()})


def python_command() -> list[str]:
    """How build.ninja runs pp4's modules: plain python when pp4 is installed, else with PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # ninja's re-run sets it itself
    probe = subprocess.run([sys.executable, "-c", "import pp4, sys; sys.stdout.write(pp4.__file__)"],
                           cwd="/", env=env, capture_output=True, text=True)
    if probe.returncode == 0 and Path(probe.stdout).resolve().parent == ROOT / "pp4":
        return [sys.executable]
    # pp4's folder first, then the folders of PYTHONPATH as configure saw them: optional clients
    # (redis-py for --remote-store) may live only there, and the reuse rule imports them.
    entries = [str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return ["env", "PYTHONPATH=" + os.pathsep.join(dict.fromkeys(entries)), sys.executable]


def supported_archs(tc: toolchain.Toolchain) -> list[str]:
    proc = subprocess.run([str(tc.nvcc), "--list-gpu-code"], capture_output=True, text=True)
    return proc.stdout.split() if proc.returncode == 0 else []


# ------------------------------------------------------------------------------------------------
# extensions and plans


def select_extensions(args, builddir: Path, tc: toolchain.Toolchain, archs: list[str]) -> list[extensions.Extension]:
    names = list(dict.fromkeys(args.ext or ([] if args.ext_spec or args.setup_py else DEFAULT_EXTENSIONS)))
    exts = []
    exl3_root = None
    for name in names:
        if name == "p2p":
            exts.append(extensions.p2p())
            continue
        if name == "exl3-decode":
            exts.append(extensions.exl3_decode())
            continue
        if exl3_root is None:
            # The pinned release is unpacked into the build tree; a checkout is used where it is.
            exl3_root = (exl3.checkout_sources(args.exl3_source) if args.exl3_source else
                         exl3.fetch_sources(_cache_root(args), builddir / "exl3-src", args.wheel_dir))
        variant = "facc" if name == "exl3-facc" else "stock"
        exts.append(exl3.exl3_extension(variant, exl3_root, builddir / "exl3-src", nvcc=tc.nvcc))
    exts += [e for p in args.ext_spec for e in extensions.from_spec(p)]
    for path in args.setup_py:
        found = setuppy.read(path, tc.prefix, archs)
        for note in found.notices:
            print(f"configure: notice: {note}")
        print(f"configure: {found.setup_py}: " + ", ".join(f"{e.target} ({e.kind}, {len(e.sources)} sources)"
                                                        for e in found.extensions)
              + f"; `ninja {extensions.project_wheel_target(found.extensions[0])}` (and `ninja wheel`) makes the "
              "project's own wheel")
        if args.write_spec:
            spec = args.write_spec / f"{found.setup_py.parent.name}.toml"
            if write_if_changed(spec, setuppy.spec_text(found, spec)):
                print(f"configure: wrote {spec}")
        exts += found.extensions
    extensions.validate(exts)
    return exts


def _cache_root(args) -> Path:
    return args.cache_dir.absolute() if args.cache_dir else paths.cache_dir()


def durations_known(builddir: Path, root: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Durations from this build's .ninja_log, and the shipped table for known sources."""
    log = plan.read_ninja_log(builddir / ".ninja_log")
    table: dict[str, int] = {}
    for tsv in sorted(DURATION_TABLES.glob("*.tsv")):
        table.update(plan.read_duration_table(tsv))
    return log, table


def compile_tmpdir(builddir: Path) -> Path:
    """Where compilers write their temporary files. nvcc expands $NAME in TMPDIR, so a build
    directory whose path holds a $ gets a folder of its own under the system's temporary directory."""
    if "$" not in str(builddir):
        return builddir / "tmp"
    digest = hashlib.sha256(str(builddir).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"pp4-tmp-{digest}"


def default_jobs(cpus: tuple[int, ...]) -> int:
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        avail = None
    by_memory = max(1, avail // COMPILE_MEMORY_GUESS) if avail else len(cpus)
    return max(1, min(len(cpus), by_memory))


def plan_record(p: plan.ModulePlan, tc: toolchain.Toolchain, root: Path) -> dict:
    ext = p.extension
    return {
        "target": ext.target, "module": ext.module, "root": str(ext.root),
        "sources": [str(s) for s in ext.source_paths()],
        "objects": [str(s.object) for s in p.steps],
        "output": str(p.output), "output_abs": str((root / p.output).absolute()),
        "cuda_flags": list(p.cuda_flags), "cxx_flags": list(p.cxx_flags), "link_flags": list(p.link_flags),
        "toolchain": {"prefix": str(tc.prefix), "key": tc.key, "pinned": tc.pinned,
                      "files": toolchain.identity(tc)},
        "provenance": ext.provenance,
    }


def remote_settings(args, builddir: Path) -> dict | None:
    """The remote tier's settings for pp4.json (no password), checked now; a remote that does not
    answer is only a warning: builds try it and go on locally."""
    if not args.remote_store:
        if args.remote_expire_days is not None:
            raise ConfigureError("--remote-expire-days needs --remote-store")
        return None
    if args.no_reuse:
        raise ConfigureError("--remote-store with --no-reuse: a remote tier shares reused objects; drop one of them")
    try:
        settings = tier.settings(args.remote_store, args.remote_store_mode, args.remote_expire_days,
                                 statedir.of_build(builddir))
    except ValueError as e:
        raise ConfigureError(str(e)) from None
    problem = tier.reachable(settings["url"], statedir.of_build(builddir), settings["ttl"])
    if problem:
        print(f"configure: warning: {problem}; builds will try it and go on locally while it does not answer "
              f"({tier.STOP_TRYING})")
    else:
        print(f"configure: remote store {settings['url']} ({settings['mode']}) answers")
    return settings


def trust_settings(args) -> dict:
    """Whose entries the build restores and the key it signs with (pp4/store/signing.py), checked
    now: a key file that cannot be read is an error here, not a build that stores nothing. A first
    build of this user gets a key of its own."""
    from pp4.store import signing

    if args.require_signers < 1:
        raise ConfigureError(f"--require-signers {args.require_signers}: at least 1")
    try:
        keys = [signing.read_public(path).line().strip() for path in args.trust]
        if args.no_reuse:
            return {"keys": keys, "require_signers": args.require_signers}
        key = args.signing_key.absolute() if args.signing_key else signing.default_key_path()
        if args.signing_key is None and not key.exists():
            made = signing.new_key(key)
            print(f"configure: made your signing key {key} (public: {signing.public_path(key)}): what you store is signed "
                  f"with it; teammates restore it after `python -m pp4.store keys trust {signing.public_path(key)}`")
        else:
            made = signing.load_signer(key)
        print(f"configure: entries are signed by {made.public.name or made.public.key[:12]}; restored when signed by "
              f"{args.require_signers} trusted builder(s): you"
              + (f" and {len(keys)} given with --trust" if keys else "") + " and those of `python -m pp4.store keys list`")
    except signing.SigningKeyError as e:
        raise ConfigureError(str(e)) from None
    return {"keys": keys, "require_signers": args.require_signers, "signing_key": str(key)}


def executor_settings(args, tc: toolchain.Toolchain) -> tuple[dict | None, int | None]:
    """What build/pp4.json records for --executor, and the cluster's CPUs (None: not reachable now)."""
    if not args.executor:
        if args.executor_timeout is not None:
            raise ConfigureError("--executor-timeout needs --executor")
        return None, None
    try:
        address = cluster.parse_address(args.executor)
    except cluster.ClusterError as e:
        raise ConfigureError(str(e)) from None
    if args.executor_timeout is not None and args.executor_timeout <= 0:
        raise ConfigureError(f"--executor-timeout {args.executor_timeout}: a compile needs more than 0 seconds")
    settings = {"address": address, "timeout_s": args.executor_timeout or cluster.DEFAULT_TIMEOUT_S,
                "toolchain": {"cuda_release": torch_cuda_version() if tc.pinned else None, "path": str(tc.prefix)}}
    try:
        cpus = cluster.cluster_cpus(address)
    except Exception as e:  # noqa: BLE001 - any failure to reach it: the build compiles here until it answers
        print(f"configure: warning: {e}; compiles run here until the cluster answers")
        return settings, None
    print(f"configure: cluster {address}: {cpus} CPUs; compiles that miss the store run there")
    return settings, cpus


def _default_store(args) -> Path:
    from pp4.store.local import default_store_dir

    if args.cache_dir and not os.environ.get("PP4_STORE_DIR"):
        return args.cache_dir.absolute() / "store"
    return default_store_dir()


def compile_actions(plans: list[plan.ModulePlan], chosen: compilers.Compilers, envs: dict[str, dict]) -> list[dict]:
    """Every compile command exactly as build.ninja's rules run it (after the wrapper's --), and the
    environment it runs in (per language)."""
    actions = []
    for p in plans:
        for step in p.steps:
            obj = str(step.object)
            argv = [chosen.for_language(step.language), "-MD", "-MF", obj + ".d", *p.flags_for(step),
                    "-c", str(step.source), "-o", obj]
            actions.append({"target": p.extension.target, "output": obj, "source": str(step.source), "argv": argv,
                            "env": envs[step.language]})
    return actions


def link_actions(plans: list[plan.ModulePlan], chosen: compilers.Compilers, envs: dict[str, dict],
                 builddir_text: str) -> list[dict]:
    """Every link command exactly as build.ninja's link rule runs it (after the wrapper's --), with
    its module's pin and plan: what the prepass needs to restore a module ahead of its edges."""
    return [{"target": p.extension.target, "output": str(p.output), "objects": [str(s.object) for s in p.steps],
             "argv": [chosen.cxx, "-shared", *(str(s.object) for s in p.steps), "-o", str(p.output), *p.link_flags],
             "env": envs["cxx"], "plan": ninjafile.plan_json_path(builddir_text, p), "pin": ninjafile.pin_path(p)}
            for p in plans]


def choose_compilers(exts: list[extensions.Extension], tc: toolchain.Toolchain,
                     folded: compilerenv.Folded) -> compilers.Compilers:
    """The compilers of this build (pp4.compilers): one host compiler for nvcc, so two -ccbin
    values in the extensions' flags cannot both be honoured."""
    named = {v for e in exts for v in [compilers.ccbin_from_flags(list(e.cuda_flags))[0]] if v}
    named |= {v for v in [compilers.ccbin_from_flags([*folded.prepend_flags, *folded.append_flags])[0]] if v}
    if len(named) > 1:
        raise ConfigureError(f"the extensions name different host compilers for nvcc ({', '.join(sorted(named))}): "
                             "one build runs one; remove -ccbin from all but one, or set CC")
    toolkit = [(rel, str(tc.prefix / rel)) for rel in toolchain.IDENTITY_FILES]
    flags = ["-ccbin", named.pop()] if named else []
    return compilers.choose(dict(os.environ), str(tc.nvcc), toolkit, flags)


# ------------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    root = Path.cwd()
    builddir = (root / args.builddir).absolute()
    for name, value in (("--builddir", str(builddir)),):
        if "\n" in value:
            raise ConfigureError(f"{name} must not contain a newline")
    if "$" in args.builddir:
        raise ConfigureError(f"--builddir {args.builddir}: a `$` in the build directory's name is expanded by nvcc "
                             "as a shell variable; choose a name without `$`")

    check_option_values(args)
    # Before any work: the folders configure writes (build.ninja here, the build folder) must take
    # a write; a read-only one was a traceback from deep inside (issue 55).
    unwritable = machine.before([root, builddir], rerun="configure.py")
    if unwritable is not None:
        raise ConfigureError(unwritable)
    other = other_configuration(root, builddir)
    if other is not None:
        if not args.replace:
            raise ConfigureError(other)
        print(f"configure: notice: --replace: {other.split(';')[0]}; replacing it (its build folder is left as it is)")
    argv = [a for a in argv if a != "--replace"]  # a one-time choice: ninja's re-runs of configure need none
    remote = remote_settings(args, builddir)
    argv = [redact(a) if "://" in a else a for a in argv]  # build.ninja and configure.json never hold a password
    tc, toolchain_inputs, toolchain_args = get_toolchain(args)
    archs = arch_names.split(args.arch) or visible_gpu_archs()
    if not archs:
        raise ConfigureError("no GPU is visible here, so the target architecture is unknown: pass --arch, "
                             "e.g. --arch 9.0 for an H100/H200 (repeat it for several)")
    supported = supported_archs(tc)
    for a in archs:
        plan.parse_arch(a, supported)

    # The compile environment: what the toolchain would read from ours is folded into build.ninja
    # or dropped, never passed on unseen (pp4/toolchain/compilerenv.py).
    folded = compilerenv.fold(dict(os.environ), root)
    for line in compilerenv.folded_lines(folded):
        print(f"configure: folded {line}")
    for line in compilerenv.notices(dict(os.environ), folded.values, "configure"):
        print(f"configure: notice: {line}")
    exts = select_extensions(args, builddir, tc, archs)
    chosen = choose_compilers(exts, tc, folded)
    compile_section = compilers.compile_section(chosen, folded, compilerenv.parse_compile_env(args.compile_env))
    envs = compile_section["env"]
    report = compat.check(tc, archs=archs, cache_root=args.cache_dir.absolute() if args.cache_dir else None,
                          ccbin=chosen.ccbin, env=envs["cuda"])

    torch = torch_build_flags()
    log, table = durations_known(builddir, root)
    setuptools = None
    if any(e.flavor == "setuptools" for e in exts):  # a setup.py's extensions: what build_ext adds
        setuptools = setuptools_flags(dict(os.environ))
        for name in ("CFLAGS", "CPPFLAGS"):
            if os.environ.get(name):
                print(f"configure: folded {name}={os.environ[name]} into the setup.py extensions' C++ flags "
                      "(setuptools adds it to every compile)")
    # The folders every compile sees at fixed paths in its execution root (pp4/execution/root.py).
    places = fixed_root.places_here(str(torch_package_dir()), str(tc.prefix), sysconfig.get_paths()["include"],
                                    sys.prefix)
    plans = [plan.module_plan(e, torch, tc, archs, builddir, root, log, supported, chosen, folded, setuptools)
             for e in exts]
    # The shipped table and the text estimate are the H200's: scaled by how this machine compared
    # on the units this build has timed, once there are enough of them.
    scale, scaled_on = plan.machine_scale(plans, table)
    learned = (1.0, 0) if scaled_on >= plan.MIN_UNITS_FOR_SCALE else estimate.machine_speed()
    if learned[1] >= estimate.SPEED_MIN_UNITS:
        scale = learned[0]
    ordered = plan.longest_first(plans, table, scale)
    identifier = compilers.Identifier(statedir.part(statedir.of_build(builddir), statedir.COMPILERS), compile_tmpdir(builddir))
    tool_files = {lang: tuple(identifier.files(chosen, lang, envs[lang])) for lang in ("cuda", "cxx")}
    identifier.save()

    cpus = parse_cpu_list(args.cpus) if args.cpus else tuple(sorted(os.sched_getaffinity(0)))
    executor_doc, cluster_cpus = executor_settings(args, tc)
    jobs = args.jobs if args.jobs is not None else cluster_cpus if cluster_cpus else default_jobs(cpus)
    limits = Limits(cpus=cpus, nice=args.nice,
                    address_space=parse_size(args.max_memory, positive=True) if args.max_memory else None,
                    nvcc_threads=args.compiler_threads, tmpdir=str(compile_tmpdir(builddir)))
    store_dir = None if args.no_reuse else str((args.store or _default_store(args)).absolute())
    config = {
        "limits": json.loads(limits.to_json()),
        "reuse": {"store": store_dir, "remote": remote, "roots": sorted({str(e.root) for e in exts}),
                  "relocation": places, "executor": executor_doc,
                  # what tells a unit which module it is for: variants share a unit only where its
                  # preprocessing is proven not to read them (pp4/reuse/variants.py)
                  "name_macros": [plan.MODULE_NAME_MACRO, exl3.PYBIND11_INTERNALS_MACRO],
                  "trust": trust_settings(args),
                  "toolchain": toolchain.identity(tc), "state_dir": str(statedir.of_build(builddir))},
        "compile": compile_section,
    }
    # A setup.py often finds its sources by glob: the names in the folders they sit in are an input
    # too (a stamp, written before every other output of configure), so that a source added or
    # removed there makes ninja read the setup.py again, and nothing else written there does
    # (pp4/sources/listing.py).
    source_folders = tuple(sorted({str(p.parent) for e in exts if "setup.py" in e.provenance for p in e.source_paths()}))
    dist_dir = (root / args.dist_dir).absolute()
    listing_ignore = (dist_dir.name,) if str(dist_dir.parent) in source_folders else ()
    listing_stamp = statedir.part(statedir.of_build(builddir), statedir.SOURCE_LISTING)
    if source_folders:
        listing.write(listing_stamp, source_folders, listing_ignore)
    config_file = buildconfig.config_path(builddir)
    buildconfig.write(builddir, **config)
    actions_file = buildconfig.actions_path(builddir)
    builddir_text = os.path.relpath(builddir, root) if builddir.is_relative_to(root) else str(builddir)
    write_if_changed(actions_file, json.dumps({"actions": compile_actions(plans, chosen, envs),
                                               "links": link_actions(plans, chosen, envs, builddir_text),
                                               "certificate": ninjafile.certificate_path(builddir_text)},
                                              indent=1) + "\n")
    # Apart from actions.json: the estimates change with every build's log, the commands do not.
    write_if_changed(statedir.part(statedir.of_build(builddir), statedir.ESTIMATES),
                     progress.estimates_doc(jobs, {str(s.object): round(plan.expected_ms(p, s, table, scale) / 1000, 1)
                                                   for p, s in ordered},
                                            {str(s.object): round(plan.expected_ms(p, s, table) / 1000, 1)
                                             for p, s in ordered if s.expected_ms is None}))
    for p in plans:
        write_if_changed(builddir / p.extension.target / "plan.json",
                         json.dumps(plan_record(p, tc, root), indent=1, sort_keys=True) + "\n")

    spec_files = sorted({str(f) for e in exts for f in e.spec_files})
    generator_inputs = [*configure_inputs(), str(torch_package_dir() / "version.py"), *spec_files,
                        *toolchain_inputs]  # another lock: another prefix, which configure provisions
    settings = ninjafile.BuildSettings(
        python=python_command(), configure=str(ROOT / "configure.py"), configure_args=tuple(argv),
        ninja=ninjarun.installed(), nvcc=str(tc.nvcc), cxx=chosen.cxx,  # as in compile_actions
        compile_env={lang: tuple(compilerenv.env_args(e)) for lang, e in envs.items()}, tool_files=tool_files,
        config=str(config_file), actions=str(actions_file), jobs=jobs, builddir=builddir_text, dist_dir=args.dist_dir,
        toolchain_manifest=str(tc.prefix / toolchain.MANIFEST) if tc.pinned else None,
        toolchain_args=tuple(toolchain_args), toolchain_inputs=tuple(toolchain_inputs),
        toolchain_key=tc.key if tc.pinned else None,
        generator_inputs=tuple(dict.fromkeys(generator_inputs)),
        source_folders=source_folders, source_listing=str(listing_stamp), source_listing_ignore=listing_ignore,
        generator_outputs=(str(config_file), str(actions_file), str(builddir / "configure.json"),
                           *(ninjafile.plan_json_path(builddir_text, p) for p in plans)),
    )
    write_own_bytecode()
    rules = (ROOT / "build.ninja.in").read_text()
    text = ninjafile.render(settings, rules, plans, ordered)
    changed = write_if_changed(root / "build.ninja", text)
    write_if_changed(builddir / "configure.json", json.dumps({"argv": argv, "cwd": str(root)}, indent=1) + "\n")

    print(f"configure: {report.summary()}")
    print(f"configure: compilers: nvcc {chosen.nvcc} with host compiler {chosen.ccbin}; C++ {chosen.cxx}")
    print(f"configure: {len(plans)} module(s): " + ", ".join(f"{p.extension.target} ({len(p.steps)} units)" for p in plans))
    print(f"configure: {cost_line(plans, ordered, table, jobs, scale, scaled_on, learned[1])}")
    by_target = target_costs(ordered, table, scale)
    if by_target:
        print(f"configure: {by_target}")
    print(f"configure: {jobs} job(s) on CPUs {_cpu_text(cpus)}, nice +{args.nice}"
          + (f", {args.max_memory} address space per compile" if args.max_memory else ""))
    print(f"configure: build.ninja {'written' if changed else 'unchanged'}; run `ninja`"
          + (f" (re-run: python configure.py {shlex.join(argv)})" if argv else ""))
    return 0


def configure_inputs() -> list[str]:
    """What this run of configure was made of: configure.py, build.ninja.in, every module of pp4 it
    imported (the plan, the flags, the sources, the facc patch's applier, the toolchain's
    provisioning, ...) and the data files they read (the patches, the duration tables). A change to
    any of them makes ninja run configure again: a list kept by hand missed some."""
    own = ROOT / "pp4"
    modules = {str(Path(m.__file__)) for m in list(sys.modules.values())
               if getattr(m, "__file__", None) and Path(m.__file__).is_relative_to(own)}
    data = [str(p) for folder in (own / "sources" / "patches", DURATION_TABLES) for p in folder.iterdir() if p.is_file()]
    return [str(ROOT / "configure.py"), str(ROOT / "build.ninja.in"), *sorted(modules), *sorted(data)]


def write_own_bytecode() -> None:
    """A warm build starts Python a few times (the prepass, the recheck, a link or a pin), each
    importing about 40 of pp4's modules; where nothing writes their bytecode as they are imported
    (PYTHONDONTWRITEBYTECODE set, as on some shared machines), each start compiles them again: 0.1
    CPU-s a process. Written here, where stale or missing, into the package's own __pycache__
    folders; a folder that cannot be written only costs that time."""
    import compileall

    compileall.compile_dir(ROOT / "pp4", quiet=2, workers=1)


def cost_line(plans: list[plan.ModulePlan], ordered, table: dict[str, int], jobs: int, scale: float = 1.0,
              scaled_on: int = 0, learned_on: int = 0) -> str:
    """What a cold build costs: CPU time, the wall time of ninja's order on `jobs` slots (each unit
    starts on the first free slot, as ninja starts them), the longest unit. The H200's figures are
    scaled by this build's log where it times enough of the table's units (scaled_on), else by
    this machine's speed learned from its builds (learned_on compiles: pp4/plan/estimate.py)."""
    times = [(p, s, plan.expected_ms(p, s, table, scale) / 1000, plan.measured_ms(p, s, table) is not None)
             for p, s in ordered]
    if not times:
        return "nothing to compile"
    slots = [0.0] * jobs
    for _, _, t, _ in times:
        i = min(range(jobs), key=slots.__getitem__)
        slots[i] += t
    p, s, longest, _ = max(times, key=lambda x: x[2])
    measured = sum(m for *_, m in times)
    source = (f"{measured} timed before" if measured == len(times) else
              f"{measured} timed before, {len(times) - measured} estimated from their text (pp4/plan/estimate.py)")
    return (f"a cold build: {len(times)} compiles ({source}), about {human_duration(sum(t for _, _, t, _ in times))} of CPU, "
            f"about {human_duration(max(slots))} on {jobs} job(s); the longest unit {os.path.relpath(s.source, p.extension.root)} "
            f"about {human_duration(longest)}. Objects found in the store cost a copy instead. Times are per-unit "
            "figures from this build's log, else the H200 machine's " +
            (f"times {scale:.2f} (the median of this machine's time over the H200's on the {scaled_on} units both "
             "have timed)" if scaled_on >= plan.MIN_UNITS_FOR_SCALE else
             f"times {scale:.2f} (this machine's CPU time over the H200's on the last {learned_on} units it compiled, "
             f"{estimate.speed_file()}; remove it to reset)" if learned_on >= estimate.SPEED_MIN_UNITS else
             f"as measured there (scaled to this machine once {plan.MIN_UNITS_FOR_SCALE} of its units are timed "
             f"here; {scaled_on} are): a slower CPU takes longer"))


def target_costs(ordered, table: dict[str, int], scale: float = 1.0) -> str | None:
    """The CPU each target costs cold, for a build of fewer than all of them (`ninja p2p`, or a
    `ninja wheel-TARGET`): None for a single target."""
    cpu: dict[str, float] = {}
    for p, s in ordered:
        cpu[p.extension.target] = cpu.get(p.extension.target, 0.0) + plan.expected_ms(p, s, table, scale) / 1000
    if len(cpu) < 2:
        return None
    costliest = sorted(cpu.items(), key=lambda tc: -tc[1])
    return "by target, cold: " + ", ".join(f"{t} about {human_duration(c)} of CPU" for t, c in costliest)


def _cpu_text(cpus: tuple[int, ...]) -> str:
    runs, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            runs.append(f"{start}-{c}" if start != c else f"{c}")
            start = None
    return ",".join(runs)


if __name__ == "__main__":
    try:
        sys.exit(interrupt.command("configure.py")(main)(sys.argv[1:]))
    except (ConfigureError, LockError, WheelError, TorchError, toolchain.ToolchainError, compat.CompatError,
            compilers.CompilerError,
            extensions.ExtensionError, plan.PlanError, exl3.Exl3Error, ValueError) as e:
        print(f"configure.py: error: {e}", file=sys.stderr)
        sys.exit(2)
