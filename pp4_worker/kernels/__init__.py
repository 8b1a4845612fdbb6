"""The worker's GPU kernels: the fused Triton kernels and the skinny GEMM."""
