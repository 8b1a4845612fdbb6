// Python bindings of the P2P extension, on torch tensors. Module initialisation only registers
// functions: importing the module touches no CUDA API, so it creates no CUDA context.
#include <torch/extension.h>

#include <string>
#include <vector>

#include "p2p.h"

namespace {

void check_cuda(const torch::Tensor& t, const char* fn) {
  TORCH_CHECK(t.is_cuda(), "pp4_p2p.", fn, ": the tensor must be on a CUDA device, got ", t.device());
  TORCH_CHECK(t.is_contiguous(), "pp4_p2p.", fn, ": the tensor must be contiguous");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "pp4 P2P transport: peer access, peer copies and CUDA IPC handles on torch tensors";
  m.def("can_access_peer", &pp4_p2p::can_access_peer, "Whether `device` can access `peer`'s memory",
        py::arg("device"), py::arg("peer"));
  m.def("enable_peer_access", &pp4_p2p::enable_peer_access,
        "Enable access from `device` to `peer`; False when it was already enabled", py::arg("device"),
        py::arg("peer"));
  m.def(
      "peer_copy",
      [](torch::Tensor dst, torch::Tensor src, std::uintptr_t stream) {
        check_cuda(dst, "peer_copy");
        check_cuda(src, "peer_copy");
        TORCH_CHECK(dst.nbytes() == src.nbytes(), "pp4_p2p.peer_copy: dst has ", dst.nbytes(),
                    " bytes but src has ", src.nbytes());
        pp4_p2p::peer_copy(dst.data_ptr(), dst.get_device(), src.data_ptr(), src.get_device(), src.nbytes(),
                           stream);
      },
      "Copy src into dst across devices on a CUDA stream of dst's device (torch.cuda.Stream.cuda_stream)",
      py::arg("dst"), py::arg("src"), py::arg("stream"));
  m.def(
      "export_ipc_handle",
      [](torch::Tensor t) {
        check_cuda(t, "export_ipc_handle");
        std::int64_t offset = 0;
        std::string handle = pp4_p2p::export_ipc_handle(t.data_ptr(), t.get_device(), &offset);
        return py::make_tuple(py::bytes(handle), offset);
      },
      "(handle bytes, byte offset) of the CUDA allocation holding the tensor", py::arg("tensor"));
  m.def(
      "open_ipc_handle",
      [](py::bytes handle, std::int64_t offset, int device, std::vector<std::int64_t> sizes, py::object dtype) {
        void* base = pp4_p2p::open_ipc_handle(std::string(handle), device);
        auto options = torch::TensorOptions()
                           .dtype(torch::python::detail::py_object_to_dtype(dtype))
                           .device(torch::kCUDA, device);
        return torch::from_blob(
            static_cast<char*>(base) + offset, sizes,
            [base, device](void*) {
              try {
                pp4_p2p::close_ipc_handle(base, device);
              } catch (const std::exception&) {
                // A deleter must not throw; the mapping dies with the process at the latest.
              }
            },
            options);
      },
      "Open another process's IPC handle as a tensor of the given sizes and dtype; unmapped when it dies",
      py::arg("handle"), py::arg("offset"), py::arg("device"), py::arg("sizes"), py::arg("dtype"));
}
