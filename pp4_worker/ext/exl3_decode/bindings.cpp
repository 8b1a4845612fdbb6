// Python bindings of pp4's EXL3 decode GEMM, on torch tensors. Module initialisation only registers
// functions: importing the module touches no CUDA API, so it creates no CUDA context.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <algorithm>
#include <optional>
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
// splits for blocks at all. Fitted to `bench/worker/exl3_gemm_sweep.py` on an H100 (every split of every
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

// The launch of one GEMM: its shape, parts and split of K, checked against the trellis.
struct GemmPlan {
  int rows, k, n, bits, codebook, splits, per_split;
  pp4_exl3::Parts parts;
};

GemmPlan plan_gemm(const torch::Tensor& trellis, int rows, int k, const std::vector<int64_t>& part_columns,
                   int64_t codebook, int64_t splits) {
  check_tensor(trellis, "trellis", torch::kShort);
  GemmPlan plan{};
  plan.bits = bits_of(trellis);
  plan.codebook = static_cast<int>(codebook);
  TORCH_CHECK(pp4_exl3::supported(plan.bits, plan.codebook), kName, ": no kernel for ", plan.bits,
              " bits with codebook ", codebook, " (2..8 bits; codebooks 0 3inst, 1 mcg, 2 mul1)");
  plan.rows = rows;
  plan.k = k;
  plan.n = static_cast<int>(trellis.size(1) * 16);
  TORCH_CHECK(rows >= 1 && rows <= pp4_exl3::kMaxRows, kName, ": x has ", rows, " rows; this GEMM takes 1 to ",
              pp4_exl3::kMaxRows);
  TORCH_CHECK(k % 128 == 0 && plan.n % 128 == 0 && trellis.size(0) * 16 == k, kName, ": K ", k, " and N ", plan.n,
              " must be multiples of 128 and trellis [K/16, N/16, 16*bits], got ", trellis.sizes());
  std::vector<int64_t> columns = part_columns.empty() ? std::vector<int64_t>{plan.n} : part_columns;
  TORCH_CHECK(static_cast<int>(columns.size()) <= pp4_exl3::kMaxParts, kName, ": at most ", pp4_exl3::kMaxParts,
              " parts");
  plan.parts.count = static_cast<int>(columns.size());
  int64_t end = 0;
  for (size_t i = 0; i < columns.size(); ++i) {
    TORCH_CHECK(columns[i] > 0 && columns[i] % 128 == 0, kName, ": part ", i, " has ", columns[i],
                " columns; every part must be a positive multiple of 128");
    end += columns[i];
    plan.parts.tile_end[i] = static_cast<int>(end / 16);
  }
  TORCH_CHECK(end == plan.n, kName, ": the parts' columns add up to ", end, ", not N = ", plan.n);
  const int k_tiles = k / 16;
  int n_splits = choose_splits(plan.n / 128, k_tiles, rows, plan.n, trellis.numel() * 2, static_cast<int>(splits));
  int per_split = (k_tiles + n_splits - 1) / n_splits;
  per_split = (per_split + 3) / 4 * 4;  // whole pipeline stages of four K tiles
  plan.per_split = per_split;
  plan.splits = (k_tiles + per_split - 1) / per_split;
  return plan;
}

void check_transformed(const torch::Tensor& xh, const GemmPlan& plan, const char* what) {
  check_tensor(xh, what, torch::kHalf);
  TORCH_CHECK(xh.dim() == 3 && xh.size(0) == plan.parts.count && xh.size(1) == plan.rows && xh.size(2) == plan.k,
              kName, ": ", what, " must be [parts, rows, K] = [", plan.parts.count, ", ", plan.rows, ", ", plan.k,
              "], got ", xh.sizes());
}

void check_out(const torch::Tensor& out, const torch::Tensor& svh, const GemmPlan& plan) {
  check_tensor(svh, "svh", torch::kHalf);
  TORCH_CHECK(svh.numel() == plan.n, kName, ": svh must have N = ", plan.n, " entries, got ", svh.numel());
  TORCH_CHECK(out.is_cuda() && out.is_contiguous(), kName, ": out must be a contiguous CUDA tensor");
  TORCH_CHECK(out.scalar_type() == torch::kHalf || out.scalar_type() == torch::kFloat, kName,
              ": out must be float16 or float32");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == plan.rows && out.size(1) == plan.n, kName, ": out must be [",
              plan.rows, ", ", plan.n, "], got ", out.sizes());
}

void* current_stream() { return at::cuda::getCurrentCUDAStream().stream(); }

// Partial sums [splits, M, N] fp32 of xh @ decode(trellis).
torch::Tensor partial_sums(const torch::Tensor& xh, const torch::Tensor& trellis, const GemmPlan& plan, bool pdl) {
  auto partials = torch::empty({plan.splits, plan.rows, plan.n}, xh.options().dtype(torch::kFloat));
  pp4_exl3::decode_gemm(xh.data_ptr(), trellis.data_ptr(), partials.data_ptr<float>(), plan.rows, plan.k, plan.n,
                        plan.bits, plan.codebook, plan.parts, plan.splits, plan.per_split, current_stream(), pdl);
  check_launch();
  return partials;
}

void finish(const torch::Tensor& partials, const torch::Tensor& svh, const torch::Tensor& out, const GemmPlan& plan,
            bool pdl) {
  pp4_exl3::output_transform(partials.data_ptr<float>(), svh.data_ptr(), out.data_ptr(),
                             out.scalar_type() == torch::kFloat, plan.splits, plan.rows, plan.n, current_stream(), pdl);
  check_launch();
}

// y = had128(had128(x * suh) @ W) * svh for EXL3-quantized W; see exl3_decode.h.
void gemm(const torch::Tensor& x, const torch::Tensor& trellis, const torch::Tensor& suh, const torch::Tensor& svh,
          const std::vector<int64_t>& part_columns, const torch::Tensor& out, int64_t codebook, int64_t splits,
          bool pdl) {
  check_tensor(x, "x", torch::kHalf);
  check_tensor(suh, "suh", torch::kHalf);
  TORCH_CHECK(x.dim() == 2, kName, ": x must be [rows, K]");
  const at::cuda::OptionalCUDAGuard guard(x.device());  // choose_splits reads the current device
  const GemmPlan plan = plan_gemm(trellis, static_cast<int>(x.size(0)), static_cast<int>(x.size(1)), part_columns,
                                  codebook, splits);
  check_out(out, svh, plan);
  const int64_t suh_parts = suh.dim() == 1 ? 1 : suh.size(0);
  TORCH_CHECK(suh.numel() == suh_parts * plan.k && suh_parts == plan.parts.count, kName,
              ": suh must be [parts, K] = [", plan.parts.count, ", ", plan.k, "], got ", suh.sizes());
  auto xh = torch::empty({plan.parts.count, plan.rows, plan.k}, x.options());
  pp4_exl3::input_transform(x.data_ptr(), suh.data_ptr(), xh.data_ptr(), plan.parts.count, plan.rows, plan.k,
                            current_stream(), pdl);
  check_launch();
  finish(partial_sums(xh, trellis, plan, pdl), svh, out, plan, pdl);
}

// The same from x already through its input transform (norm_transform or gemm_swiglu wrote it).
void gemm_transformed(const torch::Tensor& xh, const torch::Tensor& trellis, const torch::Tensor& svh,
                      const std::vector<int64_t>& part_columns, const torch::Tensor& out, int64_t codebook,
                      int64_t splits, bool pdl) {
  TORCH_CHECK(xh.dim() == 3 && xh.is_cuda(), kName, ": xh must be a CUDA tensor [parts, rows, K], got ", xh.sizes());
  const at::cuda::OptionalCUDAGuard guard(xh.device());
  const GemmPlan plan = plan_gemm(trellis, static_cast<int>(xh.size(1)), static_cast<int>(xh.size(2)), part_columns,
                                  codebook, splits);
  check_transformed(xh, plan, "xh");
  check_out(out, svh, plan);
  finish(partial_sums(xh, trellis, plan, pdl), svh, out, plan, pdl);
}

// gate_up from its transformed input, through silu(gate) * up, to down's transformed input xh_down.
void gemm_swiglu(const torch::Tensor& xh, const torch::Tensor& trellis, const torch::Tensor& svh,
                 const std::vector<int64_t>& part_columns, const torch::Tensor& suh_down,
                 const torch::Tensor& xh_down, int64_t codebook, int64_t splits, bool pdl) {
  TORCH_CHECK(xh.dim() == 3 && xh.is_cuda(), kName, ": xh must be a CUDA tensor [parts, rows, K], got ", xh.sizes());
  const at::cuda::OptionalCUDAGuard guard(xh.device());
  const GemmPlan plan = plan_gemm(trellis, static_cast<int>(xh.size(1)), static_cast<int>(xh.size(2)), part_columns,
                                  codebook, splits);
  check_transformed(xh, plan, "xh");
  check_tensor(svh, "svh", torch::kHalf);
  TORCH_CHECK(svh.numel() == plan.n, kName, ": svh must have N = ", plan.n, " entries, got ", svh.numel());
  const int channels = plan.n / 2;
  TORCH_CHECK(channels % 128 == 0, kName, ": gate_up's N ", plan.n, " must be gate and up of a multiple of 128 each");
  check_tensor(suh_down, "suh_down", torch::kHalf);
  TORCH_CHECK(suh_down.numel() == channels, kName, ": suh_down must have ", channels, " entries, got ",
              suh_down.numel());
  check_tensor(xh_down, "xh_down", torch::kHalf);
  TORCH_CHECK(xh_down.dim() == 3 && xh_down.size(0) == 1 && xh_down.size(1) == plan.rows &&
                  xh_down.size(2) == channels,
              kName, ": xh_down must be [1, ", plan.rows, ", ", channels, "], got ", xh_down.sizes());
  const torch::Tensor partials = partial_sums(xh, trellis, plan, pdl);
  pp4_exl3::swiglu_transform(partials.data_ptr<float>(), svh.data_ptr(), suh_down.data_ptr(), xh_down.data_ptr(),
                             plan.splits, plan.rows, channels, current_stream(), pdl);
  check_launch();
}

// r = fp16(p0 + p1) (+ x), written to x_out where given; xh = the input transform of rms_norm(r) * weight.
void norm_transform(const std::optional<torch::Tensor>& x, const torch::Tensor& p0, const torch::Tensor& p1,
                    const torch::Tensor& weight, const torch::Tensor& suh, const std::optional<torch::Tensor>& x_out,
                    const torch::Tensor& xh, double eps, bool pdl) {
  check_tensor(p0, "p0", torch::kHalf);
  TORCH_CHECK(p0.dim() == 2, kName, ": p0 must be [rows, H], got ", p0.sizes());
  const int rows = static_cast<int>(p0.size(0)), h = static_cast<int>(p0.size(1));
  TORCH_CHECK(h % 128 == 0 && h <= 16384, kName, ": H ", h, " must be a multiple of 128, at most 16384");
  const auto same_shape = [&](const torch::Tensor& t, const char* what) {
    check_tensor(t, what, torch::kHalf);
    TORCH_CHECK(t.sizes() == p0.sizes(), kName, ": ", what, " must be ", p0.sizes(), ", got ", t.sizes());
  };
  same_shape(p1, "p1");
  if (x) same_shape(*x, "x");
  if (x_out) same_shape(*x_out, "x_out");
  check_tensor(weight, "weight", torch::kHalf);
  TORCH_CHECK(weight.numel() == h, kName, ": weight must have H = ", h, " entries, got ", weight.numel());
  check_tensor(suh, "suh", torch::kHalf);
  const int64_t parts = suh.dim() == 1 ? 1 : suh.size(0);
  TORCH_CHECK(suh.numel() == parts * h && parts <= pp4_exl3::kMaxParts, kName, ": suh must be [parts, H] with H = ",
              h, " and at most ", pp4_exl3::kMaxParts, " parts, got ", suh.sizes());
  check_tensor(xh, "xh", torch::kHalf);
  TORCH_CHECK(xh.dim() == 3 && xh.size(0) == parts && xh.size(1) == rows && xh.size(2) == h, kName,
              ": xh must be [", parts, ", ", rows, ", ", h, "], got ", xh.sizes());
  const at::cuda::OptionalCUDAGuard guard(p0.device());
  pp4_exl3::norm_transform(x ? x->data_ptr() : nullptr, p0.data_ptr(), p1.data_ptr(), weight.data_ptr(),
                           suh.data_ptr(), x_out ? x_out->data_ptr() : nullptr, xh.data_ptr(), static_cast<int>(parts),
                           rows, h, static_cast<float>(eps), current_stream(), pdl);
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
  m.def("gemm_transformed", &gemm_transformed,
        "gemm from xh [parts, rows, K], x already through its input transform (norm_transform, gemm_swiglu)",
        py::arg("xh"), py::arg("trellis"), py::arg("svh"), py::arg("part_columns"), py::arg("out"),
        py::arg("codebook"), py::arg("splits") = 0, py::arg("pdl") = false);
  m.def("gemm_swiglu", &gemm_swiglu,
        "gate_up (gate's columns, then up's) from xh, then silu(gate) * up through down's input transform "
        "(suh_down) into xh_down [1, rows, N/2]: down's input for gemm_transformed",
        py::arg("xh"), py::arg("trellis"), py::arg("svh"), py::arg("part_columns"), py::arg("suh_down"),
        py::arg("xh_down"), py::arg("codebook"), py::arg("splits") = 0, py::arg("pdl") = false);
  m.def("norm_transform", &norm_transform,
        "r = fp16(p0 + p1) (+ x) to x_out (where given); xh [parts, rows, H] = the input transform with suh "
        "[parts, H] of rms_norm(r) * weight: a sublayer's all-reduce, residual add and norm, and the next "
        "linear's input transform, in one launch",
        py::arg("x"), py::arg("p0"), py::arg("p1"), py::arg("weight"), py::arg("suh"), py::arg("x_out"),
        py::arg("xh"), py::arg("eps"), py::arg("pdl") = false);
  m.def("reconstruct", &reconstruct, "The decoded weights W [K, N] fp16 of a trellis (as exllamav3's reconstruct)",
        py::arg("trellis"), py::arg("codebook"));
}
