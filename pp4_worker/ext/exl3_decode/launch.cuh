// Programmatic dependent launch: the GEMM's three kernels start while the kernel before each is
// still finishing (launch latency hidden, the trellis prefetch overlapped with the input
// transform), as the worker's Triton kernels do, with --pdl on.
//
// Each kernel waits for its predecessor (wait_for_predecessor) before it reads anything a kernel
// writes or writes anything at all; since every kernel launched this way waits for its own
// predecessor first, passing the wait means every earlier kernel of the stream has finished, so the
// order of memory effects is plain stream order. Before the wait a kernel reads only what no
// kernel writes (the GEMM: the trellis, a weight). Then it lets its successor launch
// (let_successor_launch), whose blocks take SMs as this kernel's last blocks leave them.
#pragma once

#include <cuda_runtime.h>

namespace pp4_exl3 {

__device__ __forceinline__ void wait_for_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void let_successor_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, 0, stream>>>(args...), with the programmatic-serialization attribute where
// pdl is asked for and the device has it (compute capability 9.0 and later); else a plain launch,
// in which the waits return at once.
template <typename... Params, typename... Args>
void launch_after(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args... args) {
  int device = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = pdl && major >= 9 ? 1 : 0;
  cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

}  // namespace pp4_exl3
