"""pp4's EXL3 decode (the CUDA header the decode GEMM is built from) run on the CPU.

decode.cuh's functions compile for the host too, with the intrinsics spelled out in C++; a small
program (tests/fixtures/exl3_decode_host) runs every warp lane's decode of each tile and writes the
weights where the lane's tensor-core fragments put them. Its output must equal the plain-torch
decode (pp4_worker/model/exl3_reference.py), which tests/test_worker_exl3_checkpoint.py checks
against upstream's packing, tile permutation and codebook. What stays for the GPU: the
intrinsics themselves, the MMA, the pipeline and the transforms (tests/gpu/exl3_decode_check.py).
"""
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pp4_worker.model import exl3_reference  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HEADERS = ROOT / "pp4_worker" / "ext" / "exl3_decode"
HARNESS = Path(__file__).parent / "fixtures" / "exl3_decode_host" / "decode_host.cu"


@pytest.fixture(scope="module")
def decode_host(toolchain, tmp_path_factory):
    exe = tmp_path_factory.mktemp("decode_host") / "decode_host"
    subprocess.run([str(toolchain.nvcc), "-O2", f"-I{HEADERS}", "-o", str(exe), str(HARNESS)], check=True)
    return exe


def host_decode(exe, trellis: torch.Tensor, bits: int, codebook: int) -> torch.Tensor:
    kt, nt = trellis.shape[:2]
    out = subprocess.run([str(exe), str(bits), str(codebook), str(kt * nt)], input=trellis.numpy().tobytes(),
                         capture_output=True, check=True).stdout
    tiles = torch.frombuffer(bytearray(out), dtype=torch.int16).view(kt, nt, 16, 16)
    return tiles.permute(0, 2, 1, 3).reshape(kt * 16, nt * 16)


@pytest.mark.parametrize("codebook", [0, 1, 2])
@pytest.mark.parametrize("bits", range(2, 9))
def test_every_lane_decodes_its_weights_as_the_format_defines_them(decode_host, bits, codebook):
    gen = torch.Generator().manual_seed(100 * codebook + bits)
    trellis = torch.randint(-32768, 32768, (2, 3, 16 * bits), generator=gen).to(torch.int16)
    want = exl3_reference.decode(trellis, codebook).view(torch.int16)
    assert torch.equal(host_decode(decode_host, trellis, bits, codebook), want)


def test_the_harness_refuses_a_bit_width_without_a_kernel(decode_host):
    proc = subprocess.run([str(decode_host), "9", "2", "1"], input=b"\0" * 4 * 72, capture_output=True)
    assert proc.returncode == 2 and b"no decode for 9 bits" in proc.stderr
