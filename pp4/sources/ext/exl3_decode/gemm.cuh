// The decode GEMM kernel: partial sums of xh @ decode(trellis) for a few rows.
//
// A block of 8 warps owns 8 output tiles (128 columns) and one slice of K. The trellis words of its
// 8 tiles in each 16-row K tile are contiguous (1 KiB at 4 bits), so they stream into shared
// memory with cp.async, kStages stages of kTilesPerStage K tiles ahead of the decode. Each warp
// decodes its own column tile straight into tensor-core B fragments (decode.cuh) and multiplies
// with m16n8k16 MMAs, fp16 operands and fp32 accumulation; rows past M are zeros. Partial sums go to
// their own [split] slice: no atomics, so every run adds in the same order.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <cstdlib>

#include "decode.cuh"
#include "exl3_decode.h"

namespace pp4_exl3 {

constexpr int kWarps = 8;
constexpr int kTilesPerStage = 2;
constexpr int kStages = 4;

__device__ __forceinline__ void cp_async16(void* smem, const void* global) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(global));
}

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

// MB: 16-row MMA blocks (1: M <= 16, 2: M <= 32).
template <int BITS, int CB, int MB>
__global__ __launch_bounds__(kWarps * 32) void decode_gemm_kernel(const half* __restrict__ xh,
                                                                 const uint32_t* __restrict__ trellis,
                                                                 float* __restrict__ partials, int rows, int k,
                                                                 int n, int k_tiles_per_split, Parts parts) {
  constexpr int kTileWords = 8 * BITS;                 // 32-bit words per 16x16 tile
  constexpr int kRowWords = kWarps * kTileWords;       // a block's 8 tiles in one K tile
  constexpr int kStageWords = kTilesPerStage * kRowWords;
  constexpr int kStageChunks = kStageWords / 4;        // 16-byte copies per stage
  __shared__ __align__(16) uint32_t stage_words[kStages][kStageWords];

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = lane / 4;  // MMA fragment row (A, C) or column (B)
  const int pair = lane % 4;   // MMA fragment column pair (A, C) or row pair (B)
  const int n_tiles = n / 16;
  const int first_tile = blockIdx.x * kWarps;
  const int k_tiles = k / 16;
  const int kt_begin = blockIdx.y * k_tiles_per_split;
  const int kt_end = min(kt_begin + k_tiles_per_split, k_tiles);
  const int steps = (kt_end - kt_begin) / kTilesPerStage;

  int part = 0;
  while (part + 1 < parts.count && first_tile >= parts.tile_end[part]) ++part;
  const half* a_rows = xh + static_cast<size_t>(part) * rows * k;

  // Each thread copies at most one 16-byte chunk of a stage, at the same place in every stage: its
  // source moves on by whole steps, so the loop does one multiply-add per copy.
  static_assert(kStageChunks <= kWarps * 32, "one chunk per thread and stage");
  const bool copies = threadIdx.x < kStageChunks;
  const int copy_row = threadIdx.x / (kRowWords / 4);
  const int copy_word = copy_row * kRowWords + (threadIdx.x % (kRowWords / 4)) * 4;
  const uint32_t* copy_src = trellis + (static_cast<size_t>(kt_begin + copy_row) * n_tiles + first_tile) * kTileWords +
                             (threadIdx.x % (kRowWords / 4)) * 4;
  const size_t step_words = static_cast<size_t>(kTilesPerStage) * n_tiles * kTileWords;
  auto load_stage = [&](int slot, int step) {
    if (copies) cp_async16(&stage_words[slot][copy_word], copy_src + step * step_words);
  };

  // The A fragments' rows (group, group + 8 of each 16-row block) as pointers to this lane's column
  // pair at the split's first K tile; rows past M read as zeros.
  const unsigned int* a_ptr[MB][2];
  bool a_valid[MB][2];
#pragma unroll
  for (int mb = 0; mb < MB; ++mb)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = mb * 16 + group + 8 * h;
      a_valid[mb][h] = r < rows;
      a_ptr[mb][h] = reinterpret_cast<const unsigned int*>(
          a_rows + static_cast<size_t>(a_valid[mb][h] ? r : 0) * k + kt_begin * 16 + 2 * pair);
    }

  float acc[MB][2][4];
#pragma unroll
  for (int mb = 0; mb < MB; ++mb)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mb][h][i] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) load_stage(s, s);
    cp_async_commit();
  }

  for (int step = 0; step < steps; ++step) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = step + kStages - 1;
    if (next < steps) load_stage(next % kStages, next);
    cp_async_commit();

    const uint32_t* stage = stage_words[step % kStages];
#pragma unroll
    for (int kk = 0; kk < kTilesPerStage; ++kk) {
      const int offset = (step * kTilesPerStage + kk) * 8;  // 16 halves per K tile, in pairs
      uint32_t a[MB][4];
#pragma unroll
      for (int mb = 0; mb < MB; ++mb) {
        a[mb][0] = a_valid[mb][0] ? __ldg(a_ptr[mb][0] + offset) : 0u;      // (group, k 2*pair)
        a[mb][1] = a_valid[mb][1] ? __ldg(a_ptr[mb][1] + offset) : 0u;      // (group + 8, k 2*pair)
        a[mb][2] = a_valid[mb][0] ? __ldg(a_ptr[mb][0] + offset + 4) : 0u;  // (group, k 2*pair + 8)
        a[mb][3] = a_valid[mb][1] ? __ldg(a_ptr[mb][1] + offset + 4) : 0u;  // (group + 8, k 2*pair + 8)
      }
      uint32_t b0[2], b1[2];
      decode_lane<BITS, CB>(stage + kk * kRowWords + warp * kTileWords, lane, b0, b1);
#pragma unroll
      for (int mb = 0; mb < MB; ++mb) {
        mma_16816(acc[mb][0], a[mb], b0);
        mma_16816(acc[mb][1], a[mb], b1);
      }
    }
  }
  cp_async_wait<0>();

  float* out = partials + static_cast<size_t>(blockIdx.y) * rows * n;
  const int tile_col = (first_tile + warp) * 16 + 2 * pair;
#pragma unroll
  for (int mb = 0; mb < MB; ++mb) {
    const int r0 = mb * 16 + group;
    const int r1 = r0 + 8;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = tile_col + h * 8;
      if (r0 < rows) *reinterpret_cast<float2*>(out + static_cast<size_t>(r0) * n + c) = make_float2(acc[mb][h][0], acc[mb][h][1]);
      if (r1 < rows) *reinterpret_cast<float2*>(out + static_cast<size_t>(r1) * n + c) = make_float2(acc[mb][h][2], acc[mb][h][3]);
    }
  }
}

// K tiles per pipeline stage of the xb kernel: its per-stage work (barrier, copies, addresses) is
// spread over four tiles; a split of K is a whole number of stages (bindings.cpp).
constexpr int kXbTilesPerStage = 4;

// NB: 8-row blocks of x (1..4). The decoded tile is the MMA's A operand (its 16 rows are the tile's
// 16 output columns: the lane's B-fragment registers of decode_lane are, reordered, exactly an A
// fragment of the transposed tile) and x the B operand, 8 rows an MMA: one MMA per tile for up to 8
// rows, where a 16-row A of x would waste half of two. x's slice of each stage travels with the
// trellis words (cp.async, the same stages ahead), once per block instead of once per warp. The
// copies' shared addresses are worked out once and their sources move on by a step each.
template <int BITS, int CB, int NB>
__global__ __launch_bounds__(kWarps * 32) void decode_gemm_xb_kernel(const half* __restrict__ xh,
                                                                    const uint32_t* __restrict__ trellis,
                                                                    float* __restrict__ partials, int rows, int k,
                                                                    int n, int k_tiles_per_split, Parts parts) {
  constexpr int kTiles = kXbTilesPerStage;
  constexpr int kThreads = kWarps * 32;
  constexpr int kTileWords = 8 * BITS;
  constexpr int kRowWords = kWarps * kTileWords;   // a block's 8 tiles in one K tile
  constexpr int kRowChunks = kRowWords / 4;        // 16-byte copies
  constexpr int kStageWords = kTiles * kRowWords;
  constexpr int kStageChunks = kStageWords / 4;
  constexpr int kCopies = (kStageChunks + kThreads - 1) / kThreads;  // per thread and stage
  // x in a stage: NB * 8 rows of kTiles * 16 halves, each row padded by 4 words so that the eight
  // rows one fragment load touches fall in different banks (row stride 4 or 20 words mod 32).
  constexpr int kXRowWords = kTiles * 8 + 4;
  constexpr int kXRows = NB * 8;
  constexpr int kXRowChunks = kTiles * 2;
  constexpr int kXStageWords = kXRows * kXRowWords;
  static_assert(kXRows * kXRowChunks <= kThreads, "one x chunk per thread and stage");
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
  // Stage `slot`'s copies, from the sources' next step on.
  auto load_stage = [&](int slot) {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      if (kCopies * kThreads == kStageChunks || threadIdx.x + i * kThreads < kStageChunks)
        cp_async16_to(copy_dst[i] + slot * (kStageWords * 4), copy_src[i]);
      copy_src[i] += step_words;
    }
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

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) load_stage(s);
    cp_async_commit();
  }

  for (int step = 0; step < steps; ++step) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (step + kStages - 1 < steps) load_stage((step + kStages - 1) % kStages);
    cp_async_commit();

    const uint32_t* stage = stage_words[step % kStages] + warp * kTileWords;
    const uint32_t* xs = stage_x[step % kStages] + group * kXRowWords + pair;
#pragma unroll
    for (int kk = 0; kk < kTiles; ++kk) {
      uint32_t b[NB][2];
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        b[nb][0] = xs[nb * 8 * kXRowWords + kk * 8];      // (k 2*pair, row group)
        b[nb][1] = xs[nb * 8 * kXRowWords + kk * 8 + 4];  // (k 2*pair + 8, row group)
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
                        const Parts& parts, int splits, int k_tiles_per_split, cudaStream_t stream) {
  const dim3 grid(n / (16 * kWarps), splits);
  const dim3 block(kWarps * 32);
  const half* x = static_cast<const half*>(xh);
  const uint32_t* t = static_cast<const uint32_t*>(trellis);
  const char* choice = std::getenv("PP4_EXL3_GEMM");  // "b": the kernel before, for a side-by-side bench
  const bool tiles_as_b = choice != nullptr && choice[0] == 'b';
  if (tiles_as_b) {
    if (rows <= 16)
      decode_gemm_kernel<BITS, CB, 1><<<grid, block, 0, stream>>>(x, t, partials, rows, k, n, k_tiles_per_split, parts);
    else
      decode_gemm_kernel<BITS, CB, 2><<<grid, block, 0, stream>>>(x, t, partials, rows, k, n, k_tiles_per_split, parts);
    return;
  }
  if (rows <= 8)
    decode_gemm_xb_kernel<BITS, CB, 1><<<grid, block, 0, stream>>>(x, t, partials, rows, k, n, k_tiles_per_split, parts);
  else if (rows <= 16)
    decode_gemm_xb_kernel<BITS, CB, 2><<<grid, block, 0, stream>>>(x, t, partials, rows, k, n, k_tiles_per_split, parts);
  else if (rows <= 24)
    decode_gemm_xb_kernel<BITS, CB, 3><<<grid, block, 0, stream>>>(x, t, partials, rows, k, n, k_tiles_per_split, parts);
  else
    decode_gemm_xb_kernel<BITS, CB, 4><<<grid, block, 0, stream>>>(x, t, partials, rows, k, n, k_tiles_per_split, parts);
}

// One codebook's kernels for 2..8 bits; false where there is none.
template <int CB>
bool dispatch_decode_gemm(int bits, const void* xh, const void* trellis, float* partials, int rows, int k, int n,
                          const Parts& parts, int splits, int k_tiles_per_split, cudaStream_t stream) {
  return with_bits(bits, [&](auto b) {
    launch_decode_gemm<decltype(b)::value, CB>(xh, trellis, partials, rows, k, n, parts, splits, k_tiles_per_split,
                                               stream);
  });
}

}  // namespace pp4_exl3
