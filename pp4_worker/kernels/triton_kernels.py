"""Fused Triton kernels for the worker's small per-pass steps (``--backend triton``).

o and gate_up stay in cuBLAS; with ``--gemm triton`` (the triton backend's default) qkv, down
and the head run the skinny GEMM at the end of this file.  What the other kernels replace is
the ~45 small torch kernels per rank and pass around them (docs/worker.md, "Where a pass
went"): each launch costs a few microseconds however little it does, and a pass is dependent
launches end to end.

Every kernel is deterministic (fixed reduction order; the one atomic, in the split-K
GEMM, only counts arrivals and never adds values), so a graph replays bit for bit and
equals the eager call, which is what the exactness gate checks within a backend.  With
``TRITON_INTERPRET=1`` they run on CPU tensors, which is how the tests check them against
the torch backend and float64.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton import cdiv, next_power_of_2  # noqa: F401 - the launchers' grid and block arithmetic

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    HAS_PDL = True
except ImportError:  # a Triton without griddepcontrol: launches stay plain (--pdl off)
    HAS_PDL = False


@triton.jit
def _pdl_enter(PDL: tl.constexpr):
    """With programmatic dependent launch (``--pdl on``) a kernel may start while the one
    before it in the stream is still finishing: wait here until that one has completed and
    its writes are visible, before this kernel reads or writes anything, then let the next
    kernel start launching.  Every kernel calls this first, so each waits for its
    predecessor, which waited for its own: the order of all memory effects is the plain
    stream order.  Without PDL the branch is compiled out."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def embed_gather_kernel(TOK, tok_stride_b, tok_stride_t, T, EMB, OUT, vocab_offset, shard_vocab, H,
                        BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Vocab-parallel embedding: row (b, t) gets this rank's row of its token, else the zero row.
    Program (row, chunk) copies BLOCK columns: a decode pass has one to four rows, and chunks
    side by side wait for their loads together rather than one after the other."""
    _pdl_enter(PDL)
    row = tl.program_id(0)
    b = row // T
    t = row % T
    tok = tl.load(TOK + b * tok_stride_b + t * tok_stride_t)
    local = tok - vocab_offset
    local = tl.where((local >= 0) & (local < shard_vocab), local, shard_vocab)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < H
    tl.store(OUT + row * H + offs, tl.load(EMB + local * H + offs, mask=m), mask=m)


@triton.jit
def residual_sum_norm_kernel(X, P0, P1, W, X_OUT, N_OUT, H, eps,
                             HAS_X: tl.constexpr, WRITE_X: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """One program per row: r = X + (P0 + P1), the colocated all-reduce (rank0 + rank1) and
    the residual add, then N_OUT = rms_norm(r) * W; writes r to X_OUT when WRITE_X.

    Rounded to the model dtype after the sum and again after the residual add, as the
    unfused ``x + (p0 + p1)`` is; the norm works in fp32 on that rounded r and rounds once,
    as rms_norm_kernel does, so the fused result equals the unfused one bit for bit.
    """
    _pdl_enter(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < H
    at = row * H + offs
    s = (tl.load(P0 + at, mask=m, other=0.0).to(tl.float32) + tl.load(P1 + at, mask=m, other=0.0).to(tl.float32))
    r = s.to(N_OUT.dtype.element_ty)
    if HAS_X:
        r = (tl.load(X + at, mask=m, other=0.0).to(tl.float32) + r.to(tl.float32)).to(N_OUT.dtype.element_ty)
    if WRITE_X:
        tl.store(X_OUT + at, r, mask=m)
    x = r.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    w = tl.load(W + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(N_OUT + at, (x * inv * w).to(N_OUT.dtype.element_ty), mask=m)


@triton.jit
def rms_norm_kernel(X, W, OUT, x_row_stride, H, eps, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """One program per row: x * rsqrt(mean(x^2) + eps) * w, in fp32, rounded once."""
    _pdl_enter(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < H
    x = tl.load(X + row * x_row_stride + offs, mask=m, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    w = tl.load(W + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(OUT + row * H + offs, (x * inv * w).to(OUT.dtype.element_ty), mask=m)


@triton.jit
def rope_cache_fold_kernel(QKV, POS, pos_stride_b, pos_stride_t, ROPE, CACHE, Q_OUT,
                           T, cache_batch, cache_len, Q_ROT, K_ROT,
                           HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                           APPLY_ROPE: tl.constexpr = True, PDL: tl.constexpr = False):
    """Rotary embedding of q and k, the K/V cache write and the query fold, in one kernel.

    Grid (B*T, HQ + HKV).  Program (row, h < HQ) rotates query head h and writes it
    to Q_OUT [B, HKV, T*GROUP, D] at (b, h // GROUP, t*GROUP + h % GROUP): the heads
    sharing a KV head folded into the query length.  Program (row, HQ + j) rotates
    K head j and writes it, and V head j unrotated, to cache slot POS[b, t].
    ROPE is [slot, (cos | sin_signed), D]: out = x*cos + swap_halves(x)*sin_signed.
    APPLY_ROPE=False: q and k were rotated already (EXL3's rope kernel) into Q_ROT
    [B*T, HQ, D] and K_ROT [B*T, HKV, D]; they are read from there, V from QKV.
    """
    _pdl_enter(PDL)
    GROUP: tl.constexpr = HQ // HKV
    QKV_ROW: tl.constexpr = (HQ + 2 * HKV) * D
    row = tl.program_id(0)
    h = tl.program_id(1)
    b = row // T
    t = row % T
    pos = tl.load(POS + b * pos_stride_b + t * pos_stride_t)
    offs = tl.arange(0, D)
    if APPLY_ROPE:
        swapped = (offs + D // 2) % D
        cos = tl.load(ROPE + pos * 2 * D + offs).to(tl.float32)
        sin = tl.load(ROPE + pos * 2 * D + D + offs).to(tl.float32)
        src = QKV + row * QKV_ROW + h * D
        x = tl.load(src + offs).to(tl.float32)
        xs = tl.load(src + swapped).to(tl.float32)
        y = (x * cos + xs * sin).to(CACHE.dtype.element_ty)
    elif h < HQ:
        y = tl.load(Q_ROT + (row * HQ + h) * D + offs)
    else:
        y = tl.load(K_ROT + (row * HKV + h - HQ) * D + offs)
    if h < HQ:
        kv = h // GROUP
        member = h % GROUP
        dst = Q_OUT + ((b * HKV + kv) * (T * GROUP) + t * GROUP + member) * D
        tl.store(dst + offs, y)
    else:
        j = h - HQ
        k_dst = CACHE + ((b * HKV + j) * cache_len + pos) * D
        tl.store(k_dst + offs, y)
        v = tl.load(QKV + row * QKV_ROW + (HQ + HKV + j) * D + offs)
        v_dst = CACHE + (((cache_batch + b) * HKV + j) * cache_len + pos) * D
        tl.store(v_dst + offs, v)


@triton.jit
def unfold_attention_kernel(ATT, OUT, T, HKV: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, PDL: tl.constexpr = False):
    """[B, HKV, T*GROUP, D] -> rows (b, t), columns (member, kv head, D): o's column order."""
    _pdl_enter(PDL)
    row = tl.program_id(0)
    c = tl.program_id(1)  # member * HKV + kv
    b = row // T
    t = row % T
    member = c // HKV
    kv = c % HKV
    offs = tl.arange(0, D)
    v = tl.load(ATT + ((b * HKV + kv) * (T * GROUP) + t * GROUP + member) * D + offs)
    tl.store(OUT + (row * GROUP * HKV + c) * D + offs, v)


@triton.jit
def silu_mul_kernel(GU, OUT, M, N, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """OUT[r, j] = silu(GU[r, j]) * GU[r, M + j], computed in fp32, rounded once."""
    _pdl_enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    r = offs // M
    j = offs % M
    g = tl.load(GU + r * 2 * M + j, mask=m, other=0.0).to(tl.float32)
    u = tl.load(GU + r * 2 * M + M + j, mask=m, other=0.0).to(tl.float32)
    tl.store(OUT + offs, (g / (1.0 + tl.exp(-g)) * u).to(OUT.dtype.element_ty), mask=m)


@triton.jit
def _mix32_after_first_shift(x):
    """hashing.mix32_after_first_shift on uint32 (the multiplies wrap mod 2**32, as the
    masked int64 products of the torch path do)."""
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x1B873593
    return x ^ (x >> 16)


@triton.jit
def _mix32(x):
    return _mix32_after_first_shift(x ^ (x >> 16))


@triton.jit
def gumbel_noise_kernel(SEEDS, ROW_DEPTH, table_stride, PREMIX, OUT, B, V, out_stride_d, out_stride_b,
                        BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """log(E), E ~ Exp(1), for (depth, row) = program 0 and BLOCK vocab ids = program 1: the
    torch path's sampling.row_depth_keys and gumbel_log_exponential in one kernel.

    The hash is bit-identical to the torch path's.  E = -log(u) with u = (s + 0.5) * 2**-23
    exact in float32; near u = 1 (|u - 1| < 2**-7) log(u) is its log1p series, accurate to
    2**-28 relative where a plain float32 log would lose every digit, so E is never 0.
    """
    _pdl_enter(PDL)
    db = tl.program_id(0)
    d = db // B
    b = db % B
    seed = tl.load(SEEDS + b)
    lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    table = tl.load(ROW_DEPTH + d * table_stride + b).to(tl.uint32)
    key = _mix32(_mix32(lo ^ table) ^ hi)
    key = key ^ (key >> 16)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < V
    h = _mix32_after_first_shift(tl.load(PREMIX + offs, mask=m, other=0).to(tl.uint32) ^ key)
    x = ((h >> 9).to(tl.float32) - 8388607.5) * 1.1920928955078125e-07  # u - 1, exact
    series = x * (1.0 + x * (-0.5 + x * (0.3333333333333333 + x * -0.25)))
    log_u = tl.where(x > -0.0078125, series, tl.log(1.0 + x))
    tl.store(OUT + d * out_stride_d + b * out_stride_b + offs, tl.log(-log_u), mask=m)


@triton.jit
def head_chunk_stats_kernel(LOGITS, NOISE, noise_row_stride, T1, OUT_SCORE, OUT_ID, OUT_LOGIT, OUT_LSE,
                            V, vocab_offset, CHUNKS, LENGTH,
                            MODE: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Per (row, chunk) of one rank's logits: best selection score, its global id and logit,
    and the chunk's logsumexp.  One program per (row, chunk).

    MODE 0 greedy (score = logit), 1 sampled (logit - log E), 2 switch (per-row T1 mask,
    ``where`` so that a T0 row's score is its logit bit for bit).  tl.argmax returns the
    first maximum, so ties go to the lowest id, as the torch path's torch.max does.
    """
    _pdl_enter(PDL)
    b = tl.program_id(0)
    c = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    m = offs < LENGTH
    col = c * LENGTH + offs
    logit = tl.load(LOGITS + b * V + col, mask=m, other=float("-inf"))
    if MODE == 0:
        score = logit
    else:
        noisy = logit - tl.load(NOISE + b * noise_row_stride + col, mask=m, other=0.0)
        if MODE == 1:
            score = noisy
        else:
            t1 = tl.load(T1 + b).to(tl.int1)
            score = tl.where(t1, noisy, logit)
    score = tl.where(m, score, float("-inf"))
    best = tl.argmax(score, axis=0)
    best_score = tl.max(score, axis=0)
    best_logit = tl.sum(tl.where(offs == best, logit, 0.0), axis=0)
    top = tl.max(logit, axis=0)
    lse = top + tl.log(tl.sum(tl.exp(logit - top), axis=0))
    out = b * CHUNKS + c
    tl.store(OUT_SCORE + out, best_score)
    tl.store(OUT_ID + out, (vocab_offset + c * LENGTH + best).to(tl.int64))
    tl.store(OUT_LOGIT + out, best_logit)
    tl.store(OUT_LSE + out, lse)


@triton.jit
def merge_choice_kernel(SCORE0, ID0, LOGIT0, LSE0, SCORE1, ID1, LOGIT1, LSE1, T1,
                        PROPOSALS, CONFIDENCES, Q, depth, out_stride, q_stride, CHUNKS,
                        MODE: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """One program per row: the exact choice over both ranks' chunk statistics.

    Entry i < CHUNKS is rank 0's chunk i, then rank 1's: ids rise with the index, so
    tl.argmax's first maximum is the lowest global id among equal scores (ties go to
    rank 0, as in the torch merge).  The probability is exp(logit - logsumexp over all
    chunks) = 1 / sum_c exp(lse_c - logit).  Writes the proposal, its confidence and the
    q payload (the confidence on T1 rows, 0 on T0 rows).
    """
    _pdl_enter(PDL)
    b = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    in0 = i < CHUNKS
    in1 = (i >= CHUNKS) & (i < 2 * CHUNKS)
    j0 = b * CHUNKS + i
    j1 = b * CHUNKS + i - CHUNKS
    score = tl.where(in0, tl.load(SCORE0 + j0, mask=in0, other=float("-inf")),
                     tl.load(SCORE1 + j1, mask=in1, other=float("-inf")))
    ids = tl.where(in0, tl.load(ID0 + j0, mask=in0, other=0), tl.load(ID1 + j1, mask=in1, other=0))
    logits = tl.where(in0, tl.load(LOGIT0 + j0, mask=in0, other=0.0), tl.load(LOGIT1 + j1, mask=in1, other=0.0))
    lse = tl.where(in0, tl.load(LSE0 + j0, mask=in0, other=float("-inf")),
                   tl.load(LSE1 + j1, mask=in1, other=float("-inf")))
    best = tl.argmax(score, axis=0)
    pick = i == best
    chosen_id = tl.sum(tl.where(pick, ids, 0), axis=0)
    chosen_logit = tl.sum(tl.where(pick, logits, 0.0), axis=0)
    confidence = 1.0 / tl.sum(tl.exp(lse - chosen_logit), axis=0)
    tl.store(PROPOSALS + b * out_stride + depth, chosen_id)
    tl.store(CONFIDENCES + b * out_stride + depth, confidence)
    if MODE == 1:
        tl.store(Q + b * q_stride + depth, confidence)
    elif MODE == 2:
        tl.store(Q + b * q_stride + depth, tl.where(tl.load(T1 + b).to(tl.int1), confidence, 0.0))
    else:
        tl.store(Q + b * q_stride + depth, 0.0)


@triton.jit
def attention_split_kernel(Q, CACHE, POS, pos_stride_b, pos_stride_t, M_OUT, L_OUT, ACC_OUT,
                           T, cache_batch, cache_len, scale, NSPLIT, ROWS_PADDED,
                           HKV: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
                           BLOCK_L: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr = False):
    """Split-KV attention, part 1: program (b*HKV + kv, split, row block) attends BLOCK_L
    folded query rows of (b, kv) to cache slots [split*BLOCK_S, +BLOCK_S) and writes the
    split's row maxima, exp-sums and unnormalised outputs (fp32).

    Query row l is position t = l // GROUP; slot s is visible to it iff s <= POS[b, t] (the
    causal mask the torch path adds).  Scores and softmax are fp32; the probabilities enter
    the second product as 16-bit, as in the torch path.  A split wholly past the last
    position reads no K/V.
    """
    _pdl_enter(PDL)
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // HKV
    kv = bh % HKV
    rows = T * GROUP
    l = tl.program_id(2) * BLOCK_L + tl.arange(0, BLOCK_L)
    row_ok = l < rows
    pos = tl.load(POS + b * pos_stride_b + (l // GROUP) * pos_stride_t, mask=row_ok, other=-1)
    last = tl.load(POS + b * pos_stride_b + (T - 1) * pos_stride_t)
    s0 = split * BLOCK_S
    out = (bh * NSPLIT + split) * ROWS_PADDED + l
    if s0 <= last:
        d = tl.arange(0, D)
        q = tl.load(Q + (bh * rows + l)[:, None] * D + d[None, :], mask=row_ok[:, None], other=0.0)
        s = s0 + tl.arange(0, BLOCK_S)
        s_ok = s < cache_len
        k = tl.load(CACHE + ((b * HKV + kv) * cache_len + s)[:, None] * D + d[None, :], mask=s_ok[:, None], other=0.0)
        # V's load is issued before the scores need K, so the two are in flight together.
        v = tl.load(CACHE + (((cache_batch + b) * HKV + kv) * cache_len + s)[:, None] * D + d[None, :],
                    mask=s_ok[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k)) * scale
        visible = (s[None, :] <= pos[:, None]) & s_ok[None, :]
        scores = tl.where(visible, scores, float("-inf"))
        m = tl.max(scores, axis=1)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        p = tl.exp(scores - m_safe[:, None])
        acc = tl.dot(p.to(v.dtype), v)
        tl.store(M_OUT + out, m)
        tl.store(L_OUT + out, tl.sum(p, axis=1))
        tl.store(ACC_OUT + out[:, None] * D + d[None, :], acc)
    else:
        tl.store(M_OUT + out, tl.full([BLOCK_L], float("-inf"), tl.float32))
        tl.store(L_OUT + out, tl.zeros([BLOCK_L], tl.float32))


@triton.jit
def attention_combine_kernel(M_IN, L_IN, ACC_IN, POS, pos_stride_b, pos_stride_t, OUT, T, NSPLIT, ROWS_PADDED,
                             HKV: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
                             BLOCK_S: tl.constexpr, BLOCK_SPLIT: tl.constexpr, PDL: tl.constexpr = False):
    """Split-KV attention, part 2: program (b*T + t, member*HKV + kv) combines the splits of
    query row t*GROUP + member and writes it, in the model dtype, straight into o's input
    layout: rows (b, t), columns (member, kv head, D).  Splits are combined in order."""
    _pdl_enter(PDL)
    row = tl.program_id(0)
    c = tl.program_id(1)
    b = row // T
    t = row % T
    member = c // HKV
    kv = c % HKV
    bh = b * HKV + kv
    l = t * GROUP + member
    j = tl.arange(0, BLOCK_SPLIT)
    last = tl.load(POS + b * pos_stride_b + (T - 1) * pos_stride_t)
    used = (j < NSPLIT) & (j * BLOCK_S <= last)
    src = (bh * NSPLIT + j) * ROWS_PADDED + l
    m = tl.load(M_IN + src, mask=used, other=float("-inf"))
    top = tl.max(m, axis=0)
    w = tl.where(used, tl.exp(m - top), 0.0)
    total = tl.sum(w * tl.load(L_IN + src, mask=used, other=0.0), axis=0)
    d = tl.arange(0, D)
    acc = tl.load(ACC_IN + src[:, None] * D + d[None, :], mask=used[:, None], other=0.0)
    o = tl.sum(w[:, None] * acc, axis=0) / total
    tl.store(OUT + (row * GROUP * HKV + c) * D + d, o.to(OUT.dtype.element_ty))


@triton.jit
def skinny_linear_kernel(X, W, Y, PART, COUNT, M, N, K, x_stride, k_per_split, splits,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    """Y[M, N] = X[M, K] @ W[N, K]^T for few rows (M <= BLOCK_M <= 64), fp32 accumulation.

    Program (n block, split) streams a BLOCK_N x k_per_split strip of W once.  With one split
    it writes Y itself.  With more, each split writes its fp32 partial to PART[split] and
    bumps COUNT[n block]; the program that arrives last adds the partials in split order
    (0, 1, ...), writes Y and resets the counter for the next launch.  Which program is last
    varies, the order of the sum does not, so the result is the same bits every time; and
    there is no second kernel (cuBLAS's split-K launches a reduce kernel, ~2.5 us with its
    launch gap).  k_per_split must be a multiple of BLOCK_K; COUNT must start at zero.
    """
    _pdl_enter(PDL)
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    k0 = split * k_per_split
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(k0, k0 + k_per_split, BLOCK_K):
        x = tl.load(X + rm[:, None] * x_stride + (k + rk)[None, :], mask=m_ok[:, None], other=0.0)
        w = tl.load(W + rn[:, None] * K + (k + rk)[None, :], mask=n_ok[:, None], other=0.0)
        acc += tl.dot(x, tl.trans(w))
    out_ok = m_ok[:, None] & n_ok[None, :]
    tile = rm[:, None] * N + rn[None, :]
    if splits == 1:
        tl.store(Y + tile, acc.to(Y.dtype.element_ty), mask=out_ok)
    else:
        tl.store(PART + split * M * N + tile, acc, mask=out_ok)
        # Every thread's stores reach the barrier before the one thread that does the atomic
        # releases them (acq_rel, gpu scope); the last program's loads, after its acquire,
        # go to L2 (.cg), where the other programs' partials are.
        tl.debug_barrier()
        arrived = tl.atomic_add(COUNT + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == splits - 1:
            total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in range(0, splits):
                total += tl.load(PART + s * M * N + tile, mask=out_ok, other=0.0, cache_modifier=".cg")
            tl.store(Y + tile, total.to(Y.dtype.element_ty), mask=out_ok)
            tl.atomic_xchg(COUNT + pid_n, 0, sem="relaxed", scope="gpu")
