"""configure's options: what they are, and the values no build can use, refused before any work."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pp4.execution import cluster
from pp4.sizes import parse_size
from pp4.toolchain import archs as arch_names
from pp4.toolchain.limits import cpus_not_allowed, parse_cpu_list

BUILTIN_EXTENSIONS = ["p2p", "exl3", "exl3-facc", "exl3-decode"]
DEFAULT_EXTENSIONS = BUILTIN_EXTENSIONS


class ConfigureError(Exception):
    pass


def parse_args(argv: list[str], prog: str = "python -m pp4.configure") -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog=prog,
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
    if args.max_memory:
        try:
            parse_size(args.max_memory, positive=True)
        except ValueError as e:
            raise ConfigureError(f"--max-memory: {e}") from None
    if args.cpus:
        problem = cpus_not_allowed(parse_cpu_list(args.cpus), os.sched_getaffinity(0))
        if problem:
            raise ConfigureError(problem)
    for arch in arch_names.split(args.arch):  # the spelling now; nvcc's own list once it is provisioned
        arch_names.parse(arch)

