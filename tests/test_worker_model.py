"""The eager worker end to end on the CPU with the tiny geometry, against an unsharded reference."""
import math

import pytest

torch = pytest.importorskip("torch")

from pp4_worker.model import states as state_io  # noqa: E402
from pp4_worker.model.config import (  # noqa: E402
    GREEDY, QUERY_BLOCK, SAMPLED, SWITCH, TINY_GEOMETRY, CellKey, ModelSettings
)
from pp4_worker.model.draft import CellOutputs, DraftWorker  # noqa: E402
from pp4_worker.model.model import TensorParallelDraft  # noqa: E402
from pp4_worker.model.weights import SyntheticSource, logical_tensor_specs, shard_weights  # noqa: E402
from pp4_worker.model.sampling import alternating_masks  # noqa: E402

CONTEXT = 48


def w_chunks(geo):
    from pp4_worker.model.sampling import vocab_chunks

    return vocab_chunks(geo.rank_vocab)


@pytest.fixture(scope="module")
def worker():
    model = TensorParallelDraft(ModelSettings(TINY_GEOMETRY, context=CONTEXT), torch.device("cpu"))
    return DraftWorker(model)


@pytest.fixture(scope="module")
def some_states(worker):
    return state_io.synthetic_states(worker, 4) + state_io.capture_states(worker, 4)


def _run(worker, cell, mask=None):
    if mask is not None:
        worker.set_mask(mask)
    out = CellOutputs.allocate(cell, worker.model.device)
    out.poison()
    worker.call(cell, out)
    return out


def _bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def test_weights_reproducible_and_shard_independent():
    g = TINY_GEOMETRY
    a = SyntheticSource(g, 7, torch.float16, torch.device("cpu"))
    b = SyntheticSource(g, 7, torch.float16, torch.device("cpu"))
    c = SyntheticSource(g, 8, torch.float16, torch.device("cpu"))
    name = "layers.0.mlp.down.weight"
    full = a.block(name, slice(0, g.hidden))
    assert torch.equal(full, b.block(name, slice(0, g.hidden)))
    assert not torch.equal(full, c.block(name, slice(0, g.hidden)))
    # any sub-block is the same slice of the logical tensor, whatever the chunking
    a.CHUNK_ELEMENTS = 1000
    assert torch.equal(a.block(name, slice(10, 70), slice(256, 512)), full[10:70, 256:512])
    bound = 1.0 / math.sqrt(g.mlp)
    assert full.abs().max().item() <= bound * 1.001 and full.float().std().item() > 0.4 * bound
    norm = a.block("final_norm.weight", slice(0, g.hidden)).float()
    assert ((norm - 1).abs() <= 0.1001).all()


def test_rank_shards_are_the_logical_slices():
    g = TINY_GEOMETRY
    src = SyntheticSource(g, 3, torch.float16, torch.device("cpu"))
    specs = logical_tensor_specs(g)
    full = {n: src.block(n, slice(0, s[0][0])) for n, s in specs.items()}
    hq, hkv, d, m, vs = g.rank_heads, g.rank_kv_heads, g.head_dim, g.rank_mlp, g.rank_vocab
    for r in range(2):
        w = shard_weights(src, g, r, torch.float16, torch.device("cpu"))
        l0 = w.layers[0]
        assert torch.equal(l0.qkv[: hq * d], full["layers.0.attn.q.weight"][r * hq * d:(r + 1) * hq * d])
        assert torch.equal(l0.qkv[hq * d:(hq + hkv) * d], full["layers.0.attn.k.weight"][r * hkv * d:(r + 1) * hkv * d])
        assert torch.equal(l0.qkv[(hq + hkv) * d:], full["layers.0.attn.v.weight"][r * hkv * d:(r + 1) * hkv * d])
        o_slice = full["layers.0.attn.o.weight"][:, r * hq * d:(r + 1) * hq * d]
        # columns in (group member, kv head) order: head kv*group + member
        for member in range(g.group):
            for kv in range(hkv):
                col = (member * hkv + kv) * d
                head = kv * g.group + member
                assert torch.equal(l0.o[:, col:col + d], o_slice[:, head * d:(head + 1) * d])
        assert torch.equal(l0.gate_up[m:], full["layers.0.mlp.up.weight"][r * m:(r + 1) * m])
        assert torch.equal(l0.down, full["layers.0.mlp.down.weight"][:, r * m:(r + 1) * m])
        assert torch.equal(w.head, full["head.weight"][r * vs:(r + 1) * vs])
        assert torch.equal(w.embed[-1], torch.zeros(g.hidden, dtype=torch.float16))
        owner = torch.arange(g.vocab) // vs
        assert torch.equal(w.vocab_to_local == vs, owner != r)


def _reference_block_logits(worker, state):
    """Float64, unsharded forward of the query block; logits of its last position."""
    m = worker.model
    g = m.g
    src = SyntheticSource(g, m.settings.weight_seed, torch.float16, torch.device("cpu"))
    W = {n: src.block(n, slice(0, s[0][0])).double() for n, s in logical_tensor_specs(g).items()}
    ctx = state.context_length
    pos = torch.arange(ctx, ctx + QUERY_BLOCK, dtype=torch.float64)
    inv = torch.tensor([g.rope_theta ** (-2.0 * i / g.head_dim) for i in range(g.head_dim // 2)], dtype=torch.float64)
    ang = pos[:, None] * inv[None]
    cos, sin = torch.cos(ang)[:, None], torch.sin(ang)[:, None]

    def rope(x):
        a, b = x[..., : g.head_dim // 2], x[..., g.head_dim // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    def norm(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + g.norm_eps) * w

    x = W["embed.weight"][state.query_tokens]
    kv = state.kv.double()
    for li in range(g.layers):
        p = f"layers.{li}."
        n = norm(x, W[p + "attn_norm.weight"])
        q = rope((n @ W[p + "attn.q.weight"].T).view(QUERY_BLOCK, g.heads, g.head_dim))
        k = rope((n @ W[p + "attn.k.weight"].T).view(QUERY_BLOCK, g.kv_heads, g.head_dim))
        v = (n @ W[p + "attn.v.weight"].T).view(QUERY_BLOCK, g.kv_heads, g.head_dim)
        K = torch.cat([kv[li, 0].permute(1, 0, 2), k])  # [ctx+5, kvh, D]
        V = torch.cat([kv[li, 1].permute(1, 0, 2), v])
        outs = []
        for h in range(g.heads):
            s = q[:, h] @ K[:, h // g.group].T / math.sqrt(g.head_dim)
            causal = torch.arange(ctx + QUERY_BLOCK)[None, :] > (ctx + torch.arange(QUERY_BLOCK))[:, None]
            s = s.masked_fill(causal, float("-inf"))
            outs.append(torch.softmax(s, -1) @ V[:, h // g.group])
        x = x + torch.stack(outs, 1).reshape(QUERY_BLOCK, -1) @ W[p + "attn.o.weight"].T
        n = norm(x, W[p + "mlp_norm.weight"])
        gate = n @ W[p + "mlp.gate.weight"].T
        x = x + (torch.nn.functional.silu(gate) * (n @ W[p + "mlp.up.weight"].T)) @ W[p + "mlp.down.weight"].T
    return norm(x[-1], W["final_norm.weight"]) @ W["head.weight"].T


def test_sharded_model_matches_unsharded_float64_reference(worker, some_states):
    m = worker.model
    for state in (some_states[0], some_states[-1]):  # one synthetic, one captured
        worker.load_request(0, state)
        ctx = state.context_length
        plan = m.call_positions(torch.arange(ctx, ctx + QUERY_BLOCK)[None])
        normed = m.forward(state.query_tokens[None], plan.step(0, QUERY_BLOCK))
        logits = torch.cat([r.backend.linear_fp32(n[-1:], r.w.head) for r, n in zip(m.ranks, normed)], -1)[0].double()
        ref = _reference_block_logits(worker, state)
        err = (logits - ref).abs().max().item()
        assert err < 0.02 * ref.std().item() + 1e-3, err
        # and the worker's first greedy proposal is the reference's argmax with its probability
        out = _run(worker, CellKey(1, 4, GREEDY))
        p_ref = torch.softmax(ref, -1)
        tok = out.proposals[0, 0].item()
        assert p_ref[tok] >= p_ref.max() * 0.97
        assert abs(out.confidences[0, 0].item() - p_ref[tok].item()) < 0.03 * p_ref[tok].item()


def test_reference_with_several_kv_heads_per_rank():
    """Tiny has one KV head per rank; this geometry exercises the head orders (2 per rank, group 2)."""
    from pp4_worker.model.config import Geometry

    geo = Geometry(hidden=256, heads=8, kv_heads=4, head_dim=32, mlp=512, vocab=1024, layers=2)
    assert w_chunks(geo) == 2  # and the head reduces each shard in 2 chunks
    w = DraftWorker(TensorParallelDraft(ModelSettings(geo, context=32), torch.device("cpu")))
    test_sharded_model_matches_unsharded_float64_reference(w, state_io.synthetic_states(w, 2))


@pytest.mark.parametrize("depth", [4, 5])
def test_greedy_equals_switch_all_t0_and_sampled_equals_switch_all_t1(worker, some_states, depth):
    B = 4
    for slot, st in enumerate(some_states[2:6]):
        worker.load_request(slot, st)
    greedy = _run(worker, CellKey(B, depth, GREEDY))
    sampled = _run(worker, CellKey(B, depth, SAMPLED))
    t0 = _run(worker, CellKey(B, depth, SWITCH), [False] * B)
    t1 = _run(worker, CellKey(B, depth, SWITCH), [True] * B)
    assert torch.equal(t0.proposals, greedy.proposals)
    assert torch.equal(_bits(t0.confidences), _bits(greedy.confidences))
    assert torch.equal(t0.q_payload, torch.zeros(B, QUERY_BLOCK))
    for f in ("proposals", "confidences", "q_payload"):
        assert torch.equal(_bits(getattr(t1, f)), _bits(getattr(sampled, f)))
    assert not torch.equal(greedy.proposals, sampled.proposals)  # sampling does something
    assert torch.equal(sampled.q_payload[:, :depth], sampled.confidences)
    assert torch.equal(sampled.q_payload[:, depth:], torch.zeros(B, QUERY_BLOCK - depth))
    assert ((greedy.proposals >= 0) & (greedy.proposals < TINY_GEOMETRY.vocab)).all()
    for mask in alternating_masks(B):
        mixed = _run(worker, CellKey(B, depth, SWITCH), mask)
        for r in range(B):
            want = sampled if mask[r] else greedy
            assert torch.equal(mixed.proposals[r], want.proposals[r])
            assert torch.equal(_bits(mixed.confidences[r]), _bits(want.confidences[r]))
            assert torch.equal(_bits(mixed.q_payload[r]), _bits(want.q_payload[r]))


def test_call_is_idempotent_and_depends_on_the_state(worker, some_states):
    worker.load_request(0, some_states[0])
    a = _run(worker, CellKey(1, 5, SAMPLED))
    b = _run(worker, CellKey(1, 5, SAMPLED))
    assert torch.equal(a.proposals, b.proposals) and torch.equal(_bits(a.confidences), _bits(b.confidences))
    worker.load_request(0, some_states[1])
    c = _run(worker, CellKey(1, 5, SAMPLED))
    assert not torch.equal(a.proposals, c.proposals)


def test_states_round_trip_and_refusals(worker, some_states, tmp_path):
    fp = worker.model.fingerprint()
    caps = [s for s in some_states if s.source == "captured"]
    assert all(s.meta["calls"] for s in caps) and len({s.context_length for s in caps}) > 1
    state_io.save_states(caps, str(tmp_path), fp)
    back = state_io.load_states(str(tmp_path), fp)
    assert state_io.states_digest(back) == state_io.states_digest(caps)
    with pytest.raises(ValueError, match="captured with another model"):
        state_io.load_states(str(tmp_path), "0" * 64)
    victim = tmp_path / f"{caps[0].name}.pt"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match its sha256"):
        state_io.load_states(str(tmp_path), fp)
    with pytest.raises(FileNotFoundError, match="no manifest.json"):
        state_io.load_states(str(tmp_path / "nothing"), fp)


def test_capture_is_reproducible(worker):
    a = state_io.capture_states(worker, 2)
    b = state_io.capture_states(worker, 2)
    assert state_io.states_digest(a) == state_io.states_digest(b)


def test_safetensors_missing_gives_clear_error(monkeypatch, tmp_path):
    import sys

    from pp4_worker.model.weights import SafetensorsSource

    monkeypatch.setitem(sys.modules, "safetensors", None)
    with pytest.raises(RuntimeError, match=r"--weights needs the safetensors package \(pip install safetensors\)"):
        SafetensorsSource(str(tmp_path), TINY_GEOMETRY, torch.float16, torch.device("cpu"))


def test_safetensors_round_trip(tmp_path):
    pytest.importorskip("safetensors")
    from pp4_worker.model.weights import export_safetensors

    src = SyntheticSource(TINY_GEOMETRY, 11, torch.float16, torch.device("cpu"))
    export_safetensors(src, str(tmp_path))
    a = TensorParallelDraft(ModelSettings(TINY_GEOMETRY, context=32, weight_seed=11), torch.device("cpu"))
    b = TensorParallelDraft(ModelSettings(TINY_GEOMETRY, context=32, weights_dir=str(tmp_path)), torch.device("cpu"))
    for ra, rb in zip(a.ranks, b.ranks):
        assert torch.equal(ra.w.head, rb.w.head) and torch.equal(ra.w.layers[0].qkv, rb.w.layers[0].qkv)


def test_attention_variants_agree(worker, some_states):
    """--attention sdpa (torch's fused kernel) and the default gemm path compute the same function."""
    sdpa = DraftWorker(TensorParallelDraft(ModelSettings(TINY_GEOMETRY, context=CONTEXT, attention="sdpa"),
                                           torch.device("cpu")))
    assert sdpa.model.fingerprint() != worker.model.fingerprint()
    for st in some_states[:3]:
        worker.load_request(0, st)
        sdpa.load_request(0, st)
        a, b = _run(worker, CellKey(1, 4, GREEDY)), _run(sdpa, CellKey(1, 4, GREEDY))
        assert a.proposals[0, 0] == b.proposals[0, 0]
        assert abs(a.confidences[0, 0] - b.confidences[0, 0]) < 0.02 * a.confidences[0, 0]


def test_head_chunks_must_divide_the_shard():
    with pytest.raises(ValueError, match="--head-chunks 7 must divide the shard vocabulary 500"):
        TensorParallelDraft(ModelSettings(TINY_GEOMETRY, context=CONTEXT, head_chunks=7), torch.device("cpu"))


def test_the_request_inputs_are_views_of_one_packed_buffer_that_one_copy_moves():
    from pp4_worker.model.draft import StaticInputs

    src, dst = StaticInputs.allocate(torch.device("cpu")), StaticInputs.allocate(torch.device("cpu"))
    src.query_tokens[3] = torch.arange(QUERY_BLOCK) + 2**40  # high bits: no field may truncate
    src.context_lengths[2] = 977
    src.seeds[0] = -(2**62)
    src.t1_mask[:] = torch.tensor([False, True, True, False])
    dst.packed.copy_(src.packed)
    assert torch.equal(dst.query_tokens, src.query_tokens) and dst.query_tokens[3, 4] == 2**40 + 4
    assert dst.context_lengths.tolist() == [1, 1, 977, 1] and dst.seeds[0] == -(2**62)
    assert dst.t1_mask.tolist() == [False, True, True, False]
    # The fields do not overlap: the buffer is exactly their sizes laid end to end.
    sizes = sum(t.numel() * t.element_size() for t in (src.query_tokens, src.context_lengths, src.seeds, src.t1_mask))
    assert sizes == src.packed.numel() == StaticInputs.PACKED_BYTES
    assert {t.untyped_storage().data_ptr() for t in (src.packed, src.query_tokens, src.seeds, src.t1_mask)} == \
        {src.packed.untyped_storage().data_ptr()}
