"""The EXL3 backends: the triton backend's kernels, with every linear an EXL3-quantized matrix.

``exl3`` runs upstream's kernels from a pp4-built ``exllamav3_ext`` (stock or facc),
``exl3-decode`` pp4's own decode GEMM (target ``exl3-decode``); both load their module
through its pin (pp4.certify.loader). docs/worker.md says what each runs.
"""
from __future__ import annotations

import attrs
import torch

from pp4_worker.model.backends import EXL3_NEEDS_CUDA, BackendUnavailable, TritonBackend, unfused_residual_norm
from pp4_worker.model.exl3 import Exl3Group, Exl3Linear


class QuantizedLinears:
    """linear and linear_fp32 of the EXL3 backends: fp16 activations, an Exl3Group part by part;
    ``_run(x, w, out_dtype)`` is each backend's kernel for one Exl3Linear."""

    def _gemm(self, x, w, out_dtype):
        if x.dtype != torch.float16:
            raise ValueError("EXL3 kernels take float16 activations (--dtype float16)")
        x = x if x.is_contiguous() else x.contiguous()
        if isinstance(w, Exl3Group):
            return torch.cat([self._run(x, p, out_dtype) for p in w.parts], dim=1)
        return self._run(x, w, out_dtype)

    def linear(self, x, weight):
        return self._gemm(x, weight, torch.float16)

    def linear_fp32(self, x, weight, cpu_weight_fp32=None):
        return self._gemm(x, weight, torch.float32)


class Exl3Backend(QuantizedLinears, TritonBackend):
    """EXL3's kernels from a pp4-built ``exllamav3_ext`` (stock or facc) where it has them:

    * every linear, the head included, is an EXL3-quantized matrix (pp4_worker/model/exl3.py) run by
      ``exl3_gemm`` (its GEMV kernel for up to 8 rows at 4 bits, its cooperative GEMM otherwise),
      fp32 output for the head;
    * every rms norm is ``rms_norm``, after the all-reduce and residual add (two torch adds);
    * rope is ``rope`` (NEOX style, angles from fp32 inv_freq in the kernel).  It wants q and k
      as packed [B, T, heads, D] tensors, so they are copied out of the fused qkv row first;
      the Triton kernel then writes the rotated K and the V into the cache and folds q.

    Everything else (embedding, attention, silu*mul, noise, head statistics and merge) is the
    triton backend's.  Numbers differ from the other backends' (another model: quantized
    weights), so exactness is checked within this backend only.
    """

    name = "exl3"
    quantized = True
    # exllamav3's cooperative GEMM synchronizes its blocks through one lock buffer per device.
    ranks_may_overlap = False
    ROPE_NEOX = 2  # exllamav3's RopeStyle.NEOX: rotate-half, as the other backends
    GEMV_MAX_ROWS = 8  # exllamav3's EXL3_GEMV_MAX_M
    SELECT = ("heuristic", "autotune")

    def __init__(self, device: torch.device, attention: str, module, target: str, bits: int, head_bits: int,
                 select: str = "heuristic", pdl: bool = False):
        if device.type != "cuda":
            raise BackendUnavailable(EXL3_NEEDS_CUDA)
        if select not in self.SELECT:
            raise BackendUnavailable(f"unknown --exl3-select {select!r} (choose {' or '.join(self.SELECT)})")
        super().__init__(device, attention, pdl=pdl)
        self.ext, self.target, self.bits, self.head_bits, self.select = module, target, bits, head_bits, select
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.reads_start_positions = True
        self.inv_freq = None
        self._parts = {}

    def prepare(self, g) -> None:
        half = g.head_dim // 2
        inv = [g.rope_theta ** (-2.0 * i / g.head_dim) for i in range(half)]
        self.inv_freq = torch.tensor(inv, dtype=torch.float64).to(torch.float32).to(self.device)

    def kernels(self) -> dict[str, str]:
        return {"linears": f"{self.target} exl3_gemm ({self.bits} bits, head {self.head_bits} bits; "
                           f"GEMM kernel by {self.select})",
                "rms norm": f"{self.target} rms_norm", "rope": f"{self.target} rope",
                **{k: v for k, v in super().kernels().items() if k not in ("linears", "rms norm", "rope")}}

    def _run(self, x, w, out_dtype):
        mcg, mul1 = w.codebook == 1, w.codebook == 2
        sms = self._sms_for(x.shape[0], w)
        if w.parts == 1:
            y = torch.empty(x.shape[0], w.out_features, dtype=out_dtype, device=x.device)
            self.ext.exl3_gemm(x, w.trellis, y, w.suh.view(-1), torch.empty_like(x), w.svh, -1, mcg, mul1, sms)
            return y
        # A fused linear whose parts have their own input signs: exl3_gemm takes one suh, so each
        # part runs on its own (exllamav3's forward runs them through its multi-linear kernel).
        outs = []
        for trellis, suh, svh in self._part_views(w):
            y = torch.empty(x.shape[0], svh.shape[0], dtype=out_dtype, device=x.device)
            self.ext.exl3_gemm(x, trellis, y, suh, torch.empty_like(x), svh, -1, mcg, mul1, sms)
            outs.append(y)
        return torch.cat(outs, dim=1)

    def _part_views(self, w):
        """(trellis, suh, svh) of each part, contiguous; made once per linear."""
        key = id(w)
        if key not in self._parts:
            views, start = [], 0
            for i, cols in enumerate(w.part_columns):
                end = start + cols
                views.append((w.trellis[:, start // 16 : end // 16].contiguous(), w.suh[i].contiguous(),
                              w.svh[start:end].contiguous()))
                start = end
            self._parts[key] = (w, views)  # w kept alive, so its id is not reused
        return self._parts[key][1]

    def _sms_for(self, rows: int, w) -> int:
        """exl3_gemm's force_num_sms: 0 where its GEMV kernel serves (up to 8 rows at 2 to 4 bits,
        4 only with the 3inst codebook), else every SM.  A nonzero count makes its cooperative GEMM
        pick its kernel shape by heuristic instead of by timing candidates on first use, so the
        kernel, and with it every bit of the output, is the same in every process on this GPU
        model: a reference written by one process holds in the next."""
        gemv = (rows <= self.GEMV_MAX_ROWS and 2 <= w.bits <= 4 and (w.bits == 4 or w.codebook != 0)
                and w.in_features % 128 == 0 and w.out_features % 128 == 0)
        return 0 if gemv or self.select == "autotune" else self.num_sms

    def rms_norm(self, x, weight, eps: float):
        x2 = x.reshape(-1, x.shape[-1])
        x2 = x2 if x2.is_contiguous() else x2.contiguous()
        out = torch.empty_like(x2)
        self.ext.rms_norm(x2, weight, out, eps, 0.0, 1.0, False, False)
        return out.view(x.shape)

    def residual_norm(self, x, partials, collective, norm_weights, eps: float, consumers=None):
        # exllamav3 has no fused all-reduce + add + norm: torch's adds, then its rms_norm.
        return unfused_residual_norm(self, x, partials, collective, norm_weights, eps)

    def rope_cache_fold(self, qkv, step, cache, hq: int, hkv: int, group: int):
        B, T, heads, d = qkv.shape
        q_rot = qkv[:, :, :hq].contiguous()
        k_rot = qkv[:, :, hq : hq + hkv].contiguous()
        self.ext.rope(q_rot, q_rot, k_rot, k_rot, self.inv_freq, 0, step.start_positions, None,
                      self.ROPE_NEOX, 1.0, None, None, 0.0, 0.0, 0.0, 0, 1, 0)
        q = torch.empty(B, hkv, T * group, d, dtype=qkv.dtype, device=qkv.device)
        pos = step.positions
        self.k.rope_cache_fold_kernel[(B * T, hq + hkv)](
            qkv, pos, pos.stride(0), pos.stride(1), step.rope_table, cache, q,
            T, cache.shape[1], cache.shape[3], q_rot, k_rot, HQ=hq, HKV=hkv, D=d, APPLY_ROPE=False, **self.launch)
        return q


@attrs.frozen(eq=False)
class Transformed:
    """A norm's output already through one linear's input transform: xh [parts, rows, K], for
    ``weight`` only.  The fused kernel that ends a step wrote it, so that linear's GEMM starts
    without an input-transform launch of its own."""

    xh: torch.Tensor
    weight: Exl3Linear

    def rows(self, first: int, count: int) -> torch.Tensor:
        part = self.xh[:, first : first + count]
        return part if part.is_contiguous() else part.contiguous()


class Exl3DecodeBackend(QuantizedLinears, TritonBackend):
    """EXL3-quantized linears through pp4's own decode GEMM (the ``exl3-decode`` module pp4 builds:
    pp4_worker/ext/exl3_decode), every other step the triton backend's.

    The GEMM decodes the trellis as EXL3 does, straight into tensor-core fragments, and
    accumulates in fp32: one input transform per part, one pass over the weights, then the
    output transform.  Weights are the exl3 backend's (synthetic, or a checkpoint's).

    Launches are saved where the step before a linear can do its input transform: the all-reduce,
    residual add and norm before qkv, gate_up and the head are one kernel with that transform
    (``norm_transform``), and gate_up's output transform, silu * mul and down's input transform
    are one kernel (``gemm_swiglu``); five launches a rank and pass fewer.  A linear of parts at
    different bit widths (an Exl3Group) runs unfused.
    """

    name = "exl3-decode"
    quantized = True

    def __init__(self, device: torch.device, attention: str, module, pdl: bool = False, fuse: bool = True):
        if device.type != "cuda":
            raise BackendUnavailable("--backend exl3-decode runs CUDA kernels: it needs --device cuda")
        super().__init__(device, attention, pdl=pdl)
        self.ext = module
        self.fuse = fuse

    def kernels(self) -> dict[str, str]:
        linears = {"linears": "pp4 exl3-decode gemm (trellis decoded into tensor-core fragments, fp32 accumulation)"}
        if not self.fuse:
            return {**linears, **{k: v for k, v in super().kernels().items() if k != "linears"}}
        return {**linears,
                "rms norm": "pp4 exl3-decode norm_transform (all-reduce, residual, norm and the next input transform)",
                "silu*mul": "pp4 exl3-decode gemm_swiglu (gate_up's output transform, silu*mul, down's input transform)",
                **{k: v for k, v in super().kernels().items() if k not in ("linears", "rms norm")}}

    # The GEMM's row limit (pp4_exl3::kMaxRows, exl3_decode.h): the prefill sends chunks of 64 rows.
    MAX_ROWS = 32
    # norm_transform's widest row (four 128-column blocks for each of a block's 32 warps, ops.cu).
    NORM_MAX_COLUMNS = 16384

    @staticmethod
    def _fusable(w) -> bool:
        return isinstance(w, Exl3Linear) and w.in_features % 128 == 0

    def _run(self, x, w, out_dtype):
        y = torch.empty(x.shape[0], w.out_features, dtype=out_dtype, device=x.device)
        suh, columns = w.suh.view(w.parts, w.in_features), list(w.part_columns)
        for first in range(0, x.shape[0], self.MAX_ROWS):  # row slices of contiguous tensors stay contiguous
            rows = slice(first, first + self.MAX_ROWS)
            self.ext.gemm(x[rows], w.trellis, suh, w.svh, columns, y[rows], w.codebook, 0, self.pdl)
        return y

    def _run_transformed(self, x: Transformed, w, out_dtype):
        if x.weight is not w:
            raise ValueError("an input transformed for one linear was given to another")
        rows = x.xh.shape[1]
        y = torch.empty(rows, w.out_features, dtype=out_dtype, device=x.xh.device)
        for first in range(0, rows, self.MAX_ROWS):
            self.ext.gemm_transformed(x.rows(first, self.MAX_ROWS), w.trellis, w.svh, list(w.part_columns),
                                      y[first : first + self.MAX_ROWS], w.codebook, 0, self.pdl)
        return y

    def linear(self, x, weight):
        if isinstance(x, Transformed):
            return self._run_transformed(x, weight, torch.float16)
        return super().linear(x, weight)

    def linear_fp32(self, x, weight, cpu_weight_fp32=None):
        if isinstance(x, Transformed):
            return self._run_transformed(x, weight, torch.float32)
        return super().linear_fp32(x, weight, cpu_weight_fp32)

    def residual_norm(self, x, partials, collective, norm_weights, eps: float, consumers=None):
        """As the triton backend's one kernel per rank, which here also does the input transform of
        the rank's next linear (in ``consumers``) and returns Transformed inputs for it."""
        if (not self.fuse or consumers is None or len(partials) != 2 or partials[0].shape[-1] > self.NORM_MAX_COLUMNS
                or not all(self._fusable(w) for w in consumers)):
            return super().residual_norm(x, partials, collective, norm_weights, eps, consumers)
        p0, p1 = (p if p.is_contiguous() else p.contiguous() for p in partials)
        rows, H = p0.shape
        x_new = torch.empty_like(p0)
        normed = []
        for rank, (w, lin) in enumerate(zip(norm_weights, consumers)):
            xh = torch.empty(lin.parts, rows, H, dtype=p0.dtype, device=p0.device)
            self.ext.norm_transform(x, p0, p1, w, lin.suh.view(lin.parts, H), x_new if rank == 0 else None, xh,
                                    eps, self.pdl)
            normed.append(Transformed(xh, lin))
        return x_new, normed

    def mlp(self, n, gate_up, down, channels: int):
        if not (isinstance(n, Transformed) and self._fusable(gate_up) and self._fusable(down)
                and gate_up.out_features == 2 * channels and down.parts == 1):
            return super().mlp(n, gate_up, down, channels)
        rows = n.xh.shape[1]
        xh_down = torch.empty(1, rows, channels, dtype=n.xh.dtype, device=n.xh.device)
        for first in range(0, rows, self.MAX_ROWS):
            self.ext.gemm_swiglu(n.rows(first, self.MAX_ROWS), gate_up.trellis, gate_up.svh,
                                 list(gate_up.part_columns), down.suh.view(-1), xh_down[:, first : first + self.MAX_ROWS],
                                 gate_up.codebook, 0, self.pdl)
        return self.linear(Transformed(xh_down, down), down)

    def last_positions(self, n, B: int, T: int):
        if isinstance(n, Transformed):
            xh = n.xh.view(n.xh.shape[0], B, T, -1)[:, :, -1]
            return Transformed(xh if xh.is_contiguous() else xh.contiguous(), n.weight)
        return super().last_positions(n, B, T)


def load_decode_module(build_dir: str):
    """pp4's EXL3 decode GEMM module, checked against its pin."""
    from pp4.certify.loader import load_target
    from pp4.certify.pin import PinError

    try:
        return load_target("exl3-decode", build_dir)
    except (ImportError, OSError, PinError) as exc:
        raise BackendUnavailable(
            f"--backend exl3-decode needs the pp4-built exl3-decode module in {build_dir} ({exc}); build it with "
            "`python configure.py --ext exl3-decode && ninja exl3-decode` and pass that build directory as "
            "--exl3-build") from exc


def load_exl3_module(build_dir: str, target: str):
    """The pp4-built EXL3 module of ``target`` ("exl3" or "exl3-facc"), checked against its pin."""
    from pp4.certify.loader import load_target
    from pp4.certify.pin import PinError

    try:
        return load_target(target, build_dir)
    except (ImportError, OSError, PinError) as exc:
        raise BackendUnavailable(
            f"--backend exl3 needs the pp4-built {target} module in {build_dir} ({exc}); build it with "
            f"`python configure.py --ext exl3{' --ext exl3-facc' if target != 'exl3' else ''} && ninja {target}` "
            "and pass that build directory as --exl3-build") from exc
