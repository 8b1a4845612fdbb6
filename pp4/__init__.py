"""pp4: build PyTorch CUDA extensions with a pinned nvcc, certify reuse, time the worker."""
