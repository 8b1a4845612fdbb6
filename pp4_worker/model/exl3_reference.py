"""EXL3 linears in plain torch, on any device: the trellis decode and the whole product.

This is the format written out as arithmetic, for checking (pp4's decode GEMM on the GPU, the
checkpoint reader and the ranks' split on the CPU), not for speed:

* the tile's stream: 16*bits int16 words whose 32-bit pairs hold the stream's bits most
  significant first, so stream word j is stored word j^1;
* weight p of a tile (p = 0..255) has the 16-bit state ending at stream bit (p+1)*bits, wrapping
  (the trellis is tail-biting), and sits at the tensor-core position of p (``tile_positions``);
* a codebook maps the state to an fp16 value (``codebook_values``);
* y = had128(had128(x * suh) @ W) * svh, each had128 orthonormal (scaled by 1/sqrt(128)).
"""
from __future__ import annotations

import functools

import torch

from pp4_worker.model.exl3 import HADAMARD, TILE, Exl3Group

MASK32 = 0xFFFFFFFF


@functools.lru_cache(maxsize=None)
def codebook_values(codebook: int) -> torch.Tensor:
    """fp16 [65536]: the weight of every 16-bit state; codebook 0 3inst, 1 mcg, 2 mul1."""
    s = torch.arange(65536, dtype=torch.int64)
    if codebook == 2:  # mul1: an fp16 1024 + byte sum of the product, then one fp16 fma
        x = (s * 0x83DCD12D) & MASK32
        h = 1024 + sum((x >> shift) & 0xFF for shift in (0, 8, 16, 24))
        k_inv = _half_bits(0x1EEE)
        k_bias = _half_bits(0xC931)
        return (h.double() * k_inv + k_bias).to(torch.float16)  # exact in fp64, then the fma's one rounding
    if codebook == 1:  # mcg
        x = (s * 0xCBAC1FED) & MASK32
    elif codebook == 0:  # 3inst
        x = (s * 89226354 + 64248484) & MASK32
    else:
        raise ValueError(f"codebook {codebook}: 0 (3inst), 1 (mcg) or 2 (mul1)")
    x = (x & 0x8FFF8FFF) ^ 0x3B603B60  # two fp16 bit patterns, added in fp16
    lo = _as_half(x & 0xFFFF).double()
    hi = _as_half(x >> 16).double()
    return (lo + hi).to(torch.float16)


def _as_half(bits: torch.Tensor) -> torch.Tensor:
    """fp16 values of 16-bit patterns held as int64 0..65535."""
    return (bits - (bits >> 15 << 16)).to(torch.int16).view(torch.float16)


def _half_bits(bits: int) -> float:
    return _as_half(torch.tensor([bits])).item()


@functools.lru_cache(maxsize=None)
def tile_positions() -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) in the 16x16 tile of each trellis position p: lane t = p // 8 of a warp holds
    rows 2(t%4), +1, +8, +9 of column t//4 (p%8 < 4) or t//4 + 8 (p%8 >= 4)."""
    p = torch.arange(256)
    t, j = p // 8, p % 8
    rows = (t % 4) * 2 + torch.tensor([0, 1, 8, 9])[j % 4]
    cols = t // 4 + 8 * (j // 4)
    return rows, cols


def states(trellis: torch.Tensor) -> torch.Tensor:
    """int64 [..., 256]: each position's 16-bit state, from int16 [..., 16*bits] tiles."""
    words = trellis.shape[-1]
    if words % 16:
        raise ValueError(f"a tile of {words} words is not 16*bits (half-integer bitrates are not supported)")
    bits = words // 16
    stored = trellis.to(torch.int64) & 0xFFFF
    stream = stored[..., torch.arange(words) ^ 1]  # stream word j is stored word j^1
    start = (torch.arange(1, 257) * bits - 16) % (256 * bits)
    w0, offset = start // 16, start % 16
    window = (stream[..., w0] << 16) | stream[..., (w0 + 1) % words]
    return (window >> (16 - offset)) & 0xFFFF


def decode(trellis: torch.Tensor, codebook: int) -> torch.Tensor:
    """W [K, N] fp16 from int16 [K/16, N/16, 16*bits]."""
    kt, nt = trellis.shape[:2]
    values = codebook_values(codebook).to(trellis.device)[states(trellis)]  # [kt, nt, 256]
    rows, cols = tile_positions()
    tiles = torch.empty(kt, nt, TILE, TILE, dtype=torch.float16, device=trellis.device)
    tiles[:, :, rows, cols] = values
    return tiles.permute(0, 2, 1, 3).reshape(kt * TILE, nt * TILE)


def hadamard128(x: torch.Tensor) -> torch.Tensor:
    """The orthonormal 128-point Sylvester-Hadamard transform of each 128-block of the last axis."""
    n = x.shape[-1]
    if n % HADAMARD:
        raise ValueError(f"{n} is not a multiple of {HADAMARD}")
    y = x.reshape(-1, n // HADAMARD, HADAMARD)
    h = 1
    while h < HADAMARD:
        y = y.view(*y.shape[:-1], HADAMARD // (2 * h), 2, h)
        y = torch.stack((y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]), dim=-2)
        y = y.reshape(*y.shape[:-3], HADAMARD)
        h *= 2
    return (y * HADAMARD ** -0.5).reshape(x.shape)


def linear(x: torch.Tensor, lin, dtype=torch.float64) -> torch.Tensor:
    """x [M, K] @ the Exl3Linear (or Exl3Group) ``lin`` in ``dtype`` arithmetic, its parts each with
    their own suh."""
    if isinstance(lin, Exl3Group):
        return torch.cat([linear(x, p, dtype) for p in lin.parts], dim=1)
    w = decode(lin.trellis, lin.codebook).to(dtype)
    suh = lin.suh.view(lin.parts, lin.in_features).to(dtype)
    columns = lin.part_columns or (lin.out_features,)
    outs, start = [], 0
    for part, cols in enumerate(columns):
        xh = hadamard128(x.to(dtype) * suh[part])
        outs.append(xh @ w[:, start : start + cols])
        start += cols
    return hadamard128(torch.cat(outs, dim=1)) * lin.svh.to(dtype)
