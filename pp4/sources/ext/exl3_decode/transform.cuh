// The two 128-point Hadamard transforms around the decode GEMM, and the output side's one row of
// one 128-column group as a warp computes it: by the output transform kernel (ops.cu), or by the
// GEMM's last block of a column group when the GEMM finishes the output itself (gemm.cuh).
#pragma once

#include <cuda_fp16.h>

#include <cstddef>

namespace pp4_exl3 {

constexpr float kHadScale = 0.088388347648f;  // 1/sqrt(128)

// The 128-point Sylvester-Hadamard transform of the 4 values each lane holds (elements 4t..4t+3),
// in the order of additions exllamav3's had_r_128 uses: a 4-point transform in the lane, then the
// butterflies across lanes 1, 2, 4, 8, 16 apart.
__device__ __forceinline__ void hadamard128(float& h0, float& h1, float& h2, float& h3, int lane) {
  const float s0 = h0 + h1, d0 = h0 - h1, s1 = h2 + h3, d1 = h2 - h3;
  h0 = s0 + s1;
  h1 = d0 + d1;
  h2 = s0 - s1;
  h3 = d0 - d1;
#pragma unroll
  for (int i = 1; i < 32; i <<= 1) {
    const float p0 = __shfl_xor_sync(0xffffffffu, h0, i);
    const float p1 = __shfl_xor_sync(0xffffffffu, h1, i);
    const float p2 = __shfl_xor_sync(0xffffffffu, h2, i);
    const float p3 = __shfl_xor_sync(0xffffffffu, h3, i);
    if (lane & i) {  // the upper half of the butterfly: partner - own
      h0 = -h0 + p0;
      h1 = -h1 + p1;
      h2 = -h2 + p2;
      h3 = -h3 + p3;
    } else {
      h0 = h0 + p0;
      h1 = h1 + p1;
      h2 = h2 + p2;
      h3 = h3 + p3;
    }
  }
}

// out[row, col0 .. col0+127] = had128(sum_s partials[s, row, ...]) / sqrt(128) * svh, one warp, the
// splits added in order (so every run and either path give the same bits). Lane t: columns
// col0 + 4t .. +3. kFromOtherBlocks: partials another block may have written in this same kernel are
// read past L1 (which is not coherent across SMs).
template <typename Out, bool kFromOtherBlocks>
__device__ __forceinline__ void finish_row(const float* __restrict__ partials, const half* __restrict__ svh,
                                           Out* __restrict__ out, int splits, int rows, int n, int row, int col0,
                                           int lane) {
  const int col = col0 + 4 * lane;
  auto load = [&](int s) {
    const float4* p = reinterpret_cast<const float4*>(partials + (static_cast<size_t>(s) * rows + row) * n + col);
    if constexpr (kFromOtherBlocks)
      return __ldcg(p);
    else
      return *p;
  };
  float4 sum = load(0);
  for (int s = 1; s < splits; ++s) {
    const float4 p = load(s);
    sum.x += p.x;
    sum.y += p.y;
    sum.z += p.z;
    sum.w += p.w;
  }
  hadamard128(sum.x, sum.y, sum.z, sum.w, lane);
  const float v[4] = {sum.x, sum.y, sum.z, sum.w};
  Out* dst = out + static_cast<size_t>(row) * n + col;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float y = v[i] * kHadScale * __half2float(svh[col + i]);
    if constexpr (sizeof(Out) == 4)
      dst[i] = y;
    else
      dst[i] = __float2half_rn(y);
  }
}

}  // namespace pp4_exl3
