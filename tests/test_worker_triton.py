"""The Triton backend's fused kernels on the CPU, through Triton's interpreter.

The kernels are the ones the GPU runs; the interpreter executes them with numpy.  They
are checked against the float64 unsharded reference, against the torch backend on the
same weights and states, and by the same bit-for-bit mode checks the gate makes.
"""
import math
import os

import pytest

# Before triton is imported anywhere in this process: @triton.jit picks the interpreter then.
os.environ["TRITON_INTERPRET"] = "1"

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import test_worker_model as model_tests  # noqa: E402

from pp4_worker.kernels import skinny_gemm  # noqa: E402
from pp4_worker.kernels import triton_kernels  # noqa: E402
from pp4_worker.kernels.skinny_gemm import SkinnyGemm, SkinnyTiles, plan  # noqa: E402
from pp4_worker.model import hashing  # noqa: E402
from pp4_worker.model import sampling  # noqa: E402
from pp4_worker.model import states as state_io  # noqa: E402
from pp4_worker.model.backends import BackendUnavailable, TritonBackend  # noqa: E402
from pp4_worker.model.factory import make_backend  # noqa: E402
from pp4_worker.model.config import (  # noqa: E402
    GREEDY, SAMPLED, SWITCH, TINY_GEOMETRY, CellKey, Geometry, ModelSettings
)
from pp4_worker.model.draft import DraftWorker  # noqa: E402
from pp4_worker.model.model import TensorParallelDraft  # noqa: E402

CONTEXT = model_tests.CONTEXT


def _worker(backend, geometry=TINY_GEOMETRY, context=CONTEXT, attention=None):
    # cuBLAS linears: the skinny GEMM has its own test below (test_skinny_linear_matches_float64 and after).
    settings = ModelSettings(geometry, context=context, backend=backend, attention=attention, gemm="cublas")
    return DraftWorker(TensorParallelDraft(settings, torch.device("cpu")))


@pytest.fixture(scope="module")
def pair():
    tw, pw = _worker("triton"), _worker("torch")
    states = state_io.synthetic_states(pw, 3) + state_io.capture_states(pw, 3)
    return tw, pw, states


def test_backend_is_named_in_the_fingerprint(pair):
    tw, pw, _ = pair
    assert tw.model.backend.name == "triton" and tw.model.fingerprint() != pw.model.fingerprint()


def test_matches_unsharded_float64_reference(pair):
    tw, _, states = pair
    model_tests.test_sharded_model_matches_unsharded_float64_reference(tw, states)


def test_matches_float64_reference_with_several_kv_heads_per_rank():
    geo = Geometry(hidden=256, heads=8, kv_heads=4, head_dim=32, mlp=512, vocab=1024, layers=2)
    w = _worker("triton", geo, 32)
    model_tests.test_sharded_model_matches_unsharded_float64_reference(w, state_io.synthetic_states(w, 2))


# Slow under the Triton interpreter (about 40 s each on 2 cores): the quick suite keeps the
# references and the other kernels' checks.
@pytest.mark.slow
@pytest.mark.parametrize("depth", [4, 5])
def test_modes_agree_bit_for_bit(pair, depth):
    tw, _, states = pair
    model_tests.test_greedy_equals_switch_all_t0_and_sampled_equals_switch_all_t1(tw, states, depth)


def test_agrees_with_the_torch_backend(pair):
    """Same weights, same states: the KV written by a call and the proposals agree; only
    the last bits of the 16-bit activations may differ (fp32 inside, one rounding)."""
    tw, pw, states = pair
    B, D = 4, 5
    for w in (tw, pw):
        for slot, st in enumerate(states[:B]):
            w.load_request(slot, st)
    for mode in (GREEDY, SAMPLED):
        a = model_tests._run(tw, CellKey(B, D, mode))
        b = model_tests._run(pw, CellKey(B, D, mode))
        assert torch.equal(a.proposals, b.proposals), (mode, a.proposals, b.proposals)
        assert torch.allclose(a.confidences, b.confidences, rtol=2e-2)
    for ra, rb in zip(tw.model.ranks, pw.model.ranks):
        ka, kb = ra.kv[0][:, :B].float(), rb.kv[0][:, :B].float()
        assert (ka - kb).abs().max() <= 2e-2 * kb.abs().max()
        assert (ka != 0).sum() == (kb != 0).sum()  # the same slots written


def test_fused_attention_agrees_with_the_gemm_path(pair):
    """Same backend, attention fused vs torch's GEMMs: the same function of the cache."""
    tw, _, states = pair
    gw = _worker("triton", attention="gemm")
    assert gw.model.fingerprint() != tw.model.fingerprint()
    for st in states[:3]:
        for w in (tw, gw):
            w.load_request(0, st)
        a, b = model_tests._run(tw, CellKey(1, 4, GREEDY)), model_tests._run(gw, CellKey(1, 4, GREEDY))
        assert torch.equal(a.proposals, b.proposals)
        assert torch.allclose(a.confidences, b.confidences, rtol=1e-2)


def test_call_is_idempotent(pair):
    tw, _, states = pair
    model_tests.test_call_is_idempotent_and_depends_on_the_state(tw, states)


def _stats(be, logits, mode, noise, t1, offset, chunks):
    return be.shard_stats(logits, mode, noise, t1, offset, chunks)


@pytest.mark.parametrize("chunks", [1, 4])
def test_head_choice_with_ties_matches_the_float64_reference(chunks):
    """Planted ties across chunks and across the two shards: the lowest global id wins."""
    be = TritonBackend(torch.device("cpu"), gemm="cublas")
    gen = torch.Generator().manual_seed(5)
    B, V = 3, 512
    full = torch.randn(B, 2 * V, generator=gen) * 3
    full[0, 7] = full[0, 300] = full[0, V + 2] = full[0].max() + 1  # tie inside and across shards
    full[1, V + 9] = full[1, V + 100] = full[1].max() + 2  # tie inside rank 1
    noise = torch.rand(B, 2 * V, generator=gen)
    t1 = torch.tensor([False, True, True])
    for mode in (GREEDY, SAMPLED, SWITCH):
        stats = [_stats(be, full[:, r * V:(r + 1) * V].contiguous(), mode, noise[:, r * V:(r + 1) * V].contiguous(),
                        t1, r * V, chunks) for r in range(2)]
        D = 5
        prop = torch.full((B, D), -7, dtype=torch.int64)
        conf = torch.full((B, D), float("nan"))
        q = torch.full((B, 5), float("nan"))
        be.merge_choice(stats, prop, conf, q, 2, mode, t1, torch.zeros(()))
        sampled = {GREEDY: [False] * B, SAMPLED: [True] * B, SWITCH: t1.tolist()}[mode]
        ref = sampling.reference_choice(full.double().tolist(), noise.double().tolist(), sampled)
        for r, (tok, p) in enumerate(ref):
            assert prop[r, 2].item() == tok, (mode, r)
            assert abs(conf[r, 2].item() - p) <= 1e-5 * p
            assert q[r, 2].item() == (conf[r, 2].item() if sampled[r] else 0.0)
        assert prop[0, 2].item() == 7 or mode != GREEDY
        assert torch.isnan(conf[:, [0, 1, 3, 4]]).all()  # only column 2 written


@pytest.mark.parametrize("with_residual", [False, True])
def test_fused_residual_norm_equals_the_unfused_steps_bit_for_bit(with_residual):
    """One kernel per rank (all-reduce sum, residual add, norm) against the same steps one at
    a time: torch's half adds (each rounds once, as the kernel does) and the Triton norm."""
    from pp4_worker.model.model import ColocatedSum

    be = TritonBackend(torch.device("cpu"), gemm="cublas")
    gen = torch.Generator().manual_seed(3)
    rows, H = 7, 320  # H not a power of two: the masked tail of the row
    p0, p1, x = ((torch.randn(rows, H, generator=gen) * 4).half() for _ in range(3))
    w0, w1 = (torch.rand(H, generator=gen).half() + 0.5 for _ in range(2))
    x_in = x if with_residual else None
    x_new, (n0, n1) = be.residual_norm(x_in, [p0, p1], ColocatedSum(), [w0, w1], 1e-5)
    expect = p0 + p1 if x_in is None else x + (p0 + p1)
    assert torch.equal(x_new, expect)
    assert torch.equal(n0, be.rms_norm(expect, w0, 1e-5)) and torch.equal(n1, be.rms_norm(expect, w1, 1e-5))
    ref = torch.nn.functional.rms_norm(expect.float(), (H,), w1.float(), 1e-5)
    assert (n1.float() - ref).abs().max() <= 2e-3 * ref.abs().max()


def test_gumbel_noise_kernel_matches_the_torch_noise():
    """Same keys and hash as the torch path (signed 64-bit seeds, a strided [D, B] table and
    output), log(E) within float32 rounding of it, and finite and accurate where u is
    closest to 0 and to 1 (where a plain float32 log(u) would round E to 0)."""
    be, ref_be = TritonBackend(torch.device("cpu"), gemm="cublas"), make_backend("torch", torch.device("cpu"))
    V = 3000
    premix = sampling.vocab_premix(torch.arange(7 * V, 8 * V, dtype=torch.int64))  # a shard's global ids
    seeds = torch.tensor([12345, -7, 2**62 + 11], dtype=torch.int64)
    table = sampling.row_depth_table(4, 5, torch, "cpu")[:4, :3]  # row stride 4: not contiguous
    got, ref = (torch.full((5, 4, V), float("nan")) for _ in range(2))
    be.gumbel_noise(seeds, table, premix, got[:4, :3])
    ref_be.gumbel_noise(seeds, table, premix, ref[:4, :3])
    assert torch.isnan(got[4]).all() and torch.isnan(got[:, 3]).all()  # only [:4, :3] written
    g, r = got[:4, :3], ref[:4, :3]
    assert torch.isfinite(g).all()
    assert ((g - r).abs() <= 1e-6 * r.abs().clamp(min=1.0)).all()
    # The extremes, through premix values whose hash gives s = 0 and s = 2**23 - 1.
    for s_top in (0, 2**23 - 1):
        x = ((s_top << 9) | 0x155) ^ (((s_top << 9) | 0x155) >> 16)  # invert the last xorshift
        x = (x * pow(hashing.MUL_B, -1, 2**32)) & hashing.MASK32
        x ^= (x >> 15) ^ (x >> 30)  # invert x ^= x >> 15
        x = (x * pow(hashing.MUL_A, -1, 2**32)) & hashing.MASK32
        assert hashing.mix32_after_first_shift(x) >> 9 == s_top
        key = int(sampling.row_depth_keys(seeds[:1], table[:1, :1])[0, 0])
        one = torch.full((1, 1, 1), float("nan"))
        be.gumbel_noise(seeds[:1], table[:1, :1], torch.tensor([x ^ key], dtype=torch.int64), one)
        u = (s_top + 0.5) * 2.0**-23
        expect = math.log(-math.log(u))
        assert math.isfinite(one.item()) and abs(one.item() - expect) <= 1e-5 * abs(expect), (s_top, one.item(), expect)


def test_needs_cuda_or_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(BackendUnavailable, match="--backend triton needs a CUDA device"):
        make_backend("triton", torch.device("cpu"))


@pytest.mark.parametrize("rows", [1, 5, 20, 64])
def test_skinny_linear_matches_float64(rows):
    be = TritonBackend(torch.device("cpu"), gemm="triton")
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 384, generator=gen).half()
    w = (torch.randn(72, 384, generator=gen) / 20).half()  # 72 columns: a partial last block
    y = be.linear(x, w)
    ref = x.double() @ w.double().T
    assert y.dtype == torch.float16 and y.shape == (rows, 72)
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-3
    assert torch.equal(be.linear(x, w), y)  # deterministic


@pytest.mark.parametrize("rows", [1, 4])
def test_skinny_head_writes_fp32_logits_that_match_float64(rows, monkeypatch):
    """The head's fp32 logits through the skinny kernel (a wide matrix: the head's tiles)."""
    monkeypatch.setattr(skinny_gemm, "MIN_K", 256)
    monkeypatch.setattr(skinny_gemm, "WIDE_N", 512)
    be = TritonBackend(torch.device("cpu"), gemm="triton")
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 512, generator=gen).half()
    w = (torch.randn(600, 512, generator=gen) / 20).half()  # 600 columns: a partial last 64-block
    calls = []
    real = SkinnyGemm.__call__
    monkeypatch.setattr(SkinnyGemm, "__call__", lambda self, *a, **kw: calls.append(kw) or real(self, *a, **kw))
    y = be.linear_fp32(x, w)
    assert calls == [{"out_dtype": torch.float32}]
    ref = x.double() @ w.double().T
    assert y.dtype == torch.float32 and y.shape == (rows, 600)
    # fp32 out, so no fp16 rounding at the end: far closer than the fp16 linears.
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-5
    assert torch.equal(be.linear_fp32(x, w), y)


@pytest.mark.parametrize("tiles", [SkinnyTiles(16, 128, 1), SkinnyTiles(16, 128, 2), SkinnyTiles(32, 64, 4, 8, 3),
                                   SkinnyTiles(64, 64, 8)], ids=str)
def test_split_k_skinny_linear_adds_its_splits_in_order(tiles):
    """Each split's partial goes to memory and the last program of a column block adds them
    in split order; the counters it used are back at zero for the next launch."""
    gemm = SkinnyGemm(triton_kernels, torch.device("cpu"))
    gen = torch.Generator().manual_seed(tiles.splits)
    x = torch.randn(20, 512, generator=gen).half()
    w = (torch.randn(72, 512, generator=gen) / 20).half()
    y = gemm(x, w, tiles)
    ref = x.double() @ w.double().T
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-3
    assert torch.equal(gemm(x, w, tiles), y)
    assert not gemm.counters.any()
    # The order is fixed, so the sum is too: the same as adding the splits' products by hand.
    step = 512 // tiles.splits
    by_hand = sum(x[:, s * step:(s + 1) * step].float() @ w[:, s * step:(s + 1) * step].float().T
                  for s in range(tiles.splits))
    assert ((y.float() - by_hand.half().float()).abs().max().item()) <= 2e-3


def test_each_split_weight_has_counters_of_its_own():
    """Two ranks' GEMMs may run at once on two streams (--rank-streams on): a column block's
    counter shared between them would let one rank's last program add the other's partials."""
    gemm = SkinnyGemm(triton_kernels, torch.device("cpu"))
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3, 512, generator=gen).half()
    w1, w2 = ((torch.randn(72, 512, generator=gen) / 20).half() for _ in range(2))
    tiles = SkinnyTiles(16, 128, 2)
    y1, y2 = gemm(x, w1, tiles), gemm(x, w2, tiles)
    a, b = gemm.counters_for(w1, 5), gemm.counters_for(w2, 5)  # 72 columns: 5 blocks of 16
    assert a.data_ptr() != b.data_ptr() and abs(a.data_ptr() - b.data_ptr()) >= 5 * a.element_size()
    assert gemm.counters_for(w1, 5).data_ptr() == a.data_ptr()  # the same weight keeps its own
    assert torch.equal(gemm(x, w1, tiles), y1) and torch.equal(gemm(x, w2, tiles), y2)
    assert not gemm.counters.any()


def test_skinny_plan_takes_the_long_strips_and_splits_them_by_shape_alone():
    # The default geometry's per-rank matrices: qkv 4 splits, down 2, gate_up none; o (K 2048)
    # stays with cuBLAS, which the sweep found faster there.
    assert plan(4, 3072, 4096) == plan(20, 3072, 4096) == SkinnyTiles(32, 128, 4)
    assert plan(4, 4096, 7168) == plan(20, 4096, 7168) == SkinnyTiles(32, 128, 2)
    assert plan(1, 14336, 4096).splits == 1
    assert skinny_gemm.takes(20, 4096) and skinny_gemm.takes(1, 7168)
    assert not skinny_gemm.takes(4, 2048) and not skinny_gemm.takes(65, 4096)
    assert plan(1, 4096, 384).splits == 1  # 384 does not halve into whole 128-deep blocks
    # The head (64,128 columns per rank) needs no split; wider, deeper tiles measured fastest.
    assert plan(1, 64128, 4096) == plan(4, 64128, 4096) == SkinnyTiles(64, 256, 1, 4, 3)
    with pytest.raises(ValueError, match="K=384 does not cut into 2 splits of whole 128-deep blocks"):
        SkinnyGemm(triton_kernels, torch.device("cpu"))(torch.zeros(1, 384).half(), torch.zeros(16, 384).half(),
                                                       SkinnyTiles(16, 128, 2))


@pytest.mark.slow
def test_skinny_gemm_model_matches_float64_reference(pair, monkeypatch):
    _, _, states = pair
    # The tiny geometry's K (256, 512) is below the default's bar: lower it so the kernel runs.
    monkeypatch.setattr(skinny_gemm, "MIN_K", 128)
    launches = []
    real = SkinnyGemm.__call__
    monkeypatch.setattr(SkinnyGemm, "__call__", lambda self, *a, **kw: launches.append(a[1].shape) or real(self, *a, **kw))
    w = _worker("triton")
    w2 = DraftWorker(TensorParallelDraft(ModelSettings(TINY_GEOMETRY, context=CONTEXT, backend="triton",
                                                       attention="fused", gemm="triton"), torch.device("cpu")))
    assert w2.model.fingerprint() != w.model.fingerprint()
    model_tests.test_sharded_model_matches_unsharded_float64_reference(w2, states)
    assert launches  # the skinny kernel computed the linears the reference checked


def test_code_and_command_line_pick_the_same_defaults():
    """A worker built from code runs what the command line runs when neither names a choice."""
    from pp4_worker.harness import cli

    for backend in ("torch", "triton"):
        args = cli.build_parser().parse_args(["--backend", backend, "--device", "cpu"])
        cli.validate(args)
        settings = ModelSettings(TINY_GEOMETRY, backend=backend)
        assert (settings.attention, settings.gemm) == (args.attention, args.gemm)
        be = make_backend(backend, torch.device("cpu"))
        assert (be.attention_kind, getattr(be, "gemm", "cublas")) == (args.attention, args.gemm)
    assert ModelSettings(TINY_GEOMETRY, backend="triton").gemm == "triton"  # the skinny GEMM, as the CLI


def test_gemm_option_needs_the_triton_backend():
    with pytest.raises(BackendUnavailable, match="--gemm triton needs --backend triton"):
        make_backend("torch", torch.device("cpu"), "gemm", "triton")
