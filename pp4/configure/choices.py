"""What configure chooses: the toolchain and the architectures, the extensions and their compilers,
the limits, the store, its remote tier, the trust list and the executor, and how build.ninja runs
pp4's own modules."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pp4 import paths, statedir
from pp4.configure.options import DEFAULT_EXTENSIONS, ConfigureError
from pp4.execution import cluster
from pp4.files import write_if_changed
from pp4.sources import exl3, extensions, setuppy
from pp4.store.remote import RemoteUnavailable, tier
from pp4.toolchain import compilerenv, compilers
from pp4.toolchain import provision as toolchain
from pp4.toolchain.locks import lock_for_cuda
from pp4.toolchain.torchenv import torch_cuda_version

COMPILE_MEMORY_GUESS = 5 << 30  # the heaviest known unit (EXL3 bindings.cpp) peaks at 4.5 GB


def get_toolchain(args) -> tuple[toolchain.Toolchain, list[str], list[str]]:
    """The toolchain, the extra build.ninja inputs it brings, and the provisioning arguments."""
    if args.cuda_home:
        return toolchain.override(args.cuda_home), [], []
    lock = lock_for_cuda(torch_cuda_version())
    cache = cache_root(args)
    result = toolchain.provision(lock, cache, args.wheel_dir)
    if result.written or result.copied:
        print(f"configure: provisioned {result.toolchain.prefix} ({result.written} files written)")
    tc_args = ["--cuda", lock.cuda, "--cache-dir", str(cache)]
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
    if probe.returncode == 0 and Path(probe.stdout).resolve().parent == paths.PACKAGE_DIR:
        return [sys.executable]
    # pp4's folder first, then the folders of PYTHONPATH as configure saw them: optional clients
    # (redis-py for --remote-store) may live only there, and the reuse rule imports them.
    entries = [str(paths.PACKAGE_DIR.parent), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return ["env", "PYTHONPATH=" + os.pathsep.join(dict.fromkeys(entries)), sys.executable]


def supported_archs(tc: toolchain.Toolchain) -> list[str]:
    proc = subprocess.run([str(tc.nvcc), "--list-gpu-code"], capture_output=True, text=True)
    return proc.stdout.split() if proc.returncode == 0 else []


def select_extensions(args, builddir: Path, tc: toolchain.Toolchain, archs: list[str],
                      env_read: dict[str, str] | None = None) -> list[extensions.Extension]:
    """env_read, where given, gets each environment variable a setup.py read, with the setup.py's path."""
    names = list(dict.fromkeys(args.ext or ([] if args.ext_spec or args.setup_py else DEFAULT_EXTENSIONS)))
    exts = []
    exl3_root = None
    for name in names:
        if name in extensions.BUILTIN_SPECS:  # p2p, exl3-decode: the worker's spec files
            exts += extensions.from_spec(extensions.BUILTIN_SPECS[name])
            continue
        if exl3_root is None:
            # The pinned release is unpacked into the build tree; a checkout is used where it is.
            exl3_root = (exl3.checkout_sources(args.exl3_source) if args.exl3_source else
                         exl3.fetch_sources(cache_root(args), builddir / "exl3-src", args.wheel_dir))
        variant = "facc" if name == "exl3-facc" else "stock"
        exts.append(exl3.exl3_extension(variant, exl3_root, builddir / "exl3-src", nvcc=tc.nvcc))
    exts += [e for p in args.ext_spec for e in extensions.from_spec(p)]
    for path in args.setup_py:
        found = setuppy.read(path, tc.prefix, archs)
        for note in found.notices:
            print(f"configure: notice: {note}")
        if env_read is not None:
            env_read.update((name, str(found.setup_py)) for name in found.env_read)
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


def cache_root(args) -> Path:
    return args.cache_dir.absolute() if args.cache_dir else paths.cache_dir()


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
    except (ValueError, RemoteUnavailable) as e:  # a folder that is not there: a typo more often than a late mount
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
        trust = signing.load_trust(keys, args.require_signers, made.public)
        if len(trust.keys) < args.require_signers:
            have = ", ".join(k.label for k in trust.keys.values())
            raise ConfigureError(f"--require-signers {args.require_signers}: your trust list has {len(trust.keys)} "
                                 f"key(s) ({have}), so no entry could ever be restored; trust "
                                 f"{args.require_signers - len(trust.keys)} more: `python -m pp4.store keys trust "
                                 "FILE` with a teammate's .pub (or --trust FILE), or require fewer")
        print(f"configure: entries are signed by {made.public.label}; restored when signed by "
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


def default_store(args) -> Path:
    from pp4.store.local import default_store_dir

    if args.cache_dir and not os.environ.get("PP4_STORE_DIR"):
        return args.cache_dir.absolute() / "store"
    return default_store_dir()


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

