"""The draft head's token choice: T0/T1 masks, Gumbel noise, per-shard statistics, merge.

Each rank holds vocabulary rows [r*vs, (r+1)*vs) and produces fp32 logits for them
only.  Rather than gathering logits, a rank reduces its shard to a few numbers per
row (ShardStats: its best score, that token's id and logit, and the logsumexp of
each chunk of its row) and the merge combines those -- what two GPUs would
exchange.  The merge is exact: the chosen token is the global maximum of the
selection score with ties going to the lowest global id (max across shards), and
its probability is exp(logit - logsumexp over both shards).

T1 rows use Gumbel-max sampling at temperature 1: argmax(logit_v + G_v) with
G_v = -log(-log(u_v)).  u_v is a counter hash of (row seed, row, depth, global
vocabulary id), so neither the vocabulary split nor graph replay can change it.
"""
from __future__ import annotations

import math

import attrs

from pp4_worker.model import hashing
from pp4_worker.model.config import GREEDY, SAMPLED, SWITCH


# ---------------------------------------------------------------------------- masks
def mask_all_t0(batch: int) -> list[bool]:
    return [False] * batch


def mask_all_t1(batch: int) -> list[bool]:
    return [True] * batch


def alternating_masks(batch: int) -> tuple[list[bool], list[bool]]:
    """([T0,T1,T0,...], [T1,T0,T1,...]) for a batch; True marks a sampled (T1) row."""
    first = [bool(i % 2) for i in range(batch)]
    return first, [not v for v in first]


def mask_name(mask: list[bool]) -> str:
    return "".join("1" if v else "0" for v in mask)


# ---------------------------------------------------------------------------- gumbel
def vocab_premix(global_ids):
    """Per-vocabulary-id half of the Gumbel hash; computed once per rank at set-up.

    Stored with the element mixer's first xorshift already applied (it distributes
    over xor), which saves two passes over [D, B, vocab] per call.
    """
    return hashing.first_shift(hashing.mix32(global_ids ^ hashing.DOMAIN_GUMBEL_VOCAB))


def row_depth_table(max_batch: int, max_depth: int, torch, device):
    """[depth, row] constants mixing the row index and depth into the noise key."""
    table = [
        [hashing.mix32(((row << 8) | depth) ^ hashing.DOMAIN_GUMBEL_ROW) for row in range(max_batch)]
        for depth in range(max_depth)
    ]
    return torch.tensor(table, dtype=torch.int64, device=device)


def row_depth_keys(seeds, table):
    """Noise keys [depth, row] from the per-row 64-bit seeds [B] (int64, any sign).

    Returned with the element mixer's first xorshift applied (see vocab_premix).
    """
    lo = seeds & hashing.MASK32
    hi = (seeds >> 32) & hashing.MASK32  # arithmetic shift, then mask: the top word
    return hashing.first_shift(hashing.mix32(hashing.mix32(lo[None, :] ^ table) ^ hi[None, :]))


def gumbel_log_exponential(keys, premix, torch, out=None):
    """log(E) with E = -log(u) ~ Exp(1) for every (depth, row, vocab id): [D, B, V] fp32.

    The Gumbel variable is G = -log(E), so the selection score logit + G is
    ``logit - log(E)``.  E is computed as -log1p(u - 1), with u - 1 formed exactly,
    so E is accurate (and never 0) for u close to 1 as well as close to 0.
    """
    # == mix32(vocab hash ^ row-depth key): both halves carry the first xorshift already.
    h = hashing.mix32_after_first_shift(premix[None, None, :] ^ keys[:, :, None])
    return log_exponential_of_hash(h, torch, out)


def log_exponential_of_hash(h, torch, out=None):
    """log(E) for 32-bit hashes h (int64 holding 0 .. 2**32-1)."""
    # u = (s + 0.5) * 2**-23 with s the top 23 bits; u - 1 is exact in float32.
    u_minus_1 = torch.sub(h >> 9, 2.0**23 - 0.5).mul_(2.0**-23)
    exp1 = torch.log1p(u_minus_1).neg_()
    return torch.log(exp1, out=out)


# ---------------------------------------------------------------------------- head statistics
@attrs.define
class ShardStats:
    """What one rank contributes to the merge, one entry per row."""

    best_score: object  # fp32 [B]: max of the selection score in this shard
    best_id: object  # int64 [B]: global vocabulary id of that maximum (lowest on ties)
    best_logit: object  # fp32 [B]: the logit of that token
    chunk_logsumexp: object  # fp32 [B, C]: log sum exp of the shard's logits, per chunk


def selection_scores(logits, mode: str, log_exp_noise=None, t1_mask=None, torch=None):
    """Greedy rows choose by the logit, sampled rows by logit + Gumbel.

    The switch path uses ``where`` so that a T0 row's score *is* its logit,
    bit for bit -- the reason a switch graph fed all-T0 equals the greedy graph.
    """
    if mode == GREEDY:
        return logits
    noisy = logits - log_exp_noise
    if mode == SAMPLED:
        return noisy
    if mode == SWITCH:
        return torch.where(t1_mask[:, None], noisy, logits)
    raise ValueError(f"unknown mode {mode!r}")


def vocab_chunks(shard_vocab: int, max_chunks: int = 128, min_length: int = 256) -> int:
    """How many equal chunks a shard's row is reduced in (1 if none fits).

    torch reduces a row with one thread block, so a [B, 64128] row max or softmax
    runs on B blocks (~15 us each on an H200).  Viewing the row as [C, L] chunks puts
    B*C blocks to work; a second, tiny reduction combines the chunks, exactly.
    """
    for c in range(min(max_chunks, shard_vocab // min_length), 1, -1):
        if shard_vocab % c == 0:
            return c
    return 1


def shard_stats(logits, scores, vocab_offset: int, chunks: int, torch) -> ShardStats:
    B, V = logits.shape
    length = V // chunks
    # torch.max along a dim returns the first maximal index, so the lowest id wins a tie
    # inside a chunk, and the lowest chunk wins a tie between chunk maxima.
    chunk_best, chunk_arg = torch.max(scores.view(B, chunks, length), dim=-1)
    best_score, best_chunk = torch.max(chunk_best, dim=-1)
    best_local = torch.add(chunk_arg.gather(1, best_chunk[:, None]).squeeze(1), best_chunk, alpha=length)
    best_logit = logits.gather(1, best_local[:, None]).squeeze(1)
    # log_softmax is one fused kernel per chunk row; logit - log_softmax(logit) at any
    # index of a chunk is that chunk's logsumexp (exact up to fp32 rounding).
    by_chunk = logits.view(B, chunks, length)
    chunk_lse = by_chunk[:, :, 0] - torch.log_softmax(by_chunk, dim=-1)[:, :, 0]
    best_id = best_local + vocab_offset if vocab_offset else best_local  # rank 0: no kernel
    return ShardStats(best_score, best_id, best_logit, chunk_lse)


def merge_shard_stats(stats: list[ShardStats], tokens_out, confidence_out, torch) -> None:
    """Exact cross-shard choice; writes the token ids and their softmax probabilities.

    Strict ``>`` sends ties to rank 0, whose ids are all lower than rank 1's, so the
    lowest global id wins across shards as it does within one.
    """
    if len(stats) != 2:
        raise ValueError("the merge is written for exactly two vocabulary shards")
    s0, s1 = stats
    pick1 = s1.best_score > s0.best_score
    torch.where(pick1, s1.best_id, s0.best_id, out=tokens_out)
    chosen_logit = torch.where(pick1, s1.best_logit, s0.best_logit)
    # p = exp(l - logsumexp over every chunk of both shards) = 1 / sum_c exp(lse_c - l).
    # No overflow: a greedy choice is the maximum logit (each term <= chunk length), and
    # a sampled one is within 19.5 of it (the 23-bit uniforms bound the Gumbel noise to
    # [-2.8, 16.7]), so every term stays below e^26 * chunk length.
    all_lse = torch.cat([s0.chunk_logsumexp, s1.chunk_logsumexp], dim=1)
    torch.reciprocal(torch.exp(all_lse - chosen_logit[:, None]).sum(dim=-1), out=confidence_out)


def write_q_payload(mode: str, confidence, q_out, t1_mask, zero, torch) -> None:
    """q: the draft probability of a sampled token, zero for greedy rows."""
    if mode == SAMPLED:
        q_out.copy_(confidence)
    elif mode == SWITCH:
        torch.where(t1_mask, confidence, zero, out=q_out)
    # GREEDY: the column stays at the zero written at the start of the call.


def reference_choice(logits_rows, log_exp_noise_rows, sampled_rows: list[bool]):
    """Unsharded float64 reference on the host (tests): (token, probability) per row."""
    out = []
    for logits, noise, sampled in zip(logits_rows, log_exp_noise_rows, sampled_rows):
        scores = [lv - nv for lv, nv in zip(logits, noise)] if sampled else list(logits)
        best = max(range(len(scores)), key=lambda i: (scores[i], -i))
        m = max(logits)
        lse = m + math.log(sum(math.exp(v - m) for v in logits))
        out.append((best, math.exp(logits[best] - lse)))
    return out
