// The steps around the decode GEMM: the two Hadamard transforms, the decode alone (for tests), and
// the choice of kernel by bits and codebook. Nothing runs at import: a CUDA context is created only
// when a function is called.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "decode.cuh"
#include "exl3_decode.h"
#include "launch.cuh"

namespace pp4_exl3 {

bool decode_gemm_3inst(int, const void*, const void*, float*, int, int, int, const Parts&, int, int, cudaStream_t, bool);
bool decode_gemm_mcg(int, const void*, const void*, float*, int, int, int, const Parts&, int, int, cudaStream_t, bool);
bool decode_gemm_mul1(int, const void*, const void*, float*, int, int, int, const Parts&, int, int, cudaStream_t, bool);

namespace {

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

// The partial sums [splits, M, N] of four output columns from col on, added in split order.
__device__ __forceinline__ float4 split_sum(const float* __restrict__ partials, int splits, int rows, int n, int row,
                                            int col) {
  float4 sum = *reinterpret_cast<const float4*>(partials + static_cast<size_t>(row) * n + col);
  for (int s = 1; s < splits; ++s) {
    const float4 p = *reinterpret_cast<const float4*>(partials + (static_cast<size_t>(s) * rows + row) * n + col);
    sum.x += p.x;
    sum.y += p.y;
    sum.z += p.z;
    sum.w += p.w;
  }
  return sum;
}

// out[col..col+3] = had128(h * sign) / sqrt(128) for the lane's four values h01, h23 of a 128-block,
// sign the part's suh and out its row of xh: the input transform, in fp16 as EXL3's had_r_128.
__device__ __forceinline__ void transform_lane(half2 h01, half2 h23, const half* __restrict__ sign_part,
                                               half* __restrict__ out_row, int col, int lane) {
  const half2* sign = reinterpret_cast<const half2*>(sign_part + col);
  const half2 v01 = __hmul2(h01, sign[0]);
  const half2 v23 = __hmul2(h23, sign[1]);
  float h0 = __low2float(v01), h1 = __high2float(v01), h2 = __low2float(v23), h3 = __high2float(v23);
  hadamard128(h0, h1, h2, h3, lane);
  half2* out = reinterpret_cast<half2*>(out_row + col);
  out[0] = __floats2half2_rn(h0 * kHadScale, h1 * kHadScale);
  out[1] = __floats2half2_rn(h2 * kHadScale, h3 * kHadScale);
}

// grid (K/128, M, parts), one warp: xh[p, m, block] = had128(x[m, block] * suh[p, block]) / sqrt(128).
__global__ __launch_bounds__(32) void input_transform_kernel(const half* __restrict__ x, const half* __restrict__ suh,
                                                             half* __restrict__ xh, int rows, int k) {
  wait_for_predecessor();  // x is the kernel before's output
  let_successor_launch();
  const int lane = threadIdx.x;
  const int col = blockIdx.x * 128 + 4 * lane;
  const int row = blockIdx.y;
  const int part = blockIdx.z;
  const half2* in = reinterpret_cast<const half2*>(x + static_cast<size_t>(row) * k + col);
  transform_lane(in[0], in[1], suh + static_cast<size_t>(part) * k, xh + (static_cast<size_t>(part) * rows + row) * k,
                 col, lane);
}

// xh[p, m, block] for every part p of suh: the input transform of the lane's 4 values h, which end
// the fused kernels below (h is the next linear's input, so its own input transform is not launched).
__device__ __forceinline__ void transform_into(const half (&h)[4], const half* __restrict__ suh, half* __restrict__ xh,
                                               int parts, int rows, int row, int k, int col, int lane) {
  for (int p = 0; p < parts; ++p)
    transform_lane(__halves2half2(h[0], h[1]), __halves2half2(h[2], h[3]), suh + static_cast<size_t>(p) * k,
                   xh + (static_cast<size_t>(p) * rows + row) * k, col, lane);
}

// grid (N/128, M), one warp: out[m, block] = had128(sum_s partials[s, m, block]) / sqrt(128) * svh[block].
template <typename Out>
__global__ __launch_bounds__(32) void output_transform_kernel(const float* __restrict__ partials,
                                                              const half* __restrict__ svh, Out* __restrict__ out,
                                                              int splits, int rows, int n) {
  wait_for_predecessor();  // the partials are the GEMM's output
  let_successor_launch();
  const int lane = threadIdx.x;
  const int col = blockIdx.x * 128 + 4 * lane;
  const int row = blockIdx.y;
  float4 sum = split_sum(partials, splits, rows, n, row, col);
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

// grid (M), a warp per 128 columns (BLOCKS of them each): the all-reduce of the two ranks' partials,
// the residual add, the rms norm and the next linear's input transform in one kernel, with the
// roundings of the worker's residual_sum_norm_kernel: r = fp16(p0 + p1), then fp16(x + r) where x
// is given; r is written to x_out where given; the norm works in fp32 on r and rounds once.
template <int BLOCKS>
__global__ __launch_bounds__(1024) void norm_transform_kernel(const half* __restrict__ x, const half* __restrict__ p0,
                                                              const half* __restrict__ p1, const half* __restrict__ w,
                                                              const half* __restrict__ suh, half* __restrict__ x_out,
                                                              half* __restrict__ xh, int parts, int rows, int h,
                                                              float eps) {
  wait_for_predecessor();  // the partials and x are earlier kernels' outputs
  let_successor_launch();
  __shared__ float warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int row = blockIdx.x;
  const size_t at = static_cast<size_t>(row) * h;
  float v[BLOCKS][4];
  float squares = 0.0f;
#pragma unroll
  for (int i = 0; i < BLOCKS; ++i) {
    const int col = (warp + i * warps) * 128 + 4 * lane;
    if (col >= h) continue;
    const uint2 a = *reinterpret_cast<const uint2*>(p0 + at + col);
    const uint2 b = *reinterpret_cast<const uint2*>(p1 + at + col);
    const half* pa = reinterpret_cast<const half*>(&a);
    const half* pb = reinterpret_cast<const half*>(&b);
    uint2 held = x != nullptr ? *reinterpret_cast<const uint2*>(x + at + col) : make_uint2(0u, 0u);
    const half* px = reinterpret_cast<const half*>(&held);
    uint2 written;
    half* r = reinterpret_cast<half*>(&written);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      r[j] = __float2half_rn(__half2float(pa[j]) + __half2float(pb[j]));
      if (x != nullptr) r[j] = __float2half_rn(__half2float(px[j]) + __half2float(r[j]));
      v[i][j] = __half2float(r[j]);
      squares += v[i][j] * v[i][j];
    }
    if (x_out != nullptr) *reinterpret_cast<uint2*>(x_out + at + col) = written;
  }
#pragma unroll
  for (int i = 16; i > 0; i >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, i);
  if (lane == 0) warp_sums[warp] = squares;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < warps; ++i) total += warp_sums[i];  // the same order in every thread
  const float inv = 1.0f / sqrtf(total / h + eps);
#pragma unroll
  for (int i = 0; i < BLOCKS; ++i) {
    const int col = (warp + i * warps) * 128 + 4 * lane;
    if (col >= h) continue;
    half n[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) n[j] = __float2half_rn(v[i][j] * inv * __half2float(w[col + j]));
    transform_into(n, suh, xh, parts, rows, row, h, col, lane);
  }
}

// grid (C/128, M), one warp: gate_up's output transform (its partial sums over N = 2C columns, gate
// then up), silu(gate) * up, and down's input transform, with the roundings of the three steps run
// apart: gate and up rounded to fp16 as output_transform_kernel writes them, the product computed in
// fp32 and rounded once as the worker's silu_mul_kernel does.
__global__ __launch_bounds__(32) void swiglu_transform_kernel(const float* __restrict__ partials,
                                                              const half* __restrict__ svh,
                                                              const half* __restrict__ suh_down,
                                                              half* __restrict__ xh_down, int splits, int rows,
                                                              int channels) {
  wait_for_predecessor();  // the partials are the GEMM's output
  let_successor_launch();
  const int lane = threadIdx.x;
  const int col = blockIdx.x * 128 + 4 * lane;
  const int row = blockIdx.y;
  const int n = 2 * channels;
  float4 g = split_sum(partials, splits, rows, n, row, col);
  float4 u = split_sum(partials, splits, rows, n, row, channels + col);
  hadamard128(g.x, g.y, g.z, g.w, lane);
  hadamard128(u.x, u.y, u.z, u.w, lane);
  const float gv[4] = {g.x, g.y, g.z, g.w}, uv[4] = {u.x, u.y, u.z, u.w};
  half act[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float gate = __half2float(__float2half_rn(gv[i] * kHadScale * __half2float(svh[col + i])));
    const float up = __half2float(__float2half_rn(uv[i] * kHadScale * __half2float(svh[channels + col + i])));
    act[i] = __float2half_rn(gate / (1.0f + expf(-gate)) * up);
  }
  transform_into(act, suh_down, xh_down, 1, rows, row, channels, col, lane);
}

// grid (N/16, K/16), one warp: tile (kt, nt) of W [K, N], row-major, from its bitstream.
template <int BITS, int CB>
__global__ __launch_bounds__(32) void reconstruct_kernel(const uint32_t* __restrict__ trellis, half* __restrict__ w,
                                                         int n) {
  constexpr int kTileWords = 8 * BITS;
  const int lane = threadIdx.x;
  const int nt = blockIdx.x, kt = blockIdx.y;
  __shared__ uint32_t words[kTileWords];
  const uint32_t* src = trellis + (static_cast<size_t>(kt) * gridDim.x + nt) * kTileWords;
  for (int i = lane; i < kTileWords; i += 32) words[i] = src[i];
  __syncwarp();
  uint32_t b0[2], b1[2];
  decode_lane<BITS, CB>(words, lane, b0, b1);
  const int row = kt * 16 + 2 * (lane % 4);
  const int col = nt * 16 + lane / 4;
  const uint32_t frags[4] = {b0[0], b0[1], b1[0], b1[1]};
#pragma unroll
  for (int f = 0; f < 4; ++f) {
    const half2 d = *reinterpret_cast<const half2*>(&frags[f]);
    const int r = row + (f % 2) * 8;  // (rows 2(t%4), +1) then (+8, +9)
    const int c = col + (f / 2) * 8;  // column t/4, then t/4 + 8
    w[static_cast<size_t>(r) * n + c] = __low2half(d);
    w[static_cast<size_t>(r + 1) * n + c] = __high2half(d);
  }
}

template <int CB>
bool launch_reconstruct(int bits, const void* trellis, void* w, int k, int n, cudaStream_t stream) {
  const dim3 grid(n / 16, k / 16);
  return with_bits(bits, [&](auto b) {
    reconstruct_kernel<decltype(b)::value, CB>
        <<<grid, 32, 0, stream>>>(static_cast<const uint32_t*>(trellis), static_cast<half*>(w), n);
  });
}

thread_local const char* g_last_error = nullptr;

void note_launch() {
  const cudaError_t err = cudaGetLastError();
  g_last_error = err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace

bool supported(int bits, int codebook) { return bits >= 2 && bits <= 8 && codebook >= 0 && codebook <= 2; }

const char* last_error() { return g_last_error; }

void input_transform(const void* x, const void* suh, void* xh, int parts, int rows, int k, void* stream, bool pdl) {
  const dim3 grid(k / 128, rows, parts);
  launch_after(pdl, input_transform_kernel, grid, dim3(32), static_cast<cudaStream_t>(stream), static_cast<const half*>(x),
               static_cast<const half*>(suh), static_cast<half*>(xh), rows, k);
  note_launch();
}

void decode_gemm(const void* xh, const void* trellis, float* partials, int rows, int k, int n, int bits,
                 int codebook, const Parts& parts, int splits, int k_tiles_per_split, void* stream, bool pdl) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  bool ok = false;
  if (codebook == k3Inst) ok = decode_gemm_3inst(bits, xh, trellis, partials, rows, k, n, parts, splits, k_tiles_per_split, s, pdl);
  if (codebook == kMcg) ok = decode_gemm_mcg(bits, xh, trellis, partials, rows, k, n, parts, splits, k_tiles_per_split, s, pdl);
  if (codebook == kMul1) ok = decode_gemm_mul1(bits, xh, trellis, partials, rows, k, n, parts, splits, k_tiles_per_split, s, pdl);
  if (!ok) {
    g_last_error = "no decode GEMM kernel for these bits and codebook";
    return;
  }
  note_launch();
}

void output_transform(const float* partials, const void* svh, void* out, bool out_fp32, int splits, int rows, int n,
                      void* stream, bool pdl) {
  const dim3 grid(n / 128, rows);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (out_fp32)
    launch_after(pdl, output_transform_kernel<float>, grid, dim3(32), s, partials, static_cast<const half*>(svh),
                 static_cast<float*>(out), splits, rows, n);
  else
    launch_after(pdl, output_transform_kernel<half>, grid, dim3(32), s, partials, static_cast<const half*>(svh),
                 static_cast<half*>(out), splits, rows, n);
  note_launch();
}

void norm_transform(const void* x, const void* p0, const void* p1, const void* weight, const void* suh, void* x_out,
                    void* xh, int parts, int rows, int h, float eps, void* stream, bool pdl) {
  const int blocks = h / 128;
  const int warps = blocks < 32 ? blocks : 32;
  const int per_warp = (blocks + warps - 1) / warps;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const auto launch = [&](auto kernel) {
    launch_after(pdl, kernel, dim3(rows), dim3(32 * warps), s, static_cast<const half*>(x), static_cast<const half*>(p0),
                 static_cast<const half*>(p1), static_cast<const half*>(weight), static_cast<const half*>(suh),
                 static_cast<half*>(x_out), static_cast<half*>(xh), parts, rows, h, eps);
  };
  if (per_warp == 1)
    launch(norm_transform_kernel<1>);
  else if (per_warp == 2)
    launch(norm_transform_kernel<2>);
  else if (per_warp <= 4)
    launch(norm_transform_kernel<4>);
  else {
    g_last_error = "norm_transform takes at most 16384 columns";
    return;
  }
  note_launch();
}

void swiglu_transform(const float* partials, const void* svh, const void* suh_down, void* xh_down, int splits,
                      int rows, int channels, void* stream, bool pdl) {
  launch_after(pdl, swiglu_transform_kernel, dim3(channels / 128, rows), dim3(32), static_cast<cudaStream_t>(stream),
               partials, static_cast<const half*>(svh), static_cast<const half*>(suh_down),
               static_cast<half*>(xh_down), splits, rows, channels);
  note_launch();
}

void reconstruct(const void* trellis, void* w, int k, int n, int bits, int codebook, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  bool ok = false;
  if (codebook == k3Inst) ok = launch_reconstruct<0>(bits, trellis, w, k, n, s);
  if (codebook == kMcg) ok = launch_reconstruct<1>(bits, trellis, w, k, n, s);
  if (codebook == kMul1) ok = launch_reconstruct<2>(bits, trellis, w, k, n, s);
  if (!ok) {
    g_last_error = "no decode kernel for these bits and codebook";
    return;
  }
  note_launch();
}

}  // namespace pp4_exl3
