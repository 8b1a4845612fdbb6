"""The Triton skinny GEMM (``--gemm triton``): its tile plan and its launch.

A draft pass multiplies 1-20 rows by matrices of 17-117 MB, so every linear is a stream of
its weight and nothing else; what decides its speed is whether enough programs keep enough
loads in flight on every SM, and whether a reduce kernel follows.  The plan depends on the
shape only (never on the GPU or on timing), so a process always picks the same tiles and
split, and with them the same bits: the gate's digests stay valid from one run to the next.
"""
from __future__ import annotations

import attrs
import torch

# Programs per launch the plan aims for: about two strips for each of an H200's 132 SMs.
# bench/worker/gemm_shapes.py on the H200 (revision 6): down (K 7168) is fastest at 2 splits (256
# programs, 0.93x cuBLAS's time over 1-20 rows), qkv (K 4096) at 4 (384, 0.94x); aiming at
# 384 put down at 4 splits, 1.33x cuBLAS at 20 rows.
TARGET_PROGRAMS = 256
MAX_SPLITS = 8
# Shorter strips lose to cuBLAS at every split: o (K 2048) took 1.01-1.14x cuBLAS's time with
# none, more with splits.  Such matrices stay with cuBLAS.
MIN_K = 4096


def takes(rows: int, k: int) -> bool:
    """Whether the skinny GEMM runs this product (else cuBLAS does)."""
    return rows <= SkinnyGemm.MAX_ROWS and k >= MIN_K and k % 128 == 0


@attrs.frozen
class SkinnyTiles:
    """One launch's tiles: BLOCK_N output columns per program, BLOCK_K deep per load, K cut
    into ``splits`` strips (added in order by the last program of each column block)."""

    block_n: int
    block_k: int
    splits: int
    num_warps: int = 4
    num_stages: int = 5


# A matrix this many columns wide (the head: 64,128 per rank) has thousands of strips without a
# split; bench/worker/gemm_shapes.py on the H200 (revision 6) had 64-column, 256-deep tiles at 3
# stages fastest there over 1-4 rows (123 us, 4.27 TB/s, 0.88x cuBLAS's time).
WIDE_N = 32768
WIDE_TILES = SkinnyTiles(64, 256, 1, 4, 3)


def plan(rows: int, n: int, k: int, block_n: int = 32, block_k: int = 128) -> SkinnyTiles:
    """The smallest split (a power of two, K divisible into BLOCK_K multiples) that brings the
    launch to TARGET_PROGRAMS programs; no split where the column blocks alone are enough."""
    del rows  # the tiles do not depend on the row count, so pass 0 and later passes agree
    if n >= WIDE_N and k % WIDE_TILES.block_k == 0:
        return WIDE_TILES
    blocks = -(-n // block_n)
    splits = 1
    while (blocks * splits < TARGET_PROGRAMS and splits < MAX_SPLITS
           and k % (2 * splits * block_k) == 0):
        splits *= 2
    return SkinnyTiles(block_n, block_k, splits)


class SkinnyGemm:
    """Launches ``skinny_linear_kernel``; holds the split counters (zero between launches:
    the last program of each column block resets its own). Each weight matrix has counters of
    its own, so that two ranks' GEMMs running at once on two streams never share one."""

    MAX_ROWS = 64
    # Allocated once, up front: a buffer first made inside a graph capture would be the graph's.
    MAX_COLUMN_BLOCKS = 1 << 16

    def __init__(self, kernels, device: torch.device, launch: dict | None = None):
        self.k = kernels
        self.launch = launch or {}  # the backend's launch options (--pdl)
        self.counters = torch.zeros(self.MAX_COLUMN_BLOCKS, dtype=torch.int32, device=device)
        self._first_counter: dict[tuple, int] = {}  # (weight's address, blocks) -> its first counter
        self._counters_used = 0

    def counters_for(self, weight: torch.Tensor, blocks: int) -> torch.Tensor:
        """The weight's own counters, given out on its first product (the worker's weights live
        as long as the model, so their counters are never given back)."""
        key = (weight.data_ptr(), blocks)
        start = self._first_counter.get(key)
        if start is None:
            if self._counters_used + blocks > self.MAX_COLUMN_BLOCKS:
                raise ValueError(f"split counters for more than {self.MAX_COLUMN_BLOCKS} column blocks of "
                                 "split weights in all")
            start = self._first_counter[key] = self._counters_used
            self._counters_used += blocks
        return self.counters[start : start + blocks]

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, tiles: SkinnyTiles | None = None,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """x [M, K] @ weight[N, K]^T, accumulated in fp32 and stored as out_dtype (x's by default)."""
        M, K = x.shape
        N = weight.shape[0]
        if M > self.MAX_ROWS:
            raise ValueError(f"skinny GEMM takes at most {self.MAX_ROWS} rows, got {M}")
        tiles = tiles or plan(M, N, K)
        k_per_split = K // tiles.splits
        if K % tiles.splits or k_per_split % tiles.block_k:
            raise ValueError(f"K={K} does not cut into {tiles.splits} splits of whole {tiles.block_k}-deep blocks")
        if x.stride(-1) != 1:
            x = x.contiguous()
        blocks = -(-N // tiles.block_n)
        if blocks > self.MAX_COLUMN_BLOCKS:
            raise ValueError(f"{N} columns make {blocks} column blocks; at most {self.MAX_COLUMN_BLOCKS}")
        y = torch.empty(M, N, dtype=out_dtype or x.dtype, device=x.device)
        part = (torch.empty(tiles.splits, M, N, dtype=torch.float32, device=x.device)
                if tiles.splits > 1 else y)
        counters = self.counters_for(weight, blocks) if tiles.splits > 1 else self.counters
        self.k.skinny_linear_kernel[(blocks, tiles.splits)](
            x, weight, y, part, counters, M, N, K, x.stride(0), k_per_split, tiles.splits,
            BLOCK_M=max(16, self.k.next_power_of_2(M)), BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages, **self.launch)
        return y
