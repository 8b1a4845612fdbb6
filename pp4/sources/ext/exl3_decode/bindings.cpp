// Python bindings of pp4's EXL3 decode GEMM, on torch tensors. Module initialisation only registers
// functions: importing the module touches no CUDA API, so it creates no CUDA context.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <algorithm>
#include <string>
#include <vector>

#include "exl3_decode.h"

namespace {

constexpr const char* kName = "pp4_exl3_decode";

void check_tensor(const torch::Tensor& t, const char* what, c10::ScalarType dtype) {
  TORCH_CHECK(t.is_cuda(), kName, ": ", what, " must be on a CUDA device, got ", t.device());
  TORCH_CHECK(t.is_contiguous(), kName, ": ", what, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == dtype, kName, ": ", what, " must be ", c10::toString(dtype), ", got ",
              c10::toString(t.scalar_type()));
}

void check_launch() {
  const char* err = pp4_exl3::last_error();
  TORCH_CHECK(err == nullptr, kName, ": kernel launch failed: ", err);
}

int bits_of(const torch::Tensor& trellis) {
  TORCH_CHECK(trellis.dim() == 3 && trellis.size(2) % 16 == 0, kName,
              ": trellis must be int16 [K/16, N/16, 16*bits], got shape ", trellis.sizes(),
              " (half-integer bitrates are not supported: run them with --backend exl3)");
  return static_cast<int>(trellis.size(2) / 16);
}

// How many pieces K is cut into: blocks for about three rounds of the five or six each SM holds
// (fewer leave a round's tail with SMs half occupied), each piece at least eight pipeline stages;
// and, once there are blocks for one round, no more than keeps the partial sums' traffic (written
// once, read once, fp32) within an eighth of the trellis's own bytes: the head at 20 rows loses
// more to its partial sums than it gains from a third round, while the small matrices need their
// splits for blocks at all. Fitted to `bench/exl3_gemm_sweep.py` on an H100 (every split of every
// worker matrix at 1 to 20 rows).
int choose_splits(int n_blocks, int k_tiles, int rows, int n, int64_t trellis_bytes, int requested) {
  if (requested > 0) return std::min(requested, k_tiles / 4);
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t three_rounds = (16 * sms + n_blocks - 1) / n_blocks;
  const int64_t one_round = (4 * sms + n_blocks - 1) / n_blocks;
  const int64_t traffic_cap = trellis_bytes / (64LL * rows * n);
  const int64_t splits = std::min<int64_t>({three_rounds, k_tiles / 32, std::max(one_round, traffic_cap)});
  return static_cast<int>(std::max<int64_t>(1, splits));
}

// y = had128(had128(x * suh) @ W) * svh for EXL3-quantized W; see exl3_decode.h.
void gemm(const torch::Tensor& x, const torch::Tensor& trellis, const torch::Tensor& suh, const torch::Tensor& svh,
          const std::vector<int64_t>& part_columns, const torch::Tensor& out, int64_t codebook, int64_t splits,
          bool pdl) {
  check_tensor(x, "x", torch::kHalf);
  check_tensor(trellis, "trellis", torch::kShort);
  check_tensor(suh, "suh", torch::kHalf);
  check_tensor(svh, "svh", torch::kHalf);
  TORCH_CHECK(out.is_cuda() && out.is_contiguous(), kName, ": out must be a contiguous CUDA tensor");
  TORCH_CHECK(out.scalar_type() == torch::kHalf || out.scalar_type() == torch::kFloat, kName,
              ": out must be float16 or float32");
  const int bits = bits_of(trellis);
  TORCH_CHECK(pp4_exl3::supported(bits, static_cast<int>(codebook)), kName, ": no kernel for ", bits,
              " bits with codebook ", codebook, " (2..8 bits; codebooks 0 3inst, 1 mcg, 2 mul1)");
  TORCH_CHECK(x.dim() == 2, kName, ": x must be [rows, K]");
  const int rows = static_cast<int>(x.size(0));
  const int k = static_cast<int>(x.size(1));
  const int n = static_cast<int>(trellis.size(1) * 16);
  TORCH_CHECK(rows >= 1 && rows <= pp4_exl3::kMaxRows, kName, ": x has ", rows, " rows; this GEMM takes 1 to ",
              pp4_exl3::kMaxRows);
  TORCH_CHECK(k % 128 == 0 && n % 128 == 0 && trellis.size(0) * 16 == k, kName, ": K ", k, " and N ", n,
              " must be multiples of 128 and trellis [K/16, N/16, 16*bits], got ", trellis.sizes());
  TORCH_CHECK(out.dim() == 2 && out.size(0) == rows && out.size(1) == n, kName, ": out must be [", rows, ", ", n,
              "], got ", out.sizes());
  TORCH_CHECK(svh.numel() == n, kName, ": svh must have N = ", n, " entries, got ", svh.numel());

  pp4_exl3::Parts parts{};
  std::vector<int64_t> columns = part_columns.empty() ? std::vector<int64_t>{n} : part_columns;
  TORCH_CHECK(static_cast<int>(columns.size()) <= pp4_exl3::kMaxParts, kName, ": at most ", pp4_exl3::kMaxParts,
              " parts");
  parts.count = static_cast<int>(columns.size());
  int64_t end = 0;
  for (size_t i = 0; i < columns.size(); ++i) {
    TORCH_CHECK(columns[i] > 0 && columns[i] % 128 == 0, kName, ": part ", i, " has ", columns[i],
                " columns; every part must be a positive multiple of 128");
    end += columns[i];
    parts.tile_end[i] = static_cast<int>(end / 16);
  }
  TORCH_CHECK(end == n, kName, ": the parts' columns add up to ", end, ", not N = ", n);
  const int64_t suh_parts = suh.dim() == 1 ? 1 : suh.size(0);
  TORCH_CHECK(suh.numel() == suh_parts * k && suh_parts == parts.count, kName, ": suh must be [parts, K] = [",
              parts.count, ", ", k, "], got ", suh.sizes());

  const at::cuda::OptionalCUDAGuard guard(x.device());
  void* stream = at::cuda::getCurrentCUDAStream().stream();
  const int k_tiles = k / 16;
  int n_splits = choose_splits(n / 128, k_tiles, rows, n, trellis.numel() * 2, static_cast<int>(splits));
  int per_split = (k_tiles + n_splits - 1) / n_splits;
  per_split = (per_split + 3) / 4 * 4;  // whole pipeline stages of four K tiles
  n_splits = (k_tiles + per_split - 1) / per_split;

  auto xh = torch::empty({parts.count, rows, k}, x.options());
  auto partials = torch::empty({n_splits, rows, n}, x.options().dtype(torch::kFloat));
  pp4_exl3::input_transform(x.data_ptr(), suh.data_ptr(), xh.data_ptr(), parts.count, rows, k, stream, pdl);
  check_launch();
  pp4_exl3::decode_gemm(xh.data_ptr(), trellis.data_ptr(), partials.data_ptr<float>(), rows, k, n, bits,
                        static_cast<int>(codebook), parts, n_splits, per_split, stream, pdl);
  check_launch();
  pp4_exl3::output_transform(partials.data_ptr<float>(), svh.data_ptr(), out.data_ptr(),
                             out.scalar_type() == torch::kFloat, n_splits, rows, n, stream, pdl);
  check_launch();
}

torch::Tensor reconstruct(const torch::Tensor& trellis, int64_t codebook) {
  check_tensor(trellis, "trellis", torch::kShort);
  const int bits = bits_of(trellis);
  TORCH_CHECK(pp4_exl3::supported(bits, static_cast<int>(codebook)), kName, ": no kernel for ", bits,
              " bits with codebook ", codebook);
  const at::cuda::OptionalCUDAGuard guard(trellis.device());
  const int k = static_cast<int>(trellis.size(0) * 16);
  const int n = static_cast<int>(trellis.size(1) * 16);
  auto w = torch::empty({k, n}, trellis.options().dtype(torch::kHalf));
  pp4_exl3::reconstruct(trellis.data_ptr(), w.data_ptr(), k, n, bits, static_cast<int>(codebook),
                        at::cuda::getCurrentCUDAStream().stream());
  check_launch();
  return w;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "pp4's EXL3 decode GEMM for a few rows: exllamav3's trellis format, decoded as EXL3 decodes it";
  m.def("gemm", &gemm,
        "out = had128(had128(x * suh) @ decode(trellis)) * svh; parts: output columns per part of a fused "
        "linear (suh [parts, K]); codebook 0 3inst, 1 mcg, 2 mul1; splits 0: chosen by size; pdl: its kernels may "
        "start before the one before each has finished (programmatic dependent launch, compute capability 9.0+)",
        py::arg("x"), py::arg("trellis"), py::arg("suh"), py::arg("svh"), py::arg("part_columns"), py::arg("out"),
        py::arg("codebook"), py::arg("splits") = 0, py::arg("pdl") = false);
  m.def("reconstruct", &reconstruct, "The decoded weights W [K, N] fp16 of a trellis (as exllamav3's reconstruct)",
        py::arg("trellis"), py::arg("codebook"));
}
