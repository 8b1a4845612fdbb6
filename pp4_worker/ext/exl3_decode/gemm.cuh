// The decode GEMM kernel: partial sums of xh @ decode(trellis) for a few rows.
//
// A block of 8 warps owns 8 output tiles (128 columns) and one slice of K. The trellis words of its
// 8 tiles in each 16-row K tile are contiguous (1 KiB at 4 bits), so they stream into shared
// memory with cp.async, three or four stages of four K tiles ahead of the decode, together with
// x's slice of those K tiles. Each warp decodes its own column tile straight into tensor-core
// fragments (decode.cuh) and multiplies with m16n8k16 MMAs, fp16 operands and fp32 accumulation,
// the tile as the MMA's A operand and 8 rows of x as its B operand (rows past M are zeros). Partial
// sums go to their own [split] slice: no atomics, so every run adds in the same order.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "decode.cuh"
#include "exl3_decode.h"
#include "launch.cuh"

namespace pp4_exl3 {

constexpr int kWarps = 8;

__device__ __forceinline__ void cp_async16_to(uint32_t shared_address, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address), "l"(global));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8x8 matrices of halves from shared memory, lane i naming the address of row i % 8 of matrix
// i / 8; lane t receives row t / 4, columns 2(t % 4) and +1 of each: with x's rows as the rows and K
// as the columns, one B fragment register of the MMA per matrix.
__device__ __forceinline__ void load_matrices_x4(uint32_t (&r)[4], uint32_t shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address));
}

// K tiles per pipeline stage: the per-stage work (barrier, copies, addresses) is spread over four
// tiles; a split of K is a whole number of stages (bindings.cpp).
constexpr int kTilesPerStage = 4;

// NB: 8-row blocks of x (1..4). The decoded tile is the MMA's A operand (its 16 rows are the tile's
// 16 output columns: the registers decode_lane fills as B fragments of the tile are, reordered,
// exactly an A fragment of the transposed tile) and x the B operand, 8 rows an MMA: one MMA per
// tile for up to 8 rows, where x as a 16-row A would waste half of two. x's slice of each stage is
// copied once per block, not loaded by every warp; the copies' shared addresses are worked out
// once and their sources move on by a step each (bench/worker/exl3_decode_sass.py counts the loop).
template <int BITS, int CB, int NB>
__global__ __launch_bounds__(kWarps * 32) void decode_gemm_kernel(const half* __restrict__ xh,
                                                                 const uint32_t* __restrict__ trellis,
                                                                 float* __restrict__ partials, int rows, int k,
                                                                 int n, int k_tiles_per_split, Parts parts) {
  constexpr int kTiles = kTilesPerStage;
  constexpr int kThreads = kWarps * 32;
  constexpr int kTileWords = 8 * BITS;
  constexpr int kRowWords = kWarps * kTileWords;   // a block's 8 tiles in one K tile
  constexpr int kRowChunks = kRowWords / 4;        // 16-byte copies
  constexpr int kStageWords = kTiles * kRowWords;
  constexpr int kStageChunks = kStageWords / 4;
  constexpr int kCopies = (kStageChunks + kThreads - 1) / kThreads;  // per thread and stage
  // x in a stage: NB * 8 rows of kTiles * 16 halves, each row padded by 4 words so that the eight
  // rows one fragment load touches fall in different banks (a row is 36 words: 4 apart mod 32).
  constexpr int kXRowWords = kTiles * 8 + 4;
  constexpr int kXRows = NB * 8;
  constexpr int kXRowChunks = kTiles * 2;
  constexpr int kXStageWords = kXRows * kXRowWords;
  static_assert(kXRows * kXRowChunks <= kThreads, "one x chunk per thread and stage");
  static_assert(kTiles % 2 == 0, "x's fragments load two K tiles at a time");
  // Four stages where they fit in the 48 KiB of static shared memory a block may have, else three
  // (8 bits with 32 rows).
  constexpr int kStages = 4 * (kStageWords + kXStageWords) * 4 <= 48 * 1024 ? 4 : 3;
  __shared__ __align__(16) uint32_t stage_words[kStages][kStageWords];
  __shared__ __align__(16) uint32_t stage_x[kStages][kXStageWords];

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = lane / 4;  // A: tile column (and +8); B: x row within the block; C: tile column
  const int pair = lane % 4;   // A, B: K pair; C: x row pair
  const int n_tiles = n / 16;
  const int first_tile = blockIdx.x * kWarps;
  const int k_tiles = k / 16;
  const int kt_begin = blockIdx.y * k_tiles_per_split;
  const int kt_end = min(kt_begin + k_tiles_per_split, k_tiles);
  const int steps = (kt_end - kt_begin) / kTiles;

  int part = 0;
  while (part + 1 < parts.count && first_tile >= parts.tile_end[part]) ++part;
  const half* x_rows = xh + static_cast<size_t>(part) * rows * k;

  const uint32_t words_base = static_cast<uint32_t>(__cvta_generic_to_shared(&stage_words[0][0]));
  const uint32_t x_base = static_cast<uint32_t>(__cvta_generic_to_shared(&stage_x[0][0]));
  const size_t step_words = static_cast<size_t>(kTiles) * n_tiles * kTileWords;
  uint32_t copy_dst[kCopies];
  const uint32_t* copy_src[kCopies];
#pragma unroll
  for (int i = 0; i < kCopies; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int row = c / kRowChunks, chunk = c % kRowChunks;
    copy_dst[i] = words_base + 4u * (row * kRowWords + chunk * 4);
    copy_src[i] = trellis + (static_cast<size_t>(kt_begin + row) * n_tiles + first_tile) * kTileWords + chunk * 4;
  }
  const int x_row = threadIdx.x / kXRowChunks;
  const int x_chunk = threadIdx.x % kXRowChunks;
  const bool copies_x = x_row < kXRows && x_row < rows;
  const uint32_t x_dst = x_base + 4u * (x_row * kXRowWords + x_chunk * 4);
  const half* x_src = x_rows + static_cast<size_t>(copies_x ? x_row : 0) * k + kt_begin * 16 + x_chunk * 8;
  // Where this lane's row of the fragment loads starts: row lane % 8 of matrix lane / 8, the
  // matrices (K tile, K half) = (0, 0), (0, 1), (1, 0), (1, 1).
  const uint32_t x_fragments = x_base + 4u * ((lane % 8) * kXRowWords + (lane / 16) * 8 + ((lane / 8) % 2) * 4);
  // Stage `slot`'s copies, from the sources' next step on: the trellis words, then x's slice.
  auto load_words = [&](int slot) {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      if (kCopies * kThreads == kStageChunks || threadIdx.x + i * kThreads < kStageChunks)
        cp_async16_to(copy_dst[i] + slot * (kStageWords * 4), copy_src[i]);
      copy_src[i] += step_words;
    }
  };
  auto load_x = [&](int slot) {
    if (copies_x) cp_async16_to(x_dst + slot * (kXStageWords * 4), x_src);
    x_src += kTiles * 16;
  };
  // Rows past M are zeros in every stage (no copy ever writes them); the loop's first barrier
  // orders these stores before any read.
  if (x_row < kXRows && !copies_x) {
#pragma unroll
    for (int slot = 0; slot < kStages; ++slot)
      *reinterpret_cast<uint4*>(&stage_x[slot][x_row * kXRowWords + x_chunk * 4]) = make_uint4(0u, 0u, 0u, 0u);
  }

  float acc[NB][4];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nb][i] = 0.0f;

  // The first stages' trellis words are on their way before the input transform has finished
  // (launch.cuh); x only after it. Stage s's words and x are both in commit group s or earlier.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < steps) load_words(s);
  wait_for_predecessor();
  let_successor_launch();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) load_x(s);
    cp_async_commit();
  }

  for (int step = 0; step < steps; ++step) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (step + kStages - 1 < steps) {
      load_words((step + kStages - 1) % kStages);
      load_x((step + kStages - 1) % kStages);
    }
    cp_async_commit();

    const uint32_t* stage = stage_words[step % kStages] + warp * kTileWords;
    const uint32_t xs = x_fragments + (step % kStages) * (kXStageWords * 4);
    uint32_t bx[NB][4];
#pragma unroll
    for (int kk = 0; kk < kTiles; ++kk) {
      // Two K tiles' B fragments of each 8-row block in one load: (k 2*pair, row group), (k 2*pair
      // + 8, row group) of K tile kk, then of kk + 1.
      if (kk % 2 == 0) {
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) load_matrices_x4(bx[nb], xs + 4u * (nb * 8 * kXRowWords + kk * 8));
      }
      uint32_t b[NB][2];
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        b[nb][0] = bx[nb][(kk % 2) * 2];
        b[nb][1] = bx[nb][(kk % 2) * 2 + 1];
      }
      uint32_t w0[2], w1[2];
      decode_lane<BITS, CB>(stage + kk * kRowWords, lane, w0, w1);
      // (column group, k 2p), (column group + 8, k 2p), (group, k 2p + 8), (group + 8, k 2p + 8)
      const uint32_t a[4] = {w0[0], w1[0], w0[1], w1[1]};
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) mma_16816(acc[nb], a, b[nb]);
    }
  }
  cp_async_wait<0>();

  float* out = partials + static_cast<size_t>(blockIdx.y) * rows * n;
  const int col = (first_tile + warp) * 16 + group;
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
    const int r = nb * 8 + 2 * pair;
    if (r < rows) {
      out[static_cast<size_t>(r) * n + col] = acc[nb][0];
      out[static_cast<size_t>(r) * n + col + 8] = acc[nb][2];
    }
    if (r + 1 < rows) {
      out[static_cast<size_t>(r + 1) * n + col] = acc[nb][1];
      out[static_cast<size_t>(r + 1) * n + col + 8] = acc[nb][3];
    }
  }
}

template <int BITS, int CB>
void launch_decode_gemm(const void* xh, const void* trellis, float* partials, int rows, int k, int n,
                        const Parts& parts, int splits, int k_tiles_per_split, cudaStream_t stream, bool pdl) {
  const dim3 grid(n / (16 * kWarps), splits);
  const dim3 block(kWarps * 32);
  const half* x = static_cast<const half*>(xh);
  const uint32_t* t = static_cast<const uint32_t*>(trellis);
  if (rows <= 8)
    launch_after(pdl, decode_gemm_kernel<BITS, CB, 1>, grid, block, stream, x, t, partials, rows, k, n, k_tiles_per_split, parts);
  else if (rows <= 16)
    launch_after(pdl, decode_gemm_kernel<BITS, CB, 2>, grid, block, stream, x, t, partials, rows, k, n, k_tiles_per_split, parts);
  else if (rows <= 24)
    launch_after(pdl, decode_gemm_kernel<BITS, CB, 3>, grid, block, stream, x, t, partials, rows, k, n, k_tiles_per_split, parts);
  else
    launch_after(pdl, decode_gemm_kernel<BITS, CB, 4>, grid, block, stream, x, t, partials, rows, k, n, k_tiles_per_split, parts);
}

// One codebook's kernels for 2..8 bits; false where there is none.
template <int CB>
bool dispatch_decode_gemm(int bits, const void* xh, const void* trellis, float* partials, int rows, int k, int n,
                          const Parts& parts, int splits, int k_tiles_per_split, cudaStream_t stream, bool pdl) {
  return with_bits(bits, [&](auto b) {
    launch_decode_gemm<decltype(b)::value, CB>(xh, trellis, partials, rows, k, n, parts, splits, k_tiles_per_split,
                                               stream, pdl);
  });
}

}  // namespace pp4_exl3
