"""What the EXL3 decode GEMM's checks (tests/gpu/exl3_decode_check.py, exl3_fused_check.py) and its
timing bench (bench/worker/exl3_gemm_sweep.py) share: the worker's linear shapes, random linears in
EXL3's layout, the 128-point Hadamard matrix, and a CUDA graph's time per launch."""
from __future__ import annotations

import torch


SHAPES = {  # (K, N, bits) of one rank's linears at the worker's default geometry
    "qkv": (4096, 3072, 4),
    "o": (2048, 4096, 4),
    "gate_up": (4096, 14336, 4),
    "down": (7168, 4096, 4),
    "head": (4096, 64128, 6),
}


def hadamard(n: int = 128) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n ** 0.5


def random_linear(k: int, n: int, bits: int, seed: int, device):
    g = torch.Generator(device="cpu").manual_seed(seed)
    trellis = torch.randint(-32768, 32768, (k // 16, n // 16, 16 * bits), generator=g, dtype=torch.int32)
    suh = (torch.randint(0, 2, (k,), generator=g) * 2 - 1).to(torch.float16)
    svh = ((torch.randint(0, 2, (n,), generator=g) * 2 - 1) * (torch.rand(n, generator=g) + 0.5) / k ** 0.5)
    return trellis.to(torch.int16).to(device), suh.to(device), svh.to(torch.float16).to(device)


def graph_time(fn, reps: int = 20, iters: int = 10) -> float:
    """Microseconds per launch of fn, from a CUDA graph of `reps` launches replayed `iters` times."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        for _ in range(iters):
            g.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1000.0 / (iters * reps))
    return best
