"""--backend exl3 on the CPU: its synthetic quantized weights, its argument errors, and the
Triton kernel it shares (fed q and k rotated elsewhere).  EXL3's own kernels need a GPU and
the pp4-built module: they run in the H200 sessions (docs/worker.md)."""
import math
import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: @triton.jit picks the interpreter

torch = pytest.importorskip("torch")

from pp4_worker.model import exl3  # noqa: E402
from pp4_worker.model import hashing  # noqa: E402
from pp4_worker.model.backends import BackendUnavailable  # noqa: E402
from pp4_worker.model.factory import make_backend  # noqa: E402
from pp4_worker.model.config import DEFAULT_GEOMETRY, TINY_GEOMETRY, Exl3Options, Geometry  # noqa: E402
from pp4_worker.model.weights import SyntheticSource, shard_weights  # noqa: E402

CPU = torch.device("cpu")
SEED = 0x5EED
# The smallest geometry whose shards fall on EXL3's 128-wide Hadamard blocks.
GEO = Geometry(hidden=256, heads=4, kv_heads=2, head_dim=128, mlp=256, vocab=512)


def test_trellis_words_are_the_low_half_of_the_counter_hash():
    t = exl3.trellis_block("w", SEED, (64, 48), 3, slice(0, 4), slice(0, 3), CPU)
    assert t.shape == (4, 3, 48) and t.dtype == torch.int16
    k1, k2 = hashing.stream_keys(SEED, hashing.name_id("w"), exl3.DOMAIN_EXL3)
    idx = torch.arange(4 * 3 * 48, dtype=torch.int64)
    expect = hashing.hash_elements(idx, k1, k2) & 0xFFFF
    assert torch.equal(t.flatten().to(torch.int64) & 0xFFFF, expect)
    assert (t < 0).any() and (t > 0).any()  # the whole 16-bit range, through two's complement


def test_trellis_chunking_does_not_change_words():
    whole = exl3.trellis_block("w", SEED, (256, 128), 4, slice(0, 16), slice(0, 8), CPU)
    chunked = exl3.trellis_block("w", SEED, (256, 128), 4, slice(0, 16), slice(0, 8), CPU, chunk_words=500)
    assert torch.equal(whole, chunked)


def test_rank_shards_are_slices_of_the_logical_tensor():
    """A word depends on its place in the logical tensor alone: sharding cannot change it."""
    K, N = 256, 512
    whole = exl3.column_parallel([("t", (K, N), slice(0, N), 0.5)], "t", SEED, 4, CPU)
    halves = [exl3.column_parallel([("t", (K, N), slice(r * 256, (r + 1) * 256), 0.5)], "t", SEED, 4, CPU)
              for r in range(2)]
    assert torch.equal(torch.cat([h.trellis for h in halves], dim=1), whole.trellis)
    assert torch.equal(torch.cat([h.svh for h in halves]), whole.svh)
    assert all(torch.equal(h.suh, whole.suh) for h in halves)
    whole = exl3.row_parallel("o", (K, N), slice(0, K), 0.25, SEED, 4, CPU)
    halves = [exl3.row_parallel("o", (K, N), slice(r * 128, (r + 1) * 128), 0.25, SEED, 4, CPU) for r in range(2)]
    assert torch.equal(torch.cat([h.trellis for h in halves], dim=0), whole.trellis)
    assert torch.equal(torch.cat([h.suh for h in halves]), whole.suh)
    assert all(torch.equal(h.svh, whole.svh) for h in halves)


def test_sign_vectors_carry_the_scale():
    lin = exl3.row_parallel("o", (256, 128), slice(0, 256), 0.125, SEED, 4, CPU)
    assert set(lin.suh.tolist()) == {-1.0, 1.0} and set(lin.svh.tolist()) == {-0.125, 0.125}
    assert 0.3 < (lin.suh > 0).float().mean().item() < 0.7


def _quantized(geo, bits=4, head_bits=6):
    src = SyntheticSource(geo, SEED, torch.float16, CPU)
    return [exl3.quantize_rank(shard_weights(src, geo, r, torch.float16, CPU), geo, SEED, bits, head_bits, CPU)
            for r in range(2)]


def test_quantize_rank_shapes_and_bytes():
    g = GEO
    ranks = _quantized(g, bits=4, head_bits=6)
    for w in ranks:
        layer = w.layers[0]
        assert layer.qkv.trellis.shape == (g.hidden // 16, g.rank_qkv_rows // 16, 64)
        assert (layer.o.in_features, layer.o.out_features) == (g.rank_heads * g.head_dim, g.hidden)
        assert (layer.gate_up.in_features, layer.gate_up.out_features) == (g.hidden, 2 * g.rank_mlp)
        assert (layer.down.in_features, layer.down.out_features) == (g.rank_mlp, g.hidden)
        assert w.head.bits == 6 and w.head.trellis.shape == (g.hidden // 16, g.rank_vocab // 16, 96)
        # 4 bits a weight plus the sign vectors, the head at 6, norms in fp16
        lin = sum(4 * K * N for K, N in ((g.hidden, g.rank_qkv_rows), (g.rank_heads * g.head_dim, g.hidden),
                                          (g.hidden, 2 * g.rank_mlp), (g.rank_mlp, g.hidden))) // 8
        signs = 2 * (g.hidden + g.rank_qkv_rows + g.rank_heads * g.head_dim + g.hidden + g.hidden
                     + 2 * g.rank_mlp + g.rank_mlp + g.hidden + g.hidden + g.rank_vocab)
        head = 6 * g.hidden * g.rank_vocab // 8
        assert w.weight_bytes() == lin + head + signs + 2 * 3 * g.hidden
    # the parts of a fused tensor are the logical tensors' own words
    q0 = exl3.trellis_block("layers.0.attn.q", SEED, (g.hidden, g.heads * g.head_dim), 4,
                            slice(0, g.hidden // 16), slice(0, g.rank_heads * g.head_dim // 16), CPU)
    assert torch.equal(ranks[0].layers[0].qkv.trellis[:, : q0.shape[1]], q0)


def test_default_geometry_splits_on_hadamard_blocks():
    g = DEFAULT_GEOMETRY
    for n in (g.hidden, g.rank_qkv_rows, g.rank_heads * g.head_dim, g.rank_mlp, g.rank_vocab):
        assert n % exl3.HADAMARD == 0, n


def test_geometry_off_hadamard_blocks_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="multiples of 128"):
        _quantized(TINY_GEOMETRY)  # vocabulary shard of 500 rows


@pytest.mark.parametrize("bits,flag", [(1, "--exl3-bits"), (9, "--exl3-bits")])
def test_quantize_rank_refuses_bit_widths(bits, flag):
    with pytest.raises(ValueError, match=flag):
        _quantized(GEO, bits=bits)


def test_missing_module_says_how_to_build_it(tmp_path):
    opts = Exl3Options(build_dir=str(tmp_path), target="exl3-facc")
    with pytest.raises(BackendUnavailable) as err:
        make_backend("exl3", torch.device("cuda"), "fused", "cublas", opts)
    msg = str(err.value)
    assert "exl3-facc is not configured in" in msg and "ninja exl3-facc" in msg and "--exl3-build" in msg


def test_missing_decode_module_says_how_to_build_it(tmp_path):
    with pytest.raises(BackendUnavailable) as err:
        make_backend("exl3-decode", torch.device("cuda"), "fused", "cublas", Exl3Options(build_dir=str(tmp_path)))
    msg = str(err.value)
    assert "exl3-decode is not configured in" in msg and "ninja exl3-decode" in msg and "--exl3-build" in msg


@pytest.mark.parametrize("backend", ["exl3", "exl3-decode"])
def test_backend_refuses_the_cpu(backend):
    with pytest.raises(BackendUnavailable, match="needs --device cuda"):
        make_backend(backend, CPU, "fused", "cublas", Exl3Options())


@pytest.mark.parametrize("rows,bits,select,expect", [
    (1, 4, "heuristic", 0), (8, 4, "heuristic", 0),  # EXL3's GEMV kernel: no choice by timing there
    (9, 4, "heuristic", 132), (1, 6, "heuristic", 132),  # the cooperative GEMM, its shape by heuristic
    (20, 4, "autotune", 0), (1, 6, "autotune", 0),  # exllamav3's own choice, by timing
])
def test_gemm_kernel_choice_is_reproducible_unless_autotune_is_asked_for(rows, bits, select, expect):
    from types import SimpleNamespace

    from pp4_worker.model.exl3_backends import Exl3Backend

    be = SimpleNamespace(GEMV_MAX_ROWS=Exl3Backend.GEMV_MAX_ROWS, select=select, num_sms=132)
    w = exl3.row_parallel("o", (256, 128), slice(0, 256), 1.0, SEED, bits, CPU)
    assert Exl3Backend._sms_for(be, rows, w) == expect


def test_fold_kernel_takes_q_and_k_rotated_elsewhere():
    """APPLY_ROPE=False (the exl3 backend): the kernel reads q and k from the packed rotated
    copies and V from the fused row, and writes them where the fused rope path writes them."""
    pytest.importorskip("triton")
    from pp4_worker.kernels import triton_kernels as k

    B, T, hq, hkv, d, S = 2, 3, 4, 2, 16, 32
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(B, T, hq + 2 * hkv, d, generator=gen).half()
    pos = torch.tensor([[5, 6, 7], [9, 10, 11]], dtype=torch.int64)
    ang = torch.arange(S, dtype=torch.float64)[:, None] * (10000.0 ** (-torch.arange(d // 2) * 2.0 / d))[None]
    table = torch.stack([torch.cat([ang.cos()] * 2, -1), torch.cat([-ang.sin(), ang.sin()], -1)], 1).half()

    def run(apply_rope, q_rot, k_rot):
        cache = torch.zeros(2, B, hkv, S, d, dtype=torch.float16)
        q = torch.empty(B, hkv, T * (hq // hkv), d, dtype=torch.float16)
        k.rope_cache_fold_kernel[(B * T, hq + hkv)](qkv, pos, pos.stride(0), pos.stride(1), table, cache, q,
                                                    T, B, S, q_rot, k_rot, HQ=hq, HKV=hkv, D=d,
                                                    APPLY_ROPE=apply_rope)
        return q, cache

    q_ref, cache_ref = run(True, qkv, qkv)
    # The rotated q and k the fused path produced, laid out as EXL3's rope leaves them.
    group = hq // hkv
    q_rot = q_ref.view(B, hkv, T, group, d).permute(0, 2, 1, 3, 4).reshape(B * T, hq, d).contiguous()
    rows = pos.reshape(-1)
    k_rot = torch.stack([cache_ref[0, b, :, rows[b * T + t]] for b in range(B) for t in range(T)]).contiguous()
    q_got, cache_got = run(False, q_rot, k_rot)
    assert torch.equal(q_got, q_ref) and torch.equal(cache_got, cache_ref)
    assert not torch.equal(q_rot.view(B, T, hq, d), qkv[:, :, :hq])  # rope did change q
    assert math.isfinite(q_got.float().sum().item())


@pytest.mark.parametrize("backend", ["TorchBackend", "TritonBackend", "Exl3Backend", "Exl3DecodeBackend"])
def test_every_backend_takes_the_steps_the_model_asks_for(backend):
    """The model tells residual_norm each rank's next linear and asks for mlp and last_positions;
    the EXL3 backends cannot be built on a CPU, so their methods' signatures are checked against
    the calls model.py and draft.py make (the exl3 backend once missed the new argument: only its
    GPU run failed)."""
    import inspect

    from pp4_worker.model import backends, exl3_backends

    cls = getattr(backends, backend, None) or getattr(exl3_backends, backend)
    calls = {"residual_norm": ("x", ["p0", "p1"], "collective", ["w0", "w1"], 1e-5, ["qkv0", "qkv1"]),
             "mlp": ("n", "gate_up", "down", 128), "last_positions": ("n", 4, 5)}
    for name, args in calls.items():
        inspect.signature(getattr(cls, name)).bind("self", *args)  # raises TypeError where it does not fit
