"""`python -m pp4.toolchain`: install the pinned CUDA compiler from NVIDIA's wheels into pp4's cache,
or check it. Here rather than in provision.py because it also runs the compatibility check, which
itself needs a provisioned toolchain."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pp4 import interrupt
from pp4 import paths
from pp4.toolchain import archs
from pp4.toolchain import compat
from pp4.toolchain.compat import CompatError
from pp4.toolchain.locks import LockError, ToolchainLock, lock_for_cuda, supported_releases
from pp4.toolchain.provision import ToolchainError, check_prefix, prefix_key, provision
from pp4.toolchain.torchenv import TorchError, library_headers, torch_cuda_version
from pp4.toolchain.wheelcache import WheelError


def _lock_from_args(args) -> ToolchainLock:
    if args.cuda:
        return lock_for_cuda(args.cuda)
    return lock_for_cuda(torch_cuda_version())


@interrupt.command("pp4.toolchain")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pp4.toolchain",
        description="Install the pinned CUDA compiler from NVIDIA's wheels into pp4's cache, or check it.",
    )
    ap.add_argument("command", nargs="?", default="provision", choices=["provision", "check", "path", "releases"],
                    help="provision (default): install if needed, then run the compatibility check; "
                         "check: verify an existing prefix; path: print the prefix; releases: list supported CUDA releases")
    ap.add_argument("--cuda", help="CUDA release to provision (default: the installed torch's torch.version.cuda)")
    ap.add_argument("--cache-dir", type=Path, help="pp4's cache directory (default: $PP4_CACHE_DIR, else ~/.cache/pp4)")
    ap.add_argument("--wheel-dir", type=Path, help="take the pinned wheels from this directory instead of pip (they are hash-checked)")
    ap.add_argument("--arch", action="append", default=[], help="compute capability for the probe compile, e.g. 9.0 (repeatable, or a list: 8.0,9.0+PTX)")
    ap.add_argument("--deep", action="store_true", help="check: rehash every file instead of comparing size and mtime")
    ap.add_argument("--no-torch-headers", action="store_true", help="leave out torch's library headers (cublas_v2.h, ...)")
    args = ap.parse_args(argv)
    try:
        if args.command == "releases":
            print("\n".join(supported_releases()))
            return 0
        lock = _lock_from_args(args)
        cache_root = args.cache_dir.absolute() if args.cache_dir else None
        if args.command in ("check", "path"):
            skip = {w.name for w in lock.wheels}
            headers = [] if args.no_torch_headers else library_headers(lock.wheel_root, skip)
            key = prefix_key(lock, headers)
            prefix = paths.toolchains_dir(cache_root) / f"cuda-{lock.cuda}-{key}"
            if args.command == "path":
                print(prefix)
                return 0
            problems = check_prefix(prefix, key, deep=args.deep)
            for p in problems:
                print(p, file=sys.stderr)
            print(f"{prefix}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
            return 0 if not problems else 1
        result = provision(lock, cache_root, args.wheel_dir, with_torch_headers=not args.no_torch_headers)
        report = compat.check(result.toolchain, archs=archs.split(args.arch), cache_root=cache_root)
        print(f"toolchain: {result.toolchain.prefix}")
        print(f"  CUDA {lock.cuda}, {result.written} files written, {result.copied} copied from an older prefix, "
              f"{result.seconds:.2f} s")
        print(f"  {report.summary()}")
        return 0
    except (LockError, WheelError, ToolchainError, TorchError, CompatError, archs.ArchError) as e:
        print(f"pp4.toolchain: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
