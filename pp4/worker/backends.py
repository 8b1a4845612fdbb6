"""Kernel backends: the handful of primitives one rank's layer is built from.

The model code calls only these methods, so another kernel set (EXL3's rms norm,
rope and quantized linears from a pp4-built ``exllamav3_ext``) can replace the
plain-torch one without touching ranks, graphs, the gate or timing.
"""
from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

EXL3_MODULE = "exllamav3_ext"


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here; the message says what to do."""


class TorchBackend:
    """Plain torch: cuBLAS GEMMs (fp32 output where it matters), torch's fused rms_norm and softmax."""

    name = "torch"

    ATTENTION = ("gemm", "sdpa")

    def __init__(self, device: torch.device, attention: str = "gemm"):
        if attention not in self.ATTENTION:
            raise BackendUnavailable(f"unknown attention {attention!r} (choose gemm or sdpa)")
        self.device = device
        self.is_cuda = device.type == "cuda"
        self.attention_kind = attention
        if self.is_cuda:
            self._check_fp32_out_mm()
            # Split-K partial sums in fp32, not fp16/bf16: accuracy over a few percent of speed.
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False

    def _check_fp32_out_mm(self) -> None:
        a = torch.zeros(2, 8, dtype=torch.float16, device=self.device)
        try:
            torch.mm(a, a.t(), out_dtype=torch.float32)
        except (TypeError, RuntimeError) as exc:  # torch older than the out_dtype overload
            raise BackendUnavailable(
                "the torch backend needs torch.mm(..., out_dtype=torch.float32) on CUDA "
                f"(an fp32 head without upcasting the weights); this torch {torch.__version__} lacks it: {exc}"
            ) from exc

    def rms_norm(self, x, weight, eps: float):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    def linear(self, x, weight):
        """x @ weight.T in the weight dtype (fp32 accumulation inside cuBLAS)."""
        return torch.mm(x, weight.t())

    def linear_fp32(self, x, weight, cpu_weight_fp32=None):
        """x @ weight.T with fp32 output from fp16/bf16 operands: the head's one matmul.

        On CUDA this is a single cuBLAS call reading the 16-bit weights; on the CPU
        (tests only) torch has no fp32-output 16-bit matmul, so it upcasts.
        """
        if self.is_cuda:
            return torch.mm(x, weight.t(), out_dtype=torch.float32)
        w = cpu_weight_fp32 if cpu_weight_fp32 is not None else weight.float()
        return torch.mm(x.float(), w.t())

    def rope_(self, qk, cos, sin_signed) -> None:
        """Rotary embedding in place, rotate-half convention.

        qk [B, T, heads, D]; cos = [cos, cos], sin_signed = [-sin, sin], each
        [B, T, 1, D] in the model dtype (as HF Llama applies it; mixed fp16/fp32
        operands would take torch's slow non-vectorised path):
        out = x*cos + swap_halves(x)*sin_signed.  Three kernels.
        """
        d = qk.shape[-1]
        swapped = qk.unflatten(-1, (2, d // 2)).flip(-2).flatten(-2)
        qk.mul_(cos)
        qk.addcmul_(swapped, sin_signed)

    def attention(self, q, k, v, mask, scale: float):
        """q [B, kvh, L, D] (query heads folded into L), k/v [B, kvh, S, D], mask [B, 1, L, S]
        additive fp32 -> [B, kvh, L, D].

        Two cuBLAS batched GEMMs around an fp32 softmax.  torch's fused attention
        kernels tile over queries, so with L <= 20 they put only B*kvh blocks on the
        whole cache (~50 us on an H200 for 1088 slots); the GEMMs tile over the slots.
        Scores and softmax stay fp32; probabilities enter the second GEMM as 16-bit,
        as they do inside flash/efficient attention.
        """
        if self.attention_kind == "sdpa":
            return self._attention_sdpa(q, k, v, mask, scale)
        B, H, L, D = q.shape
        S = k.shape[2]
        q3, k3, v3 = q.reshape(B * H, L, D), k.reshape(B * H, S, D), v.reshape(B * H, S, D)
        if self.is_cuda:
            scores = torch.bmm(q3, k3.transpose(1, 2), out_dtype=torch.float32)
        else:
            scores = torch.bmm(q3.float(), k3.float().transpose(1, 2))
        scores = torch.add(mask, scores.view(B, H, L, S), alpha=scale)  # mask + scale * q.k
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        return torch.bmm(probs.view(B * H, L, S), v3).view(B, H, L, D)

    def attention_mask_dtype(self, model_dtype):
        """gemm adds the mask to fp32 scores; torch's SDPA wants it in the query dtype."""
        return torch.float32 if self.attention_kind == "gemm" else model_dtype

    def _attention_sdpa(self, q, k, v, mask, scale: float):
        """torch's fused attention (memory-efficient kernel on CUDA); kept for A/B runs."""
        if self.is_cuda:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    def silu_mul(self, gate_up, channels: int):
        gate, up = gate_up.split(channels, dim=-1)
        act = F.silu(gate)
        return act.mul_(up)


class Exl3Backend(TorchBackend):
    """Placeholder for EXL3 kernels (rms norm, rope, quantized linears).

    Needs the pp4-built ``exllamav3_ext``.  Quantized EXL3 weights have another
    layout than the fp16 weights here, so wiring it in is future work; until then
    this backend refuses to run rather than silently timing torch kernels.
    """

    name = "exl3"

    def __init__(self, device: torch.device, attention: str = "gemm"):
        try:
            self.ext = importlib.import_module(EXL3_MODULE)
        except ImportError as exc:
            raise BackendUnavailable(
                f"--backend exl3 needs the pp4-built {EXL3_MODULE} module, which is not importable "
                f"({exc}); build it with `python configure.py && ninja` and put the build "
                "directory on PYTHONPATH"
            ) from exc
        raise BackendUnavailable(
            f"{EXL3_MODULE} imports, but the exl3 backend's quantized-weight path is not wired into "
            "the worker yet; use --backend torch"
        )


def make_backend(name: str, device: torch.device, attention: str = "gemm") -> TorchBackend:
    if name == "torch":
        return TorchBackend(device, attention)
    if name == "exl3":
        return Exl3Backend(device, attention)
    raise BackendUnavailable(f"unknown backend {name!r} (choose torch or exl3)")
