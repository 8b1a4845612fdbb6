"""EXL3-quantized linears as the EXL3 backends hold them, and their synthetic weights.

Exl3Linear and Exl3Group hold a checkpoint's linears too (pp4_worker/model/exl3_checkpoint.py).
An EXL3 linear of K inputs and N outputs is held as exllamav3 holds it:

* ``trellis`` int16 [K/16, N/16, 16*bits]: one 16x16 tile per (k, n) tile pair, ``bits``
  bits per weight, decoded on the fly by EXL3's GEMM/GEMV kernels;
* ``suh`` fp16 [K]: input-side signs, applied before a 128-wide Hadamard transform;
* ``svh`` fp16 [N]: output-side signs times the output scale, after the other Hadamard.

The worker's weights are synthetic, so its quantized weights are too: every 16-bit word of the
trellis is the counter hash of (seed, tensor name, global word index) -- any bit pattern decodes to a
valid codebook value -- and the sign vectors are hash bits.
``svh`` carries the same 1/sqrt(fan_in) (and head gain) the fp16 synthetic weights have. A word
is a function of its global position in the logical tensor, so a rank's shard is a slice of the
whole: column-parallel tensors split on N tiles and ``svh``, row-parallel ones on K tiles and
``suh``. Hadamard blocks are 128 wide and every split falls on a multiple of 128, so the two
ranks' partial products still sum to the whole product.

Fused tensors (qkv, gate_up) concatenate their parts on N; parts that share an input share one
``suh`` (named after the fused tensor), as one EXL3 kernel applies one input transform.
This is a model of its own: its arithmetic is not the fp16 model's, so its digests, and its
weight bytes (the floor its ratio is measured against), are its own.
"""
from __future__ import annotations

import math

import attrs
import torch

from pp4_worker.model import hashing
from pp4_worker.model.config import EXL3_BITS as BITS

TILE = 16
HADAMARD = 128
DOMAIN_EXL3 = 0x452821E6


@attrs.frozen
class Exl3Linear:
    """One quantized linear as exl3_gemm reads it (y = x @ W, W [in_features, out_features])."""

    trellis: torch.Tensor  # int16 [K/16, N/16, 16*bits]
    suh: torch.Tensor  # fp16 [K], or [parts, K] where the parts of a fused linear have their own
    svh: torch.Tensor  # fp16 [N]
    bits: int
    codebook: int = 0  # exllamav3's: 0 3inst (what synthetic weights use), 1 mcg, 2 mul1
    # Output columns of each part with its own input signs (suh row); () for one part.
    part_columns: tuple[int, ...] = ()

    @property
    def in_features(self) -> int:
        return self.suh.shape[-1]

    @property
    def parts(self) -> int:
        return max(1, len(self.part_columns))

    @property
    def out_features(self) -> int:
        return self.svh.shape[0]

    @property
    def nbytes(self) -> int:  # as torch.Tensor.nbytes, so byte counts treat both alike
        return sum(t.nbytes for t in (self.trellis, self.suh, self.svh))


@attrs.frozen
class Exl3Group:
    """Linears that share an input but not a bit width or codebook (a checkpoint's q, k and v can
    differ: exllamav3 spreads its bit budget over tensors), run one after another, outputs joined."""

    parts: tuple[Exl3Linear, ...]

    @property
    def in_features(self) -> int:
        return self.parts[0].in_features

    @property
    def out_features(self) -> int:
        return sum(p.out_features for p in self.parts)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


def _hash(name: str, seed: int, index: torch.Tensor) -> torch.Tensor:
    k1, k2 = hashing.stream_keys(seed, hashing.name_id(name), DOMAIN_EXL3)
    return hashing.hash_elements(index, k1, k2)


def _signs(name: str, seed: int, lo: int, hi: int, scale: float, device) -> torch.Tensor:
    idx = torch.arange(lo, hi, dtype=torch.int64, device=device)
    bit = _hash(name, seed, idx) >> 31
    return ((1 - 2 * bit).to(torch.float32) * scale).to(torch.float16)


def trellis_block(name: str, seed: int, shape: tuple[int, int], bits: int, k_tiles: slice, n_tiles: slice,
                  device, chunk_words: int = 1 << 24) -> torch.Tensor:
    """The trellis words of tiles [k_tiles] x [n_tiles] of the logical [K, N] tensor ``name``."""
    K, N = shape
    words = TILE * bits
    n_total = N // TILE
    kt0, kt1, nt0, nt1 = k_tiles.start, k_tiles.stop, n_tiles.start, n_tiles.stop
    if (K // TILE) * n_total * words >= 1 << 32:
        raise ValueError(f"{name}: more than 2**32 trellis words is beyond the 32-bit counter")
    out = torch.empty(kt1 - kt0, nt1 - nt0, words, dtype=torch.int16, device=device)
    n_idx = torch.arange(nt0, nt1, dtype=torch.int64, device=device)[:, None] * words
    j = torch.arange(words, dtype=torch.int64, device=device)[None, :]
    step = max(1, chunk_words // ((nt1 - nt0) * words))
    for a in range(kt0, kt1, step):
        b = min(kt1, a + step)
        kt = torch.arange(a, b, dtype=torch.int64, device=device)[:, None, None]
        h = _hash(name, seed, kt * (n_total * words) + n_idx[None] + j[None]) & 0xFFFF
        out[a - kt0 : b - kt0] = (h - ((h >> 15) << 16)).to(torch.int16)  # two's complement int16
    return out


def column_parallel(parts: list[tuple[str, tuple[int, int], slice, float]], input_name: str, seed: int,
                    bits: int, device) -> Exl3Linear:
    """Output rows of one or more logical tensors (fused on N), full input.

    parts: (logical name, logical [K, N] shape, this rank's output rows, output scale).
    """
    K = parts[0][1][0]
    trellis, svh = [], []
    for name, shape, rows, scale in parts:
        _check_split(name, shape, rows, None)
        trellis.append(trellis_block(name, seed, shape, bits, slice(0, K // TILE),
                                     slice(rows.start // TILE, rows.stop // TILE), device))
        svh.append(_signs(name + ".svh", seed, rows.start, rows.stop, scale, device))
    return Exl3Linear(torch.cat(trellis, dim=1), _signs(input_name + ".suh", seed, 0, K, 1.0, device),
                      torch.cat(svh), bits)


def row_parallel(name: str, shape: tuple[int, int], cols: slice, scale: float, seed: int, bits: int,
                 device) -> Exl3Linear:
    """Input columns ``cols`` of one logical [K, N] tensor, every output (a partial sum)."""
    _check_split(name, shape, None, cols)
    K, N = shape
    return Exl3Linear(trellis_block(name, seed, shape, bits, slice(cols.start // TILE, cols.stop // TILE),
                                    slice(0, N // TILE), device),
                      _signs(name + ".suh", seed, cols.start, cols.stop, 1.0, device),
                      _signs(name + ".svh", seed, 0, N, scale, device), bits)


def _check_split(name: str, shape, rows: slice | None, cols: slice | None) -> None:
    K, N = shape
    edges = [K, N] + ([rows.start, rows.stop] if rows else []) + ([cols.start, cols.stop] if cols else [])
    bad = [e for e in edges if e % HADAMARD]
    if bad:
        raise ValueError(f"{name} [{K}, {N}]: EXL3 splits tensors on multiples of {HADAMARD} "
                         f"(its Hadamard block); {bad} is not one -- use a geometry whose shards are")


def quantize_rank(weights, g, seed: int, bits: int, head_bits: int, device, codebook: int = 0):
    """``weights`` (a RankWeights with fp16 linears) with every linear replaced by its synthetic
    EXL3 counterpart; norms, embedding and vocabulary tables stay as they are."""
    for b, flag in ((bits, "--exl3-bits"), (head_bits, "--exl3-head-bits")):
        if b not in BITS:
            raise ValueError(f"{flag} {b}: EXL3 weights here have {BITS.start} to {BITS.stop - 1} bits")
    r, H = weights.rank, g.hidden
    hq, hkv, d, m, vs = g.rank_heads, g.rank_kv_heads, g.head_dim, g.rank_mlp, g.rank_vocab

    def rows(n: int) -> slice:
        return slice(r * n, (r + 1) * n)

    inv = 1.0 / math.sqrt(H)

    def coded(w: Exl3Linear) -> Exl3Linear:  # any bit pattern is a valid state in every codebook
        return attrs.evolve(w, codebook=codebook)

    layers = []
    for i, lw in enumerate(weights.layers):
        p = f"layers.{i}."
        qkv = column_parallel([(p + "attn.q", (H, g.heads * d), rows(hq * d), inv),
                               (p + "attn.k", (H, g.kv_heads * d), rows(hkv * d), inv),
                               (p + "attn.v", (H, g.kv_heads * d), rows(hkv * d), inv)],
                              p + "attn.qkv", seed, bits, device)
        gate_up = column_parallel([(p + "mlp.gate", (H, g.mlp), rows(m), inv),
                                   (p + "mlp.up", (H, g.mlp), rows(m), inv)],
                                  p + "mlp.gate_up", seed, bits, device)
        # o's input axis is defined in the order attention writes it (group member, KV head).
        o = row_parallel(p + "attn.o", (g.heads * d, H), rows(hq * d), 1.0 / math.sqrt(g.heads * d),
                         seed, bits, device)
        down = row_parallel(p + "mlp.down", (g.mlp, H), rows(m), 1.0 / math.sqrt(g.mlp), seed, bits, device)
        layers.append(attrs.evolve(lw, qkv=coded(qkv), o=coded(o), gate_up=coded(gate_up), down=coded(down)))
    head = column_parallel([("head", (H, g.vocab), rows(vs), g.head_gain * inv)], "head", seed, head_bits, device)
    return attrs.evolve(weights, layers=layers, head=coded(head), head_fp32_cpu=None)
