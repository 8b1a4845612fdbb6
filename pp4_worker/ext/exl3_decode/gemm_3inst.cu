// The decode GEMM's kernels for the 3inst codebook (one file per codebook: they compile in parallel).
#include "gemm.cuh"

namespace pp4_exl3 {

bool decode_gemm_3inst(int bits, const void* xh, const void* trellis, float* partials, int rows, int k, int n,
                       const Parts& parts, int splits, int k_tiles_per_split, cudaStream_t stream,
                       bool pdl) {
  return dispatch_decode_gemm<0>(bits, xh, trellis, partials, rows, k, n, parts, splits, k_tiles_per_split, stream, pdl);
}

}  // namespace pp4_exl3
