"""--backend exl3-decode's fused steps, wired into the model, on the CPU.

The CUDA module cannot run here, so its four functions run as its header (exl3_decode.h)
documents them, in plain torch (TorchDecodeModule, with the shape and layout checks its bindings
make); the backend's other steps are its Triton kernels under Triton's interpreter. What is under
test is the backend's plumbing: which linear each norm transforms for, the transformed input
reaching that linear and no other, the head's last positions, the MLP's fused path, chunks of at
most 32 rows, and the fallback where a linear's parts differ in bit width. The kernels themselves
are checked against the same semantics on the GPU (tests/gpu/exl3_fused_check.py).
"""
import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: @triton.jit picks the interpreter

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from test_worker_exl3_checkpoint import G_GROUPED, llama_logits, write_checkpoint  # noqa: E402

from pp4_worker.model import exl3_checkpoint  # noqa: E402
from pp4_worker.model.exl3_reference import decode, hadamard128  # noqa: E402

MAX_ROWS = 32  # pp4_exl3::kMaxRows


class TorchDecodeModule:
    """pp4_exl3_decode's gemm, gemm_transformed, gemm_swiglu and norm_transform in torch: fp64
    inside, fp16 where the kernels round (the transformed inputs, the outputs, gate and up before
    silu * up, the residual, the norm's output)."""

    def __init__(self):
        self.calls = {"gemm": 0, "gemm_transformed": 0, "gemm_swiglu": 0, "norm_transform": 0}

    @staticmethod
    def _check(*tensors):
        for t in tensors:
            assert t.is_contiguous(), "the module takes contiguous tensors only"

    @staticmethod
    def _transform(x, suh):
        return torch.stack([hadamard128(x.double() * s.double()) for s in suh]).half()

    @staticmethod
    def _product(xh, trellis, svh, part_columns, codebook):
        assert xh.dim() == 3 and 1 <= xh.shape[1] <= MAX_ROWS, f"xh {tuple(xh.shape)}: 1 to {MAX_ROWS} rows"
        w = decode(trellis, codebook).double()
        columns = list(part_columns) or [w.shape[1]]
        assert xh.shape[0] == len(columns) and xh.shape[2] == w.shape[0]
        outs, start = [], 0
        for part, cols in enumerate(columns):
            outs.append(xh[part].double() @ w[:, start : start + cols])
            start += cols
        return hadamard128(torch.cat(outs, dim=1)) * svh.double()

    def gemm(self, x, trellis, suh, svh, part_columns, out, codebook, splits=0, pdl=False):
        self.calls["gemm"] += 1
        self._check(x, suh, out)
        xh = self._transform(x, suh.view(-1, x.shape[1]))
        out.copy_(self._product(xh, trellis, svh, part_columns, codebook))

    def gemm_transformed(self, xh, trellis, svh, part_columns, out, codebook, splits=0, pdl=False):
        self.calls["gemm_transformed"] += 1
        self._check(xh, out)
        out.copy_(self._product(xh, trellis, svh, part_columns, codebook))

    def gemm_swiglu(self, xh, trellis, svh, part_columns, suh_down, xh_down, codebook, splits=0, pdl=False):
        self.calls["gemm_swiglu"] += 1
        self._check(xh, suh_down, xh_down)
        y = self._product(xh, trellis, svh, part_columns, codebook).half().float()
        channels = y.shape[1] // 2
        gate, up = y[:, :channels], y[:, channels:]
        act = (gate / (1.0 + torch.exp(-gate)) * up).half()
        assert xh_down.shape == (1, *act.shape)
        xh_down.copy_(self._transform(act, suh_down.view(1, -1)))

    def norm_transform(self, x, p0, p1, weight, suh, x_out, xh, eps, pdl=False):
        self.calls["norm_transform"] += 1
        self._check(p0, p1, suh, xh, *(t for t in (x, x_out) if t is not None))
        r = (p0.float() + p1.float()).half()
        if x is not None:
            r = (x.float() + r.float()).half()
        if x_out is not None:
            x_out.copy_(r)
        rf = r.float()
        n = (rf / torch.sqrt((rf * rf).mean(-1, keepdim=True) + eps) * weight.float()).half()
        xh.copy_(self._transform(n, suh.view(-1, n.shape[1])))


def cpu_backend(module, fuse: bool):
    from pp4_worker.model.backends import TritonBackend
    from pp4_worker.model.exl3_backends import Exl3DecodeBackend

    class CpuExl3Decode(Exl3DecodeBackend):
        def __init__(self):  # the real one refuses a CPU: its module is CUDA's
            TritonBackend.__init__(self, torch.device("cpu"), "fused")
            self.ext, self.fuse = module, fuse

    return CpuExl3Decode()


def worker_logits(tmp_path, monkeypatch, fuse: bool, ids, bounds):
    from pp4_worker.model import model as model_module
    from pp4_worker.model.config import ModelSettings

    module = TorchDecodeModule()
    monkeypatch.setattr(model_module, "make_backend", lambda *a, **k: cpu_backend(module, fuse))
    settings = ModelSettings(geometry=G_GROUPED, context=64, weights_dir=str(tmp_path), backend="exl3-decode")
    model = model_module.TensorParallelDraft(settings, torch.device("cpu"))
    got = torch.empty(len(ids), G_GROUPED.vocab, dtype=torch.float64)
    for a, z in bounds:
        positions = torch.arange(a, z)[None, :]
        normed = model.forward(ids[None, a:z], model.call_positions(positions).step(0, z - a))
        be = model.backend
        last = [be.last_positions(n, 1, z - a) for n in normed]  # what the head reads in a worker call
        got[a:z] = torch.cat([r.backend.linear_fp32(n, r.w.head) for r, n in zip(model.ranks, normed)], 1).double()
        heads = torch.cat([r.backend.linear_fp32(n, r.w.head) for r, n in zip(model.ranks, last)], 1).double()
        assert torch.equal(heads[0], got[z - 1])
    return got, module.calls


@pytest.mark.parametrize("kv_bits", [None, 5])
def test_the_fused_steps_compute_what_the_steps_apart_do(tmp_path, monkeypatch, kv_bits):
    """A prefill of 40 rows (two chunks of the GEMM) and single-token steps, fused and apart, against
    a plain fp64 Llama over the checkpoint's dense weights. kv_bits 5: q, k and v differ in bit
    width, so qkv runs unfused (an Exl3Group) while the MLP and the head still fuse."""
    write_checkpoint(tmp_path, g=G_GROUPED, kv_bits=kv_bits)
    ids = torch.randint(3, G_GROUPED.vocab, (43,), generator=torch.Generator().manual_seed(5))
    bounds = [(0, 40), (40, 41), (41, 42), (42, 43)]
    fused, fused_calls = worker_logits(tmp_path, monkeypatch, True, ids, bounds)
    apart, apart_calls = worker_logits(tmp_path, monkeypatch, False, ids, bounds)
    want = llama_logits(exl3_checkpoint.Exl3Checkpoint(str(tmp_path)), G_GROUPED, ids)

    # Each forward: per rank, norms before qkv (unless its parts differ), gate_up and the head; and
    # one gemm_swiglu per rank and layer (two for the 40-row prefill: 32 + 8 rows).
    norms_per_forward = 2 * (G_GROUPED.layers * (1 if kv_bits else 2) + 1)
    assert fused_calls["norm_transform"] == len(bounds) * norms_per_forward
    assert fused_calls["gemm_swiglu"] == (len(bounds) + 1) * 2 * G_GROUPED.layers
    assert apart_calls["norm_transform"] == apart_calls["gemm_swiglu"] == apart_calls["gemm_transformed"] == 0
    assert (fused - apart).abs().max() < 0.01 * apart.std()
    for got in (fused, apart):
        assert (got - want).abs().max() < 0.02 * want.std()  # fp16 activations against fp64
        assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_a_transformed_input_reaches_only_its_own_linear():
    from pp4_worker.model.exl3_backends import Transformed

    be = cpu_backend(TorchDecodeModule(), True)
    xh = torch.zeros(1, 2, 256, dtype=torch.float16)
    qkv, head = object(), object()
    with pytest.raises(ValueError, match="transformed for one linear was given to another"):
        be.linear(Transformed(xh, qkv), head)


def test_a_hidden_size_wider_than_the_norm_kernel_runs_unfused():
    from pp4_worker.model.exl3 import Exl3Linear
    from pp4_worker.model.model import ColocatedSum

    module = TorchDecodeModule()
    be = cpu_backend(module, True)
    H = be.NORM_MAX_COLUMNS + 128
    lin = Exl3Linear(trellis=torch.zeros(H // 16, 8, 64, dtype=torch.int16), suh=torch.ones(H, dtype=torch.float16),
                     svh=torch.ones(128, dtype=torch.float16), bits=4)
    partials = [torch.randn(2, H, generator=torch.Generator().manual_seed(i)).half() for i in range(2)]
    weights = [torch.ones(H, dtype=torch.float16)] * 2
    x, normed = be.residual_norm(None, partials, ColocatedSum(), weights, 1e-5, [lin, lin])
    assert module.calls["norm_transform"] == 0
    assert all(isinstance(n, torch.Tensor) and n.shape == (2, H) for n in normed)
    assert torch.equal(x, (partials[0].float() + partials[1].float()).half())
