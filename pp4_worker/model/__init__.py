"""The TP2 draft model the worker times: geometry and settings, weights, ranks, the kernel
backends, sampling and hashing, request states and CUDA graphs."""
