"""EXL3 checkpoints on the CPU: the format as upstream defines it, the reader, and the ranks' split.

Oracles are upstream's own code where it runs without a GPU, read from the pinned exllamav3 wheel:
its pure-torch mul1 codebook (exl3_lib/ngram_codec.py), its tile permutation (tensor_core_perm in
exl3_lib/quantize.py) and its codebook scale constant. The trellis packing is written here as
upstream's pack_trellis kernel (exllamav3_ext/quant/pack.cu) packs it, symbol by symbol.
A checkpoint converted by exllamav3 itself needs a GPU: bench/device/exl3_decode_checks.sh makes one there.
"""
import ast
import importlib.util
import json
import re
import zipfile

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from pp4 import paths  # noqa: E402
from pp4.sources import exl3 as exl3_sources  # noqa: E402
from pp4.toolchain.wheelcache import ensure_wheels  # noqa: E402
from pp4_worker.harness.cli import UsageError, build_parser, validate  # noqa: E402
from pp4_worker.model import exl3_checkpoint, exl3_reference  # noqa: E402
from pp4_worker.model.config import Geometry  # noqa: E402

G = Geometry(hidden=256, heads=4, kv_heads=2, head_dim=128, mlp=256, vocab=512, layers=2)
# Two KV heads of two query heads each per rank: attention's (member, KV head) order is not head order.
G_GROUPED = Geometry(hidden=256, heads=8, kv_heads=4, head_dim=64, mlp=256, vocab=512, layers=2)


# ---------------------------------------------------------------------------- upstream's code
@pytest.fixture(scope="module")
def upstream(shared_cache, tmp_path_factory):
    """exl3_lib's ngram_codec module and quantize.py's source, from the pinned wheel."""
    lock = exl3_sources.load_lock()
    wheel = ensure_wheels(lock, paths.wheel_cache_dir(shared_cache), paths.tmp_dir(shared_cache))[lock.wheel.name]
    base = "exllamav3/modules/quant/exl3_lib/"
    with zipfile.ZipFile(wheel) as z:
        quantize_src = z.read(base + "quantize.py").decode()
        codec_path = tmp_path_factory.mktemp("upstream") / "ngram_codec.py"
        codec_path.write_bytes(z.read(base + "ngram_codec.py"))
    spec = importlib.util.spec_from_file_location("upstream_ngram_codec", codec_path)
    codec = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(codec)  # it imports torch alone
    return codec, quantize_src


def upstream_function(source: str, name: str):
    """One top-level function of upstream's source, without its module's imports (it needs torch)."""
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    namespace = {"torch": torch}
    exec(compile(ast.Module([node], []), name, "exec"), namespace)
    return namespace[name]


def pack_like_upstream(symbols: torch.Tensor, bits: int) -> torch.Tensor:
    """int16 [16*bits] words of one tile whose position p shifts in symbols[p] (bits wide), the
    way pack_trellis_kernel writes them: 16 spans of 16 symbols, each span's symbols shifted into
    a 32-bit buffer from the top, 16-bit words out, then each 32-bit pair's halves swapped."""
    packed = [0] * (16 * bits)
    for span in range(16):
        j, k, buf = bits * span, 32, 0
        for i in range(16 * span, 16 * span + 16):
            k -= bits
            buf |= (int(symbols[i]) & ((1 << bits) - 1)) << k
            if k <= 16:
                packed[j] = (buf >> 16) & 0xFFFF
                buf = (buf << 16) & 0xFFFFFFFF
                k += 16
                j += 1
    swapped = [packed[i ^ 1] for i in range(len(packed))]
    return torch.tensor([w - 65536 if w >= 32768 else w for w in swapped], dtype=torch.int16)


def tail_biting_states(symbols: torch.Tensor, bits: int) -> torch.Tensor:
    """State p: the symbols of positions p, p-1, ... (circularly), p's in the lowest bits."""
    out = torch.zeros(256, dtype=torch.int64)
    for back in range(-(-16 // bits)):
        out |= torch.roll(symbols, back) << (back * bits)
    return out & 0xFFFF


# ---------------------------------------------------------------------------- the format
def test_the_mul1_codebook_is_upstreams_bit_for_bit(upstream):
    codec, _ = upstream
    assert torch.equal(exl3_reference.codebook_values(2).view(torch.int16), codec.mul1_codebook("cpu").view(torch.int16))


@pytest.mark.parametrize("codebook", [0, 1])
def test_the_3inst_and_mcg_codebooks_have_upstreams_scale(upstream, codebook):
    """Their spread is the constant upstream scales weights to before quantizing (codebook_scale,
    fitted to 3inst; mcg's is 3e-4 wider). A weak check: a wrong multiplier could keep the spread.
    Bit for bit against upstream's decoder these run on the GPU (tests/gpu/exl3_decode_check.py)."""
    _, source = upstream
    scale = float(re.search(r"^codebook_scale\s*=\s*([0-9.]+)", source, re.M).group(1))
    values = exl3_reference.codebook_values(codebook).double()
    assert abs(values.std().item() - scale) < 1e-3 * scale
    assert abs(values.mean().item()) < 1e-2


@pytest.mark.parametrize("bits", range(2, 9))
def test_decoded_states_are_the_packed_trellis_states(bits):
    symbols = torch.randint(0, 1 << bits, (256,), generator=torch.Generator().manual_seed(bits))
    words = pack_like_upstream(symbols, bits)
    assert torch.equal(exl3_reference.states(words), tail_biting_states(symbols, bits))


def test_positions_are_upstreams_tensor_core_permutation(upstream):
    _, source = upstream
    perm = upstream_function(source, "tensor_core_perm")("cpu")  # position p holds row-major element perm[p]
    rows, cols = exl3_reference.tile_positions()
    assert torch.equal(rows * 16 + cols, perm.long())


def test_decode_places_each_state_value_where_upstreams_encoder_took_it(upstream):
    """A whole 2x3-tile matrix: upstream's encoder feeds tile element perm[p] to position p."""
    _, source = upstream
    perm = upstream_function(source, "tensor_core_perm")("cpu").long()
    bits, codebook, gen = 5, 2, torch.Generator().manual_seed(1)
    tiles, expected = [], torch.zeros(2, 3, 256, dtype=torch.float16)
    for kt in range(2):
        for nt in range(3):
            symbols = torch.randint(0, 1 << bits, (256,), generator=gen)
            tiles.append(pack_like_upstream(symbols, bits))
            expected[kt, nt, perm] = exl3_reference.codebook_values(codebook)[tail_biting_states(symbols, bits)]
    trellis = torch.stack(tiles).view(2, 3, 16 * bits)
    w = exl3_reference.decode(trellis, codebook)
    want = expected.view(2, 3, 16, 16).permute(0, 2, 1, 3).reshape(32, 48)  # tile (kt, nt) at rows kt*16.., cols nt*16..
    assert torch.equal(w.view(torch.int16), want.view(torch.int16))


def test_half_integer_bitrates_are_refused_by_name():
    with pytest.raises(ValueError, match="half-integer"):
        exl3_reference.states(torch.zeros(1, 1, 72, dtype=torch.int16))


# ---------------------------------------------------------------------------- a checkpoint
def quantized(name, k, n, bits, gen, codebook="mul1"):
    t = {f"{name}.trellis": torch.randint(-32768, 32768, (k // 16, n // 16, 16 * bits), generator=gen).to(torch.int16),
         f"{name}.suh": (torch.randint(0, 2, (k,), generator=gen) * 2 - 1).to(torch.float16),
         f"{name}.svh": ((torch.rand(n, generator=gen) + 0.5) / k ** 0.5).to(torch.float16)}
    if codebook != "3inst":
        t[f"{name}.{codebook}"] = torch.tensor(0, dtype=torch.int32)
    return t


def write_checkpoint(path, g=G, bits=4, head_bits=6, config_extra=None, drop=None, codebook="mul1", kv_bits=None):
    gen = torch.Generator().manual_seed(7)
    H, D = g.hidden, g.head_dim
    t = {"model.embed_tokens.weight": torch.randn(g.vocab, H, generator=gen).to(torch.float16),
         "model.norm.weight": (1 + 0.1 * torch.randn(H, generator=gen)).to(torch.float16)}
    for i in range(g.layers):
        p = f"model.layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            t[p + norm + ".weight"] = (1 + 0.1 * torch.randn(H, generator=gen)).to(torch.float16)
        for name, k, n in (("self_attn.q_proj", H, g.heads * D), ("self_attn.k_proj", H, g.kv_heads * D),
                           ("self_attn.v_proj", H, g.kv_heads * D), ("self_attn.o_proj", g.heads * D, H),
                           ("mlp.gate_proj", H, g.mlp), ("mlp.up_proj", H, g.mlp), ("mlp.down_proj", g.mlp, H)):
            t.update(quantized(p + name, k, n, kv_bits if kv_bits and name in ("self_attn.k_proj", "self_attn.v_proj") else bits, gen, codebook))
    t.update(quantized("lm_head", H, g.vocab, head_bits, gen, codebook))
    for key in drop or ():
        t.pop(key)
    path.mkdir(parents=True, exist_ok=True)
    safetensors_torch.save_file(t, str(path / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": H, "num_attention_heads": g.heads,
              "num_key_value_heads": g.kv_heads, "head_dim": D, "intermediate_size": g.mlp,
              "vocab_size": g.vocab, "num_hidden_layers": g.layers, "rope_theta": 500000.0,
              "rms_norm_eps": 1e-5, "quantization_config": {"quant_method": "exl3", "bits": bits,
                                                            "head_bits": head_bits}}
    config.update(config_extra or {})
    (path / "config.json").write_text(json.dumps(config))
    return t


def test_the_geometry_comes_from_config_json(tmp_path):
    write_checkpoint(tmp_path)
    assert exl3_checkpoint.read_geometry(str(tmp_path)) == Geometry(
        hidden=256, heads=4, kv_heads=2, head_dim=128, mlp=256, vocab=512, layers=2, rope_theta=500000.0,
        norm_eps=1e-5)


def test_the_ranks_partial_products_add_up_to_the_whole_model_linears(tmp_path):
    """Column-parallel shards concatenate and row-parallel ones sum to the product of the whole
    tensor as stored; q, k and v (each with its own suh) run as one fused linear per rank."""
    tensors = write_checkpoint(tmp_path)
    shards, fingerprint = exl3_checkpoint.load(str(tmp_path), G, torch.float16, torch.device("cpu"))
    assert fingerprint.startswith("exl3-checkpoint:")
    ckpt = exl3_checkpoint.Exl3Checkpoint(str(tmp_path))
    x = torch.randn(5, G.hidden, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def whole(key, inputs):
        return exl3_reference.linear(inputs, exl3_checkpoint.single(ckpt.linear(key), "cpu"))

    for i in range(G.layers):
        p = f"model.layers.{i}."
        qkv = [exl3_reference.linear(x, s.layers[i].qkv) for s in shards]
        q, k, v = (whole(p + f"self_attn.{n}_proj", x) for n in "qkv")
        hq, hkv = G.rank_heads * G.head_dim, G.rank_kv_heads * G.head_dim
        for r in range(2):
            want = torch.cat([q[:, r * hq : (r + 1) * hq], k[:, r * hkv : (r + 1) * hkv], v[:, r * hkv : (r + 1) * hkv]], 1)
            torch.testing.assert_close(qkv[r], want, rtol=1e-12, atol=1e-12)
        assert shards[0].layers[i].qkv.part_columns == (hq, hkv, hkv)  # their suh differ: three transforms
        assert not torch.equal(tensors[p + "self_attn.q_proj.suh"], tensors[p + "self_attn.k_proj.suh"])
        a = torch.randn(5, G.heads * G.head_dim, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        o = sum(exl3_reference.linear(a[:, r * hq : (r + 1) * hq], s.layers[i].o) for r, s in enumerate(shards))
        torch.testing.assert_close(o, whole(p + "self_attn.o_proj", a), rtol=1e-10, atol=1e-10)
        h = torch.randn(5, G.mlp, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        m = G.rank_mlp
        down = sum(exl3_reference.linear(h[:, r * m : (r + 1) * m], s.layers[i].down) for r, s in enumerate(shards))
        torch.testing.assert_close(down, whole(p + "mlp.down_proj", h), rtol=1e-10, atol=1e-10)
    head = torch.cat([exl3_reference.linear(x, s.head) for s in shards], 1)
    torch.testing.assert_close(head, whole("lm_head", x), rtol=1e-12, atol=1e-12)
    assert shards[0].head.bits == 6 and shards[0].layers[0].down.bits == 4 and shards[0].head.codebook == 2
    assert all(s.o_input == "heads" for s in shards)
    vs = G.rank_vocab
    assert torch.equal(shards[1].embed[:vs], tensors["model.embed_tokens.weight"][vs:])


@pytest.mark.parametrize("codebook,marker", [("3inst", 0), ("mcg", 1)])
def test_the_codebook_marker_names_the_codebook(tmp_path, codebook, marker):
    write_checkpoint(tmp_path, codebook=codebook)
    assert exl3_checkpoint.Exl3Checkpoint(str(tmp_path)).linear("lm_head").codebook == marker


def test_packed_signs_unpack_lowest_bit_first():
    packed = torch.tensor([0b101, -32768], dtype=torch.int16)  # bits 0 and 2 of word 0; bit 15 of word 1
    signs = exl3_checkpoint.unpack_signs(packed)
    assert signs.tolist() == [-1, 1, -1] + [1] * 13 + [1] * 15 + [-1]


@pytest.mark.parametrize("change,message", [
    ({"drop": ["model.layers.1.mlp.up_proj.trellis"]}, "model.layers.1.mlp.up_proj is missing"),
    ({"config_extra": {"rope_scaling": {"rope_type": "llama3"}}}, "rope_scaling"),
    ({"config_extra": {"architectures": ["Qwen3MoeForCausalLM"]}}, "Llama-shaped"),
    ({"config_extra": {"quantization_config": {"quant_method": "gptq"}}}, "not an EXL3 checkpoint"),
])
def test_a_checkpoint_the_worker_cannot_run_is_refused_with_the_reason(tmp_path, change, message):
    write_checkpoint(tmp_path, **change)
    with pytest.raises(exl3_checkpoint.CheckpointError, match=message):
        exl3_checkpoint.read_geometry(str(tmp_path))
        exl3_checkpoint.load(str(tmp_path), G, torch.float16, torch.device("cpu"))


def test_a_rank_cut_off_the_hadamard_grid_is_refused(tmp_path):
    g = Geometry(hidden=256, heads=4, kv_heads=2, head_dim=64, mlp=256, vocab=512, layers=1)  # K/V rank share 64
    write_checkpoint(tmp_path, g=g)
    with pytest.raises(exl3_checkpoint.CheckpointError, match="multiples of 128"):
        exl3_checkpoint.load(str(tmp_path), g, torch.float16, torch.device("cpu"))


def test_the_command_line_takes_the_geometry_from_the_checkpoint(tmp_path):
    write_checkpoint(tmp_path)
    args = build_parser().parse_args(["--backend", "exl3-decode", "--weights", str(tmp_path), "--layers", "2"])
    geometry = validate(args)[0]
    assert (geometry.hidden, geometry.vocab, geometry.layers) == (256, 512, 2)
    (tmp_path / "config.json").unlink()
    with pytest.raises(UsageError, match="no config.json"):
        validate(build_parser().parse_args(["--backend", "exl3-decode", "--weights", str(tmp_path)]))


# ---------------------------------------------------------------------------- the model on it
class DecodedExl3Backend:
    """The torch backend with every EXL3 linear computed from its decoded weights in fp64 (the CPU
    has no EXL3 kernels): what is under test is how the model splits and wires the checkpoint."""

    @staticmethod
    def make(device):
        from pp4_worker.model.backends import TorchBackend

        class Backend(TorchBackend):
            name, quantized = "exl3-decoded-cpu", True
            dense: dict = {}  # id of a linear -> (the linear, its dense fp64 matrix), decoded once

            def matrix(self, weight):
                if id(weight) not in self.dense:
                    eye = torch.eye(weight.in_features, dtype=torch.float64)
                    self.dense[id(weight)] = (weight, exl3_reference.linear(eye, weight))
                return self.dense[id(weight)][1]

            def linear(self, x, weight):
                return (x.double() @ self.matrix(weight)).to(x.dtype)

            def linear_fp32(self, x, weight, cpu_weight_fp32=None):
                return (x.double() @ self.matrix(weight)).float()

        return Backend(device, "gemm")


def dense(ckpt, key):
    """The checkpoint linear KEY as the dense fp64 [K, N] matrix it multiplies by."""
    lin = exl3_checkpoint.single(ckpt.linear(key), "cpu")
    return exl3_reference.linear(torch.eye(lin.in_features, dtype=torch.float64), lin)


def llama_logits(ckpt, g, ids):
    """A plain single-device Llama forward in fp64 (Hugging Face's math) over the dense weights."""
    def norm(x, key):
        w = ckpt.get(key).double()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + g.norm_eps) * w

    T, D = ids.shape[0], g.head_dim
    inv = g.rope_theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rope(x):  # [heads, T, D], rotate-half
        return x * cos + torch.cat([-x[..., D // 2:], x[..., : D // 2]], -1) * sin

    h = ckpt.get("model.embed_tokens.weight").double()[ids]
    causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    for i in range(g.layers):
        p = f"model.layers.{i}."
        n = norm(h, p + "input_layernorm.weight")
        q = rope((n @ dense(ckpt, p + "self_attn.q_proj")).view(T, g.heads, D).transpose(0, 1))
        k = rope((n @ dense(ckpt, p + "self_attn.k_proj")).view(T, g.kv_heads, D).transpose(0, 1))
        v = (n @ dense(ckpt, p + "self_attn.v_proj")).view(T, g.kv_heads, D).transpose(0, 1)
        k, v = k.repeat_interleave(g.group, 0), v.repeat_interleave(g.group, 0)
        att = torch.softmax(q @ k.transpose(1, 2) / D ** 0.5 + causal, -1) @ v  # [heads, T, D]
        h = h + att.transpose(0, 1).reshape(T, -1) @ dense(ckpt, p + "self_attn.o_proj")
        n = norm(h, p + "post_attention_layernorm.weight")
        gate, up = n @ dense(ckpt, p + "mlp.gate_proj"), n @ dense(ckpt, p + "mlp.up_proj")
        h = h + (torch.nn.functional.silu(gate) * up) @ dense(ckpt, p + "mlp.down_proj")
    return norm(h, "model.norm.weight") @ dense(ckpt, "lm_head")


@pytest.mark.parametrize("kv_bits", [None, 5])
def test_the_worker_on_a_checkpoint_computes_the_llama_it_holds(tmp_path, monkeypatch, kv_bits):
    """Both ranks' head shards, joined, after a prefill and single-token steps through the KV cache,
    against a plain Llama over the checkpoint's dense weights: any mistake in the rank split, the
    fused parts' own transforms or o's head order shows as a wrong logit. kv_bits 5: k and v have
    more bits than q (exllamav3 spreads its budget so), and the three run one after another."""
    from pp4_worker.model import model as model_module
    from pp4_worker.model.config import ModelSettings
    from pp4_worker.model.exl3 import Exl3Group, Exl3Linear

    g = G_GROUPED
    write_checkpoint(tmp_path, g=g, kv_bits=kv_bits)
    monkeypatch.setattr(model_module, "make_backend", lambda *a, **k: DecodedExl3Backend.make(torch.device("cpu")))
    settings = ModelSettings(geometry=g, context=64, weights_dir=str(tmp_path), backend="exl3", attention="gemm")
    model = model_module.TensorParallelDraft(settings, torch.device("cpu"))
    ids = torch.randint(3, g.vocab, (9,), generator=torch.Generator().manual_seed(11))
    want = llama_logits(exl3_checkpoint.Exl3Checkpoint(str(tmp_path)), g, ids)
    got = torch.empty(9, g.vocab, dtype=torch.float64)
    for a, z in [(0, 6), (6, 7), (7, 8), (8, 9)]:
        positions = torch.arange(a, z)[None, :]
        normed = model.forward(ids[None, a:z], model.call_positions(positions).step(0, z - a))
        got[a:z] = torch.cat([r.backend.linear_fp32(n, r.w.head) for r, n in zip(model.ranks, normed)], 1).double()
    assert (got - want).abs().max() < 0.02 * want.std()  # fp16 activations against fp64
    assert isinstance(model.ranks[0].w.layers[0].qkv, Exl3Group if kv_bits else Exl3Linear)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_the_exactness_gate_runs_on_a_checkpoint(tmp_path, monkeypatch):
    """States, every mode's cells, the gate's checks and reproducible digests, with a checkpoint's
    weights (eager on the CPU; the GPU's graphs are checked against eager the same way there)."""
    from pp4_worker.harness import gate
    from pp4_worker.model import model as model_module
    from pp4_worker.model import states as state_io
    from pp4_worker.model.config import MODES, CellKey, ModelSettings
    from pp4_worker.model.draft import DraftWorker
    from pp4_worker.model.graphs import build_runners

    write_checkpoint(tmp_path, g=G_GROUPED)
    monkeypatch.setattr(model_module, "make_backend", lambda *a, **k: DecodedExl3Backend.make(torch.device("cpu")))
    settings = ModelSettings(geometry=G_GROUPED, context=40, weights_dir=str(tmp_path), backend="exl3",
                             attention="gemm")
    worker = DraftWorker(model_module.TensorParallelDraft(settings, torch.device("cpu")))
    states = state_io.synthetic_states(worker, 2) + state_io.capture_states(worker, 2)
    cells = [CellKey(b, 4, m) for b in (1, 2) for m in MODES]
    runners = build_runners(worker, cells, graphs=False)
    first = gate.run_gate(worker, runners, None, states, [1, 2], [4], log=lambda *_: None)
    assert first.ok, [f.describe() for f in first.failures]
    again = gate.run_gate(worker, runners, None, states, [1, 2], [4], log=lambda *_: None)
    assert again.digests == first.digests and len(set(first.digests.values())) == len(cells)
    assert worker.model.weights_fingerprint.startswith("exl3-checkpoint:")
