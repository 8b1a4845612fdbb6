"""Does this compiler match this torch? Three questions, each failing with both versions and the fix.

1. nvcc's release (nvcc --version) equals torch.version.cuda, major.minor.
2. The headers nvcc will actually include are that release (CUDART_VERSION of the cuda_runtime_api.h
   that nvcc's own include path resolves).
3. A tiny kernel compiles for every requested architecture.

A passed probe compile is remembered in the cache, keyed by everything it depended on, so that a
re-run costs two quick nvcc calls and no compile.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

import attrs

from pp4 import paths
from pp4.toolchain import archs as arch_names
from pp4.toolchain.compilerenv import process_env
from pp4.toolchain.provision import Toolchain
from pp4.toolchain.torchenv import torch_cuda_version, torch_version

PROBE_SOURCE = """\
#include <cuda_runtime.h>
__global__ void pp4_probe(float* out, const float* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * 2.0f + 1.0f;
}
"""


class CompatError(Exception):
    """The compiler and torch do not fit together."""


@attrs.frozen
class CompatReport:
    nvcc: Path
    nvcc_release: str  # "13.0"
    nvcc_version: str  # "13.0.88"
    header_release: str
    header_path: Path
    torch_cuda: str
    archs: tuple[str, ...]
    probe_cached: bool

    def summary(self) -> str:
        archs = ", ".join(f"sm_{a.replace('.', '')}" for a in self.archs) or "no architecture requested"
        how = "cached" if self.probe_cached else "compiled"
        return (f"compatible: nvcc {self.nvcc_version}, headers CUDA {self.header_release}, "
                f"torch CUDA {self.torch_cuda}; probe {how} for {archs}")


def _run(cmd: list[str], tmp: Path, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    base = env if env is not None else {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C"}
    return subprocess.run(cmd, env=process_env(base, tmp), capture_output=True, text=True, **kw)


def nvcc_version(nvcc: Path, tmp: Path) -> tuple[str, str]:
    try:
        proc = _run([str(nvcc), "--version"], tmp)
    except OSError as e:
        raise CompatError(f"cannot run {nvcc}: {e}. Provision again with `python -m pp4.toolchain`.") from None
    m = re.search(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)", proc.stdout)
    if proc.returncode != 0 or not m:
        raise CompatError(f"{nvcc} --version failed or printed no release:\n{proc.stdout}{proc.stderr}")
    return m.group(1), m.group(2)


def header_release(nvcc: Path, tmp: Path, ccbin: str | None = None, env: dict[str, str] | None = None) -> tuple[str, Path]:
    """CUDART_VERSION of the cuda_runtime_api.h that nvcc's include path finds, and where it is."""
    src = tmp / "pp4_header_probe.cpp"
    src.write_text("#include <cuda_runtime_api.h>\npp4_cudart_version = CUDART_VERSION;\n")
    proc = _run([str(nvcc), *(["-ccbin", ccbin] if ccbin else []), "-E", "-x", "c++", str(src)], tmp, env)
    m = re.search(r"pp4_cudart_version = (\d+)", proc.stdout)
    if proc.returncode != 0 or not m:
        raise CompatError(f"nvcc {nvcc} cannot find cuda_runtime_api.h:\n{proc.stderr.strip()[-2000:]}")
    paths_seen = re.findall(r'^# \d+ "([^"]*cuda_runtime_api\.h)"', proc.stdout, re.M)
    v = int(m.group(1))
    where = Path(os.path.normpath(paths_seen[0])) if paths_seen else Path("(unknown)")
    return f"{v // 1000}.{(v % 1000) // 10}", where


def _probe_key(nvcc: Path, version: str, arch: str, ccbin: str | None, env: dict[str, str] | None) -> str:
    st = nvcc.stat()
    host = Path(os.path.realpath(ccbin)) if ccbin else None
    host_id = f"{ccbin}:{host.stat().st_size}:{host.stat().st_mtime_ns}" if host else "default"
    ident = f"{nvcc}:{st.st_size}:{st.st_mtime_ns}:{version}:{host_id}:{arch}:{sorted((env or {}).items())}"
    return hashlib.sha256(ident.encode()).hexdigest()[:24]


def probe_compile(nvcc: Path, version: str, arch: str, tmp: Path, cache_root: Path | None,
                  ccbin: str | None = None, env: dict[str, str] | None = None) -> bool:
    """Compile the probe kernel for one architecture; True when the result came from the cache."""
    stamp = paths.toolchains_dir(cache_root) / "probes" / f"{_probe_key(nvcc, version, arch, ccbin, env)}.ok"
    if stamp.is_file():
        return True
    # The same -gencode flags the build passes for this --arch value (PTX too, for 9.0+PTX).
    cc, _ = arch_names.parse(arch)
    src = tmp / "pp4_probe.cu"
    src.write_text(PROBE_SOURCE)
    cmd = [str(nvcc), *(["-ccbin", ccbin] if ccbin else []), "-c", str(src), "-o", str(tmp / "pp4_probe.o"),
           *arch_names.gencode_flags([arch])]
    proc = _run(cmd, tmp, env)
    if proc.returncode != 0:
        host = f"the host compiler {ccbin}" if ccbin else "the host compiler (gcc on PATH)"
        raise CompatError(
            f"nvcc {version} at {nvcc} cannot compile a probe kernel for sm_{cc} with {host}:\n"
            f"{proc.stderr.strip()[-2000:]}\nCheck --arch (this nvcc lists its architectures with "
            f"`{nvcc} --list-gpu-arch`) and that nvcc supports that host compiler (choose another with CC)."
        )
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(" ".join(cmd) + "\n")
    return False


def check(toolchain: Toolchain, archs: list[str] | tuple[str, ...] = (), cache_root: Path | None = None,
          torch_cuda: str | None = None, ccbin: str | None = None, env: dict[str, str] | None = None) -> CompatReport:
    """ccbin and env: the host compiler and compile environment the build will use (configure's
    choice); without them, nvcc's default host compiler on this PATH."""
    torch_cuda = torch_cuda or torch_cuda_version()
    if not torch_cuda:
        raise CompatError(
            f"torch {torch_version()} is a CPU-only build (torch.version.cuda is None): it cannot load CUDA "
            "extensions. Install a CUDA build of torch, e.g. `pip install torch` on Linux x86_64."
        )
    want = ".".join(torch_cuda.split(".")[:2])
    scratch_root = paths.tmp_dir(cache_root)
    scratch_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch_root, prefix="compat-") as t:
        tmp = Path(t)
        release, full = nvcc_version(toolchain.nvcc, tmp)
        fix = ("use pp4's pinned toolchain (drop --cuda-home)" if not toolchain.pinned
               else "provision again with `python -m pp4.toolchain`")
        if release != want:
            raise CompatError(
                f"nvcc at {toolchain.nvcc} is CUDA {release} ({full}), but torch {torch_version()} was built "
                f"for CUDA {want}: extensions built so would not load or would misbehave. Fix: {fix}, "
                f"or pass --cuda-home with a CUDA {want} toolkit."
            )
        hdr, hdr_path = header_release(toolchain.nvcc, tmp, ccbin, env)
        if hdr != want:
            raise CompatError(
                f"nvcc {full} at {toolchain.nvcc} includes headers of CUDA {hdr} ({hdr_path}), but torch was "
                f"built for CUDA {want} and nvcc is {release}: a mixed toolkit. Fix: {fix}."
            )
        cached = (all([probe_compile(toolchain.nvcc, full, a, tmp, cache_root, ccbin, env) for a in archs])
                  if archs else True)
    return CompatReport(toolchain.nvcc, release, full, hdr, hdr_path, want, tuple(archs), cached)
