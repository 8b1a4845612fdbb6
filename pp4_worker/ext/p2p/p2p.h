// pp4 P2P transport: the CUDA calls, on raw device pointers. bindings.cpp puts torch tensors on
// top, so this header (and nvcc's translation unit) stays free of torch's heavy headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pp4_p2p {

bool can_access_peer(int device, int peer);
// Enables access from `device` to `peer`; returns false when it was already enabled.
bool enable_peer_access(int device, int peer);
// Copies n bytes between devices on `stream`, a cudaStream_t of dst's device.
void peer_copy(void* dst, int dst_device, const void* src, int src_device, size_t n, std::uintptr_t stream);
// The IPC handle of the allocation that holds ptr, and ptr's byte offset inside that allocation.
std::string export_ipc_handle(void* ptr, int device, std::int64_t* offset);
// Maps another process's allocation on `device`; returns the mapping's base address.
void* open_ipc_handle(const std::string& handle, int device);
void close_ipc_handle(void* base, int device);

}  // namespace pp4_p2p
