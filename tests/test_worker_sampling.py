"""Head merge, Gumbel noise and masks of pp4_worker (CPU only)."""
import math

import pytest

torch = pytest.importorskip("torch")

from pp4_worker.model import hashing  # noqa: E402
from pp4_worker.model import sampling  # noqa: E402
from pp4_worker.model.config import GREEDY, SAMPLED, SWITCH  # noqa: E402


def test_masks():
    assert sampling.alternating_masks(1) == ([False], [True])
    assert sampling.alternating_masks(4) == ([False, True, False, True], [True, False, True, False])
    assert sampling.alternating_masks(3) == ([False, True, False], [True, False, True])
    assert sampling.mask_all_t0(3) == [False] * 3 and sampling.mask_all_t1(2) == [True] * 2
    assert sampling.mask_name([False, True, True]) == "011"


def test_mix32_same_on_ints_and_tensors_and_bijective_sample():
    xs = list(range(0, 1 << 32, 9973 * 1013))[:5000] + [0, 1, (1 << 32) - 1]
    t = hashing.mix32(torch.tensor(xs, dtype=torch.int64))
    assert t.tolist() == [hashing.mix32(x) for x in xs]
    assert int(t.min()) >= 0 and int(t.max()) < 1 << 32
    assert len(set(t.tolist())) == len(set(xs))


def _noise(seeds, depth, ids):
    table = sampling.row_depth_table(4, 5, torch, "cpu")
    keys = sampling.row_depth_keys(torch.tensor(seeds, dtype=torch.int64), table[:depth, : len(seeds)])
    return sampling.gumbel_log_exponential(keys, sampling.vocab_premix(ids), torch)


def test_gumbel_noise_independent_of_vocab_sharding():
    V = 1000
    ids = torch.arange(V, dtype=torch.int64)
    seeds = [12345, -7, 2**62 + 11]
    full = _noise(seeds, 5, ids)
    halves = torch.cat([_noise(seeds, 5, ids[: V // 2]), _noise(seeds, 5, ids[V // 2:])], dim=-1)
    assert torch.equal(full.view(torch.int32), halves.view(torch.int32))
    # and of the order in which ids are visited
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(1))
    assert torch.equal(_noise(seeds, 5, ids[perm]), full[..., perm])


def test_gumbel_noise_depends_on_seed_row_depth():
    ids = torch.arange(64, dtype=torch.int64)
    n = _noise([1, 1, 2], 2, ids)  # [depth, row, vocab]
    assert not torch.equal(n[0, 0], n[0, 1])  # same seed, other row
    assert not torch.equal(n[0, 0], n[0, 2])  # other seed
    assert not torch.equal(n[0, 0], n[1, 0])  # other depth
    assert torch.equal(n, _noise([1, 1, 2], 2, ids))  # a pure function


def test_gumbel_statistics_and_extremes():
    ids = torch.arange(50000, dtype=torch.int64)
    w = _noise([99], 1, ids).flatten()
    g = -w  # Gumbel(0, 1) samples: mean = Euler's gamma, variance pi^2/6
    assert torch.isfinite(g).all()
    assert abs(g.mean().item() - 0.5772) < 0.03
    assert abs(g.var().item() - math.pi**2 / 6) < 0.08
    # the transform at the extreme hashes stays finite (u never 0 or 1)
    extremes = sampling.log_exponential_of_hash(torch.tensor([0, (1 << 32) - 1], dtype=torch.int64), torch)
    assert torch.isfinite(extremes).all(), extremes


def _merge(logits, noise, mode, t1=None, chunks=1):
    V = logits.shape[1]
    vs = V // 2
    stats = []
    for r in range(2):
        sl = slice(r * vs, (r + 1) * vs)
        lg = logits[:, sl].contiguous()
        nz = noise[:, sl].contiguous() if noise is not None else None
        sc = sampling.selection_scores(lg, mode, nz, t1, torch)
        stats.append(sampling.shard_stats(lg, sc, r * vs, chunks, torch))
    tok = torch.empty(logits.shape[0], dtype=torch.int64)
    conf = torch.empty(logits.shape[0], dtype=torch.float32)
    sampling.merge_shard_stats(stats, tok, conf, torch)
    return tok, conf


@pytest.mark.parametrize("chunks", [1, 4])
@pytest.mark.parametrize("mode", [GREEDY, SAMPLED])
def test_head_merge_matches_unsharded_softmax(mode, chunks):
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(4, 2000, generator=g) * 4).float()
    noise = _noise([5, 6, 7, 8], 1, torch.arange(2000))[0] if mode == SAMPLED else None
    tok, conf = _merge(logits, noise, mode, chunks=chunks)
    ref = sampling.reference_choice(logits.double().tolist(),
                                    noise.double().tolist() if noise is not None else [None] * 4,
                                    [mode == SAMPLED] * 4)
    assert tok.tolist() == [t for t, _ in ref]
    for c, (_, p) in zip(conf.tolist(), ref):
        assert abs(c - p) <= 1e-5 * p + 1e-9
    # and against torch's own unsharded fp32 softmax
    sm = torch.softmax(logits, dim=-1)
    assert torch.allclose(conf, sm.gather(1, tok[:, None]).squeeze(1), rtol=1e-5)


@pytest.mark.parametrize("chunks", [1, 5])
def test_merge_ties_go_to_lowest_global_id(chunks):
    logits = torch.zeros(4, 20)
    logits[0, [3, 17]] = 5.0  # tie across shards: id 3
    logits[1, [16, 19]] = 5.0  # tie inside shard 1, across its chunks: id 16
    logits[2, :] = 1.0  # all equal: id 0
    logits[3, [13, 12]] = 5.0  # tie inside one chunk of shard 1: id 12
    tok, conf = _merge(logits, None, GREEDY, chunks=chunks)
    assert tok.tolist() == [3, 16, 0, 12]
    assert abs(conf[2].item() - 0.05) < 1e-7


def test_vocab_chunks():
    assert sampling.vocab_chunks(64128) == 128  # 501 per chunk
    assert sampling.vocab_chunks(500) == 1
    assert sampling.vocab_chunks(4096) == 16
    for v in (64128, 500, 4096, 1000, 777):
        assert v % sampling.vocab_chunks(v) == 0


def test_switch_scores_are_the_logits_for_t0_rows_bit_for_bit():
    logits = torch.randn(4, 100)
    noise = torch.randn(4, 100)
    t1 = torch.tensor([False, True, False, True])
    sc = sampling.selection_scores(logits, SWITCH, noise, t1, torch)
    assert torch.equal(sc[~t1].view(torch.int32), logits[~t1].view(torch.int32))
    assert torch.equal(sc[t1], (logits - noise)[t1])


def test_q_payload_rules():
    conf = torch.tensor([0.5, 0.25, 0.125])
    zero = torch.zeros(())
    t1 = torch.tensor([True, False, True])
    q = torch.full((3,), float("nan"))
    sampling.write_q_payload(SWITCH, conf, q, t1, zero, torch)
    assert q.tolist() == [0.5, 0.0, 0.125]
    q = torch.zeros(3)
    sampling.write_q_payload(SAMPLED, conf, q, None, zero, torch)
    assert q.tolist() == conf.tolist()
