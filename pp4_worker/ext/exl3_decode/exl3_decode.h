// pp4's EXL3 decode GEMM for a few rows (the draft worker's 1 to 20), on raw device pointers.
// bindings.cpp puts torch tensors on top, so nvcc's translation units stay free of torch's headers.
//
// An EXL3 linear of K inputs and N outputs (y = x @ W) is held as exllamav3 1.6.5 writes it:
//   trellis int16 [K/16, N/16, 16*bits]  one bitstream per 16x16 tile, `bits` bits per weight;
//   suh fp16 [K]                         input signs, before a 128-wide Hadamard transform;
//   svh fp16 [N]                         output signs and scales, after the other transform.
// y = had128(had128(x * suh) @ decode(trellis)) * svh, each had128 scaled by 1/sqrt(128).
//
// A fused linear (qkv, gate_up of a real checkpoint) concatenates up to kMaxParts parts on N; the
// parts share x, and each has its own suh, so the input transform runs once per part.
#pragma once

#include <cstdint>

namespace pp4_exl3 {

constexpr int kMaxParts = 4;
constexpr int kMaxRows = 32;  // two 16-row MMA blocks

// The codebooks of exllamav3 1.6.5 (its `cb` template argument): which function of a 16-bit
// trellis state gives a weight.
enum Codebook : int { k3Inst = 0, kMcg = 1, kMul1 = 2 };

struct Parts {
  int count;
  int tile_end[kMaxParts];  // cumulative 16-column output tiles at the end of each part
};

// xh [P, M, K] fp16 = had128(x [M, K] * suh[p]) / sqrt(128), for each part p of suh [P, K].
// pdl: launch each kernel so that it may start before the one before it has finished (launch.cuh).
void input_transform(const void* x, const void* suh, void* xh, int parts, int rows, int k, void* stream, bool pdl);

// Partial sums [splits, M, N] fp32 of xh @ decode(trellis), the K range cut into `splits` pieces of
// k_tiles_per_split 16-row tiles (the last may be shorter).
void decode_gemm(const void* xh, const void* trellis, float* partials, int rows, int k, int n, int bits,
                 int codebook, const Parts& parts, int splits, int k_tiles_per_split, void* stream, bool pdl);

// out [M, N] (fp16 or fp32) = had128(sum of the partials, in split order) / sqrt(128) * svh.
void output_transform(const float* partials, const void* svh, void* out, bool out_fp32, int splits, int rows,
                      int n, void* stream, bool pdl);

// The all-reduce, residual add and rms norm that end a sublayer, fused with the next linear's input
// transform (one launch where three would run): r [M, H] = fp16(p0 + p1), or fp16(x + fp16(p0 + p1))
// where x is not null; r to x_out where x_out is not null; xh [P, M, H] = the input transform (above)
// of rms_norm(r) * weight, for each part p of suh [P, H]. H a multiple of 128, at most 16384.
void norm_transform(const void* x, const void* p0, const void* p1, const void* weight, const void* suh, void* x_out,
                    void* xh, int parts, int rows, int h, float eps, void* stream, bool pdl);

// The end of gate_up and the start of down in one launch: from gate_up's partial sums [splits, M, 2C]
// (gate's C columns, then up's), its output transform with svh [2C], silu(gate) * up, and down's
// input transform with suh_down [C]: xh_down [1, M, C]. C a multiple of 128.
void swiglu_transform(const float* partials, const void* svh, const void* suh_down, void* xh_down, int splits,
                      int rows, int channels, void* stream, bool pdl);

// The decoded weights W [K, N] fp16, as exllamav3's `reconstruct` writes them (for tests).
void reconstruct(const void* trellis, void* w, int k, int n, int bits, int codebook, void* stream);

// Whether a kernel exists for these bits and codebook.
bool supported(int bits, int codebook);

// The CUDA error of the last launch on this thread, or nullptr.
const char* last_error();

}  // namespace pp4_exl3
