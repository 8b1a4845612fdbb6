// CUDA side of the P2P extension. Nothing here runs at load time: a CUDA context is created only
// when a function is called, never by importing the module.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "p2p.h"

namespace pp4_p2p {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("pp4_p2p: ") + what + " failed: " + cudaGetErrorString(err));
  }
}

// Switches to a device for the duration of a call and restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&saved_), "cudaGetDevice");
    if (saved_ != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != saved_) cudaSetDevice(saved_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int saved_ = -1;
};

// The start of the allocation holding ptr. The runtime API has no call for it; the driver's
// cuMemGetAddressRange is reached through the runtime, so the module needs no link to libcuda.
char* allocation_base(void* ptr) {
  using GetRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static GetRange get_range = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &found),
          "cudaGetDriverEntryPointByVersion(cuMemGetAddressRange)");
    if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
      throw std::runtime_error("pp4_p2p: the CUDA driver has no cuMemGetAddressRange");
    }
    return reinterpret_cast<GetRange>(fn);
  }();
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = get_range(&base, &size, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS) throw std::runtime_error("pp4_p2p: cuMemGetAddressRange failed: " + std::to_string(r));
  return reinterpret_cast<char*>(base);
}

}  // namespace

bool can_access_peer(int device, int peer) {
  int ok = 0;
  check(cudaDeviceCanAccessPeer(&ok, device, peer), "cudaDeviceCanAccessPeer");
  return ok != 0;
}

bool enable_peer_access(int device, int peer) {
  DeviceGuard guard(device);
  cudaError_t err = cudaDeviceEnablePeerAccess(peer, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();  // left set, the next unrelated error check would report it
    return false;
  }
  check(err, "cudaDeviceEnablePeerAccess");
  return true;
}

void peer_copy(void* dst, int dst_device, const void* src, int src_device, size_t n, std::uintptr_t stream) {
  DeviceGuard guard(dst_device);
  check(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, n, reinterpret_cast<cudaStream_t>(stream)),
        "cudaMemcpyPeerAsync");
}

std::string export_ipc_handle(void* ptr, int device, std::int64_t* offset) {
  DeviceGuard guard(device);
  cudaIpcMemHandle_t handle;
  check(cudaIpcGetMemHandle(&handle, ptr), "cudaIpcGetMemHandle");
  // torch's caching allocator hands out pieces of larger allocations; the handle maps the whole one.
  *offset = static_cast<char*>(ptr) - allocation_base(ptr);
  return std::string(reinterpret_cast<const char*>(&handle), sizeof(handle));
}

void* open_ipc_handle(const std::string& handle, int device) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    throw std::invalid_argument("pp4_p2p.open_ipc_handle: a handle has " + std::to_string(sizeof(cudaIpcMemHandle_t)) +
                                " bytes, got " + std::to_string(handle.size()));
  }
  DeviceGuard guard(device);
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* base = nullptr;
  check(cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  return base;
}

void close_ipc_handle(void* base, int device) {
  DeviceGuard guard(device);
  check(cudaIpcCloseMemHandle(base), "cudaIpcCloseMemHandle");
}

}  // namespace pp4_p2p
