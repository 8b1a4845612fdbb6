"""--backend exl3-decode's fused steps, wired into the model, on the CPU.

The CUDA module cannot run here, so its four functions run as its header (exl3_decode.h)
documents them, in plain torch (TorchDecodeModule, with the shape and layout checks its bindings
make); the backend's other steps are its Triton kernels under Triton's interpreter. What is under
test is the backend's plumbing: which linear each norm transforms for, the transformed input
reaching that linear and no other, the head's last positions, the MLP's fused path, chunks of at
most 32 rows, and the fallback where a linear's parts differ in bit width. The kernels themselves
are checked against the same semantics on the GPU (bench/exl3_fused_check.py).
"""
import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: @triton.jit picks the interpreter

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from test_worker_exl3_checkpoint import G_GROUPED, llama_logits, write_checkpoint  # noqa: E402

from pp4.worker.model import exl3_checkpoint  # noqa: E402
from pp4.worker.model.config import Geometry  # noqa: E402
from pp4.worker.model.exl3_reference import decode, hadamard128  # noqa: E402

MAX_ROWS = 32  # pp4_exl3::kMaxRows
# 128-wide heads: each head's attention output is one Hadamard block of o's input, so attention's
# combine kernel does o's input transform (per rank: 2 query heads over 1 KV head).
G_WIDE_HEADS = Geometry(hidden=256, heads=4, kv_heads=2, head_dim=128, mlp=256, vocab=512, layers=2)


class TorchDecodeModule:
    """pp4_exl3_decode's gemm, gemm_transformed, gemm_swiglu and norm_transform in torch: fp64
    inside, fp16 where the kernels round (the transformed inputs, the outputs, gate and up before
    silu * up, the residual, the norm's output)."""

    def __init__(self):
        self.calls = {"gemm": 0, "gemm_transformed": 0, "gemm_partials": 0, "gemm_swiglu": 0, "norm_transform": 0}

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

    def gemm_partials(self, xh, trellis, part_columns, codebook, splits=0, pdl=False):
        """[2, rows, N] fp32: the products of K's two halves (the kernel adds splits in order)."""
        self.calls["gemm_partials"] += 1
        self._check(xh)
        w = decode(trellis, codebook).double()
        columns = list(part_columns) or [w.shape[1]]
        half = xh.shape[2] // 2
        halves = []
        for ks in (slice(0, half), slice(half, None)):
            outs, start = [], 0
            for part, cols in enumerate(columns):
                outs.append(xh[part, :, ks].double() @ w[ks, start : start + cols])
                start += cols
            halves.append(torch.cat(outs, dim=1))
        return torch.stack(halves).float()

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
    from pp4.worker.model.backends import TritonBackend
    from pp4.worker.model.exl3_backends import Exl3DecodeBackend

    class CpuExl3Decode(Exl3DecodeBackend):
        def __init__(self):  # the real one refuses a CPU: its module is CUDA's
            TritonBackend.__init__(self, torch.device("cpu"), "fused")
            self.ext, self.fuse = module, fuse

    return CpuExl3Decode()


def worker_logits(tmp_path, monkeypatch, fuse: bool, ids, bounds, g=G_GROUPED):
    from pp4.worker.model import model as model_module
    from pp4.worker.model.config import ModelSettings

    module = TorchDecodeModule()
    monkeypatch.setattr(model_module, "make_backend", lambda *a, **k: cpu_backend(module, fuse))
    settings = ModelSettings(geometry=g, context=64, weights_dir=str(tmp_path), backend="exl3-decode")
    model = model_module.TensorParallelDraft(settings, torch.device("cpu"))
    got = torch.empty(len(ids), g.vocab, dtype=torch.float64)
    for a, z in bounds:
        positions = torch.arange(a, z)[None, :]
        normed = model.forward(ids[None, a:z], model.call_positions(positions).step(0, z - a))
        be = model.backend
        last = [be.last_positions(n, 1, z - a) for n in normed]  # what the head reads in a worker call
        got[a:z] = torch.cat([r.backend.linear_fp32(n, r.w.head) for r, n in zip(model.ranks, normed)], 1).double()
        heads = torch.cat([r.backend.linear_fp32(n, r.w.head) for r, n in zip(model.ranks, last)], 1).double()
        assert torch.equal(heads[0], got[z - 1])
    return got, module.calls


@pytest.mark.parametrize("g, kv_bits", [(G_GROUPED, None), (G_GROUPED, 5), (G_WIDE_HEADS, None)],
                         ids=["grouped", "grouped-kv5", "wide-heads"])
def test_the_fused_steps_compute_what_the_steps_apart_do(tmp_path, monkeypatch, g, kv_bits):
    """A prefill of 40 rows (two chunks of the GEMM) and single-token steps, fused and apart, against
    a plain fp64 Llama over the checkpoint's dense weights. kv_bits 5: q, k and v differ in bit
    width, so qkv runs unfused (an Exl3Group) while the MLP and the head still fuse. Wide heads
    (128): o's input comes transformed from attention's combine kernel."""
    write_checkpoint(tmp_path, g=g, kv_bits=kv_bits)
    ids = torch.randint(3, g.vocab, (43,), generator=torch.Generator().manual_seed(5))
    bounds = [(0, 40), (40, 41), (41, 42), (42, 43)]
    fused, fused_calls = worker_logits(tmp_path, monkeypatch, True, ids, bounds, g)
    apart, apart_calls = worker_logits(tmp_path, monkeypatch, False, ids, bounds, g)
    want = llama_logits(exl3_checkpoint.Exl3Checkpoint(str(tmp_path)), g, ids)

    # Each forward: per rank, norms before qkv (unless its parts differ), gate_up and the head; and
    # one gemm_swiglu per rank and layer (two for the 40-row prefill: 32 + 8 rows).
    norms_per_forward = 2 * (g.layers * (1 if kv_bits else 2) + 1)
    assert fused_calls["norm_transform"] == len(bounds) * norms_per_forward
    assert fused_calls["gemm_swiglu"] == (len(bounds) + 1) * 2 * g.layers
    # gemm_transformed, per rank and forward: qkv where its input was transformed (with wide heads
    # only over 32 rows: else the rope kernel finishes it from gemm_partials), down and, with wide
    # heads, o in every layer, and the head over all rows, each once per chunk of 32 rows; the head
    # again on the last position.
    wide = g.head_dim == 128
    chunks = [-(-(z - a) // MAX_ROWS) for a, z in bounds]
    qkv_transformed = [0 if kv_bits else (c if not wide or c > 1 else 0) for c in chunks]
    assert fused_calls["gemm_transformed"] == sum(
        2 * (g.layers * (q + (1 + wide) * c) + c + 1) for q, c in zip(qkv_transformed, chunks))
    assert fused_calls["gemm_partials"] == (2 * g.layers * sum(c == 1 for c in chunks) if wide and not kv_bits else 0)
    assert apart_calls["norm_transform"] == apart_calls["gemm_swiglu"] == apart_calls["gemm_transformed"] == 0
    assert apart_calls["gemm_partials"] == 0
    assert (fused - apart).abs().max() < 0.01 * apart.std()
    for got in (fused, apart):
        assert (got - want).abs().max() < 0.02 * want.std()  # fp16 activations against fp64
        assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("heads_first", [False, True])
@pytest.mark.parametrize("T", [1, 5])
def test_attention_hands_o_its_input_transformed_bit_for_bit(heads_first, T):
    """attend_for with 128-wide heads: attention's combine kernel writes had128(fp16(att) * suh) /
    sqrt(128), the exl3-decode module's input transform of the attention output the plain kernel
    writes, bit for bit: the oracle is exllamav3's butterfly order in torch (exl3_reference) on the
    plain output, with the module's roundings (the product to fp16, the result to fp16)."""
    from pp4.worker.model.exl3 import Exl3Linear
    from pp4.worker.model.exl3_backends import Transformed
    from pp4.worker.model.model import StepView

    gen = torch.Generator().manual_seed(T + 2 * heads_first)
    B, hkv, group, d, S = 2, 2, 3, 128, 80
    K = hkv * group * d
    be = cpu_backend(TorchDecodeModule(), True)
    # Inputs that make every rounding and the order of additions show: suh not only signs (the
    # product rounds to fp16), and V's columns of magnitudes 2^-10 to 2^10 (fp32 sums of them round
    # differently in another order).
    suh = (torch.rand(K, generator=gen) + 0.5) * torch.where(torch.rand(K, generator=gen) < 0.5, -1.0, 1.0)
    o = Exl3Linear(trellis=torch.zeros(K // 16, 16, 64, dtype=torch.int16), suh=suh.half(),
                   svh=torch.ones(256, dtype=torch.float16), bits=4)
    q = torch.randn(B, hkv, T * group, d, generator=gen).half()
    cache = torch.randn(2, B, hkv, S, d, generator=gen)
    cache[1] *= torch.exp2(torch.randint(-10, 11, (d,), generator=gen).float())
    cache = cache.half()
    positions = torch.arange(30, 30 + T).repeat(B, 1)
    positions[1] += 17
    # fused attention reads only the positions (the backend does not read position tables)
    step = StepView(positions=positions, batch_rows=None, cos=None, sin_signed=None, mask=None, rope_table=None)
    got = be.attend_for(o, q, cache, step, 0.088, T, group, heads_first)
    assert isinstance(got, Transformed) and got.weight is o and got.xh.shape == (1, B * T, K)
    att = be.attend(q, cache, step, 0.088, T, group, heads_first)
    want = hadamard128((att.float() * o.suh.float()).half().float()).half()
    assert torch.equal(got.xh[0], want)
    # an o that is not one part of 128-wide blocks gets the plain output
    assert torch.equal(be.attend_for(object(), q, cache, step, 0.088, T, group, heads_first), att)


def test_a_transformed_input_reaches_only_its_own_linear():
    from pp4.worker.model.exl3_backends import Transformed

    be = cpu_backend(TorchDecodeModule(), True)
    xh = torch.zeros(1, 2, 256, dtype=torch.float16)
    qkv, head = object(), object()
    with pytest.raises(ValueError, match="transformed for one linear was given to another"):
        be.linear(Transformed(xh, qkv), head)


def test_a_hidden_size_wider_than_the_norm_kernel_runs_unfused():
    from pp4.worker.model.exl3 import Exl3Linear
    from pp4.worker.model.model import ColocatedSum

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


class PresetPartials:
    """A module whose gemm_partials hands back given partial sums: the rope kernel's input."""

    def __init__(self, partials):
        self.partials, self.calls = partials, 0

    def gemm_partials(self, xh, trellis, part_columns, codebook, splits=0, pdl=False):
        self.calls += 1
        assert xh.shape[1] == self.partials.shape[1]
        return self.partials


@pytest.mark.parametrize("splits", [1, 3])
def test_rope_makes_qkv_from_the_partial_sums_bit_for_bit(splits):
    """qkv_rope_cache_fold with 128-wide heads: the rope kernel makes each head from the GEMM's
    partial sums (added in split order, had128 / sqrt(128) * svh, fp16) and rotates it; q and the
    cache equal, bit for bit, those of the plain rope kernel on qkv made by the oracle: the same
    steps in torch (exl3_reference's butterflies). Partial sums of magnitudes 2^-10 to 2^10, so that
    another order of additions or another rounding shows."""
    from pp4.worker.model.exl3 import Exl3Linear
    from pp4.worker.model.exl3_backends import Transformed
    from pp4.worker.model.model import StepView

    gen = torch.Generator().manual_seed(splits)
    B, T, hq, hkv, d, S, K = 4, 8, 4, 2, 128, 16, 256  # 32 rows: enough values for a rounding to show
    N = (hq + 2 * hkv) * d
    partials = torch.randn(splits, B * T, N, generator=gen) * torch.exp2(torch.randint(-10, 11, (N,), generator=gen).float())
    svh = ((torch.rand(N, generator=gen) + 0.5) / 16).half()
    module = PresetPartials(partials)
    be = cpu_backend(module, True)
    w = Exl3Linear(trellis=torch.zeros(K // 16, N // 16, 64, dtype=torch.int16), suh=torch.ones(K, dtype=torch.float16),
                   svh=svh, bits=4)
    positions = torch.arange(T).repeat(B, 1) + torch.tensor([[0], [3], [5], [8]])
    table = torch.randn(S, 2, d, generator=gen).half()
    step = StepView(positions=positions, batch_rows=None, cos=None, sin_signed=None, mask=None, rope_table=table)
    cache_fused, cache_plain = torch.zeros(2, 2 * B, hkv, S, d).half(), torch.zeros(2, 2 * B, hkv, S, d).half()
    q_fused = be.qkv_rope_cache_fold(Transformed(torch.zeros(1, B * T, K).half(), w), w, step, cache_fused, hq, hkv, 2)
    assert module.calls == 1
    summed = partials[0].clone()
    for s in range(1, splits):
        summed += partials[s]
    qkv = (hadamard128(summed) * svh.float()).half().view(B, T, hq + 2 * hkv, d)
    q_plain = be.rope_cache_fold(qkv, step, cache_plain, hq, hkv, 2)
    assert torch.equal(q_fused, q_plain)
    assert torch.equal(cache_fused, cache_plain) and cache_plain.abs().sum() > 0
