"""Timing harness for one whole speculative-decoding draft-worker call.

``python -m pp4_worker`` builds a tensor-parallel-2 draft model (both logical
ranks on one GPU, side by side on two CUDA streams or one after the other), captures a CUDA graph per cell
(batch size x output depth x sampling mode), proves the graphs exact on 24
request states, and only then times complete worker calls against the
weight-read limit measured in the same run.  See docs/worker.md.

Nothing here imports torch at package import time: the CLI must point CUDA,
Triton and torch-extension caches at a private directory before torch loads.
"""
