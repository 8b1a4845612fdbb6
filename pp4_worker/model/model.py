"""Ranks and the layer math of the tensor-parallel-2 draft model (its weights: weights.py).

Rank outputs that a real pair would all-reduce are summed by ``ColocatedSum`` in one
fixed order (rank0 + rank1).  Ranks only ever touch their own tensors and talk through
the collective and ShardStats, so a two-GPU NCCL version can reuse RankShard as is.
"""
from __future__ import annotations

import hashlib
import json
import math

import attrs
import torch

from pp4_worker.model import exl3, exl3_checkpoint, sampling
from pp4_worker.model.backends import TorchBackend
from pp4_worker.model.factory import make_backend
from pp4_worker.model.config import DEPTHS, MAX_BATCH, QUERY_BLOCK, TP_RANKS, Geometry, ModelSettings
from pp4_worker.model.weights import TORCH_DTYPES, RankWeights, SafetensorsSource, SyntheticSource, shard_weights


# ============================================================================ per-call geometry
@attrs.define
class StepView:
    """Everything a forward over positions [p0, p1) of the call needs, as views."""

    positions: torch.Tensor  # [B, T] int64 absolute positions (= KV slots)
    batch_rows: torch.Tensor  # [B, T] int64 row index (for the KV scatter)
    cos: torch.Tensor  # [B, T, 1, D] model dtype
    sin_signed: torch.Tensor  # [B, T, 1, D] model dtype
    mask: torch.Tensor  # [B, 1, T*group, S] additive fp32 (0 or -inf)
    rope_table: torch.Tensor  # [S, 2, D] the model's whole table (kernels that index it by position)
    start_positions: torch.Tensor | None = None  # [B] int32, packed: positions[:, 0] (EXL3's rope)


@attrs.define
class CallPositions:
    """Positions, rotary factors and attention masks for a whole call, built once."""

    positions: torch.Tensor  # [B, P]
    rope: torch.Tensor | None  # [B, P, 2, D]; None when the backend does not read it
    mask: torch.Tensor | None  # [B, P, group, S]; likewise
    batch_rows: torch.Tensor  # [B, 1] (expanded per step)
    rope_table: torch.Tensor  # [S, 2, D]
    starts: torch.Tensor | None = None  # [P, B] int32: row p is every row's position p, packed

    def step(self, p0: int, p1: int) -> StepView:
        B = self.positions.shape[0]
        T = p1 - p0
        if self.rope is None:  # a backend that indexes the tables by position itself
            cos = sin_signed = mask = None
        else:
            rope = self.rope[:, p0:p1]
            cos, sin_signed = rope[:, :, 0, None, :], rope[:, :, 1, None, :]
            mask = self.mask[:, p0:p1].flatten(1, 2)[:, None]
        return StepView(
            positions=self.positions[:, p0:p1],
            batch_rows=self.batch_rows.expand(B, T),
            cos=cos,
            sin_signed=sin_signed,
            mask=mask,
            rope_table=self.rope_table,
            start_positions=None if self.starts is None else self.starts[p0],
        )


# ============================================================================ one rank
class RankShard:
    """One logical TP rank: its weights, its KV cache, and the partial results it computes."""

    def __init__(self, weights: RankWeights, g: Geometry, backend: TorchBackend, cache_len: int,
                 dtype: torch.dtype, device: torch.device, head_chunks: int | None = None):
        self.w, self.g, self.backend = weights, g, backend
        self.rank = weights.rank
        self.vocab_offset = weights.rank * g.rank_vocab
        # [2 (k, v), batch slot, kv head, position, dim]: K and V of a head are each one
        # contiguous [S, D] block (what attention reads); zero-filled so that masked,
        # never-written slots hold finite values (0 * NaN would poison the softmax).
        self.kv = [
            torch.zeros(2, MAX_BATCH, g.rank_kv_heads, cache_len, g.head_dim, dtype=dtype, device=device)
            for _ in range(g.layers)
        ]
        # Gumbel log-exponentials for [depth, row, this rank's vocab], rewritten every sampling call.
        self.noise = torch.zeros(max(DEPTHS), MAX_BATCH, g.rank_vocab, dtype=torch.float32, device=device)
        self.scale = 1.0 / math.sqrt(g.head_dim)
        self.vocab_chunks = sampling.vocab_chunks(g.rank_vocab)
        if head_chunks is not None:
            if head_chunks < 1 or g.rank_vocab % head_chunks:
                raise ValueError(f"--head-chunks {head_chunks} must divide the shard vocabulary {g.rank_vocab}")
            self.vocab_chunks = head_chunks

    # ---------------------------------------------------------------- partial results
    def embed_partial(self, tokens: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel embedding: own rows, zeros for ids the other rank owns."""
        return self.backend.embed_partial(tokens, self.w.vocab_to_local, self.w.embed, self.vocab_offset)

    def attention_partial(self, layer: int, n: torch.Tensor, step: StepView) -> torch.Tensor:
        """n: the residual stream after this layer's attention norm (as the backend's residual_norm
        returned it: a backend may hand its next linear something already on the way to it)."""
        g, be, lw = self.g, self.backend, self.w.layers[layer]
        B, T = step.positions.shape
        hq, hkv, d = g.rank_heads, g.rank_kv_heads, g.head_dim
        qkv = be.linear(n, lw.qkv).view(B, T, hq + 2 * hkv, d)
        cache = self.kv[layer]
        # Query heads sharing a KV head are folded into the query length: plain MHA over hkv heads.
        q = be.rope_cache_fold(qkv, step, cache, hq, hkv, g.group)
        att = be.attend(q, cache, step, self.scale, T, g.group)
        if self.w.o_input == "heads" and g.group > 1:
            att = att.view(B * T, g.group, hkv, d).transpose(1, 2).reshape(B * T, hq * d)
        return be.linear(att, lw.o)

    def mlp_partial(self, layer: int, n: torch.Tensor) -> torch.Tensor:
        """n: the residual stream after this layer's MLP norm (as residual_norm returned it)."""
        be, lw = self.backend, self.w.layers[layer]
        return be.mlp(n, lw.gate_up, lw.down, self.g.rank_mlp)

    def head_stats(self, n: torch.Tensor, mode: str, depth: int, t1_mask) -> sampling.ShardStats:
        """n [B, H]: each row's last position after the final norm."""
        be = self.backend
        logits = be.linear_fp32(n, self.w.head, self.w.head_fp32_cpu)  # [B, vs] fp32
        B = logits.shape[0]
        return be.shard_stats(logits, mode, self.noise[depth, :B], t1_mask, self.vocab_offset, self.vocab_chunks)

    def write_gumbel_noise(self, seeds: torch.Tensor, row_depth: torch.Tensor) -> None:
        """seeds [B], row_depth [D, B] -> self.noise[:D, :B] (the vocabulary hash half is precomputed)."""
        D, B = row_depth.shape
        self.backend.gumbel_noise(seeds, row_depth, self.w.gumbel_premix, self.noise[:D, :B])

    # ---------------------------------------------------------------- request state I/O
    def load_kv(self, slot: int, kv_logical: torch.Tensor, context: int) -> None:
        """kv_logical [L, 2, kv_heads, >=context, D] (all heads) -> this rank's heads in ``slot``."""
        h0 = self.rank * self.g.rank_kv_heads
        for layer, cache in enumerate(self.kv):
            cache[:, slot].zero_()
            cache[:, slot, :, :context] = kv_logical[layer, :, h0 : h0 + self.g.rank_kv_heads, :context]

    def read_kv(self, slot: int, context: int) -> torch.Tensor:
        return torch.stack([cache[:, slot, :, :context] for cache in self.kv])


class ColocatedSum:
    """The all-reduce of a TP2 pair when both ranks run on one GPU: rank0 + rank1, always.

    (With two addends fp addition is commutative, so NCCL's sum would give the same
    bits; the fixed order is kept anyway so the code states it.)
    """

    name = "colocated (on-GPU add of the two ranks' partials)"

    def all_reduce(self, partials: list[torch.Tensor]) -> torch.Tensor:
        out = partials[0] + partials[1]
        for p in partials[2:]:
            out = out + p
        return out


# ============================================================================ the model
class TensorParallelDraft:
    """The draft model: embedding, layers and head, split over TP_RANKS ranks."""

    def __init__(self, settings: ModelSettings, device: torch.device, ranks_mode: str = "colocated"):
        g = settings.geometry
        problems = g.problems()
        if problems:
            raise ValueError("; ".join(problems))
        if ranks_mode != "colocated":
            raise NotImplementedError("only --ranks colocated is implemented")
        self.settings, self.g, self.device = settings, g, device
        self.dtype = TORCH_DTYPES[settings.dtype]
        self.backend = make_backend(settings.backend, device, settings.attention, settings.gemm, settings.exl3,
                                    settings.pdl)
        self.backend.prepare(g)
        self.cache_len = settings.cache_len
        if settings.weights_dir and self.backend.quantized:
            shards, self.weights_fingerprint = exl3_checkpoint.load(settings.weights_dir, g, self.dtype, device)
        else:
            source = (SafetensorsSource(settings.weights_dir, g, self.dtype, device) if settings.weights_dir
                      else SyntheticSource(g, settings.weight_seed, self.dtype, device))
            self.weights_fingerprint = source.fingerprint()
            shards = [shard_weights(source, g, r, self.dtype, device) for r in range(TP_RANKS)]
            if self.backend.quantized:
                opts = settings.exl3
                shards = [exl3.quantize_rank(w, g, settings.weight_seed, opts.bits, opts.head_bits, device,
                                             exl3_checkpoint.CODEBOOKS[opts.codebook]) for w in shards]
                self.weights_fingerprint += f"+exl3:bits={opts.bits},head_bits={opts.head_bits},cb={opts.codebook}"
        self.ranks = [RankShard(w, g, self.backend, self.cache_len, self.dtype, device, settings.head_chunks)
                      for w in shards]
        self.collective = ColocatedSum()
        self._build_constants()
        self.noise_stream = torch.cuda.Stream(device) if device.type == "cuda" and settings.overlap_noise else None
        if settings.rank_streams and not self.backend.ranks_may_overlap:
            raise ValueError(f"--rank-streams on: the {self.backend.name} backend's kernels share state between "
                             "the ranks (upstream EXL3's GEMM keeps one lock buffer per device); use --rank-streams off")
        # Ranks after the first run on these, beside the first on the current stream.
        self.rank_streams = ([torch.cuda.Stream(device) for _ in range(TP_RANKS - 1)]
                             if device.type == "cuda" and settings.rank_streams else [])

    def _build_constants(self) -> None:
        g, dev, S = self.g, self.device, self.cache_len
        self.offsets = torch.arange(QUERY_BLOCK + max(DEPTHS) - 1, dtype=torch.int64, device=dev)
        self.key_slots = torch.arange(S, dtype=torch.int64, device=dev)
        self.batch_rows = torch.arange(MAX_BATCH, dtype=torch.int64, device=dev)[:, None]
        self.row_depth = sampling.row_depth_table(MAX_BATCH, max(DEPTHS), torch, dev)
        mask_dtype = self.backend.attention_mask_dtype(self.dtype)
        self.mask_zero = torch.zeros(1, 1, g.group, 1, dtype=mask_dtype, device=dev)
        self.zero_f32 = torch.zeros((), dtype=torch.float32, device=dev)
        # Rotary table in float64 on the host, stored in the model dtype: [slot, (cos|sin_signed), D].
        half = g.head_dim // 2
        inv = [g.rope_theta ** (-2.0 * i / g.head_dim) for i in range(half)]
        pos = torch.arange(S, dtype=torch.float64)[:, None]
        ang = pos * torch.tensor(inv, dtype=torch.float64)[None, :]
        cos, sin = torch.cos(ang), torch.sin(ang)
        table = torch.stack([torch.cat([cos, cos], -1), torch.cat([-sin, sin], -1)], dim=1)
        self.rope_table = table.to(self.dtype).to(dev)

    def per_rank(self, work, *per_rank_args) -> list:
        """[work(rank, its args...) for each rank]: with rank streams, every rank after the first
        on its own stream, which waits for all the current stream has been given and is waited
        for before this returns (what each rank reads is ready before it starts; what it made is
        ready after). Tensors pass between the streams only across those two points, where
        everything before is ordered before everything after, so the caching allocator's
        per-stream reuse of a freed block cannot overtake a read of it."""
        jobs = list(zip(self.ranks, *per_rank_args))
        if not self.rank_streams:
            return [work(*job) for job in jobs]
        current = torch.cuda.current_stream(self.device)
        for stream in self.rank_streams:
            stream.wait_stream(current)
        out = [work(*jobs[0])]
        for stream, job in zip(self.rank_streams, jobs[1:]):
            with torch.cuda.stream(stream):
                out.append(work(*job))
        for stream in self.rank_streams:
            current.wait_stream(stream)
        return out

    # ---------------------------------------------------------------- geometry of a call
    def call_positions(self, positions: torch.Tensor) -> CallPositions:
        """positions [B, P] (absolute slots) -> rotary factors and causal masks for all of them."""
        rows = self.batch_rows[: positions.shape[0]]
        starts = positions.t().to(torch.int32).contiguous() if self.backend.reads_start_positions else None
        if not self.backend.reads_position_tables:
            return CallPositions(positions, None, None, rows, self.rope_table, starts)
        allowed = self.key_slots[None, None, :] <= positions[:, :, None]  # [B, P, S]
        mask = torch.where(allowed[:, :, None, :], self.mask_zero, float("-inf"))  # [B, P, group, S]
        return CallPositions(positions, self.rope_table[positions], mask, rows, self.rope_table, starts)

    def forward(self, tokens: torch.Tensor, step: StepView) -> list[torch.Tensor]:
        """tokens [B, T] at step.positions -> each rank's final-normed hidden states [B*T, H];
        writes the KV cache.

        Every sublayer ends in the all-reduce of the ranks' partials, the residual add and
        the next norm, which each rank applies with its own copy of the norm weight
        (backend.residual_norm: one kernel per rank where the backend fuses them; it is told
        which linear each rank's normed output feeds, so that it may start that linear too).
        """
        ranks, collective, eps = self.ranks, self.collective, self.g.norm_eps
        reduce_norm = self.backend.residual_norm
        x, partials = None, self.per_rank(lambda r: r.embed_partial(tokens))
        for layer in range(self.g.layers):
            lws = [r.w.layers[layer] for r in ranks]
            x, normed = reduce_norm(x, partials, collective, [lw.attn_norm for lw in lws], eps,
                                    [lw.qkv for lw in lws])
            partials = self.per_rank(lambda r, n: r.attention_partial(layer, n, step), normed)
            x, normed = reduce_norm(x, partials, collective, [lw.mlp_norm for lw in lws], eps,
                                    [lw.gate_up for lw in lws])
            partials = self.per_rank(lambda r, n: r.mlp_partial(layer, n), normed)
        return reduce_norm(x, partials, collective, [r.w.final_norm for r in ranks], eps, [r.w.head for r in ranks])[1]

    # ---------------------------------------------------------------- byte counts for the limit
    def weight_bytes_per_pass(self) -> int:
        return sum(r.w.weight_bytes() for r in self.ranks)

    def embedding_bytes(self, rows: int) -> int:
        # Each rank gathers one row per token (its own or its zero row).
        return TP_RANKS * rows * self.g.hidden * self.ranks[0].w.embed.element_size()

    def kv_bytes_per_pass(self, batch: int) -> int:
        """Attention reads every slot of K and V (masked ones too) for each layer and rank."""
        g = self.g
        per = 2 * g.rank_kv_heads * self.cache_len * g.head_dim * self.ranks[0].kv[0].element_size()
        return TP_RANKS * g.layers * batch * per

    def fingerprint(self) -> str:
        """Identifies the arithmetic: geometry, dtype, weights, backend, cache length."""
        desc = {
            "geometry": self.g.as_dict(),
            "dtype": self.settings.dtype,
            "weights": self.weights_fingerprint,
            "backend": self.backend.name,
            "attention": self.settings.attention,
            **({"gemm": self.settings.gemm} if self.settings.gemm != "cublas" else {}),
            # fuse changes exl3-decode's arithmetic only: the exl3 backend's digests stay as they were.
            **({"exl3": attrs.asdict(self.settings.exl3, filter=lambda a, v: a.name != "build_dir" and (
                a.name != "fuse" or self.backend.name == "exl3-decode"))}
               if self.backend.quantized else {}),
            "head_chunks": self.ranks[0].vocab_chunks,
            "cache_len": self.cache_len,
            "query_block": QUERY_BLOCK,
        }
        return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()
