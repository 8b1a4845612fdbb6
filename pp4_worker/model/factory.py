"""The backend a worker runs, by name: here, above both modules of backends (the EXL3 ones build on
TritonBackend), so that neither imports the other's factory."""

from __future__ import annotations

import torch

from pp4_worker.model import exl3_backends
from pp4_worker.model.backends import EXL3_NEEDS_CUDA, BackendUnavailable, TorchBackend, TritonBackend
from pp4_worker.model.config import DEFAULT_ATTENTION, DEFAULT_GEMM


def make_backend(name: str, device: torch.device, attention: str | None = None, gemm: str | None = None,
                 exl3=None, pdl: bool = False) -> TorchBackend:
    """exl3: the Exl3Options of --backend exl3 (pp4_worker/model/config.py); attention and gemm
    None: the backend's defaults (DEFAULT_ATTENTION, DEFAULT_GEMM)."""
    attention = attention or DEFAULT_ATTENTION.get(name, "gemm")
    gemm = gemm or DEFAULT_GEMM.get(name, "cublas")
    if name != "triton" and gemm != "cublas":
        raise BackendUnavailable(f"--gemm {gemm} needs --backend triton")
    if name == "torch" and pdl:
        raise BackendUnavailable("--pdl on needs --backend triton or exl3 (the torch backend launches no Triton kernels)")
    if name == "torch":
        return TorchBackend(device, attention)
    if name == "triton":
        return TritonBackend(device, attention, gemm, pdl)
    if name == "exl3":
        if device.type != "cuda":
            raise BackendUnavailable(EXL3_NEEDS_CUDA)
        if exl3 is None:
            raise BackendUnavailable("--backend exl3 needs its options (build directory, module, bits)")
        module = exl3_backends.load_exl3_module(exl3.build_dir, exl3.target)
        return exl3_backends.Exl3Backend(device, attention, module, exl3.target, exl3.bits, exl3.head_bits, exl3.select, pdl)
    if name == "exl3-decode":
        if device.type != "cuda":  # before the module's load, whose error would hide this one
            raise BackendUnavailable("--backend exl3-decode runs CUDA kernels: it needs --device cuda")
        build_dir = exl3.build_dir if exl3 is not None else "build"
        return exl3_backends.Exl3DecodeBackend(device, attention, exl3_backends.load_decode_module(build_dir), pdl,
                                               fuse=exl3.fuse if exl3 is not None else True)
    raise BackendUnavailable(f"unknown backend {name!r} (choose torch, triton, exl3 or exl3-decode)")
