"""Weights, ranks and the layer math of the tensor-parallel-2 draft model.

Logical (unsharded) tensors use Llama names and layouts (``--weights DIR`` reads
exactly these from safetensors; docs/worker.md lists them).  Each rank holds:

* ``qkv``     [(hq + 2*hkv) * D, H]  its query heads, then its K heads, then its V heads (fused)
* ``o``       [H, hq * D]            the input columns of its heads (row-parallel), in
                                     (group member, KV head) order -- see shard_weights
* ``gate_up`` [2 * m, H]             its gate channels, then its up channels (fused)
* ``down``    [H, m]                 the input columns of its channels (row-parallel)
* ``head``    [vs, H]                its vocabulary rows; ``embed`` likewise plus one zero row
* norms                              replicated, as each GPU of a real pair would hold them

Rank outputs that a real pair would all-reduce are summed by ``ColocatedSum`` in one
fixed order (rank0 + rank1).  Ranks only ever touch their own tensors and talk through
the collective and ShardStats, so a two-GPU NCCL version can reuse RankShard as is.
"""
from __future__ import annotations

import hashlib
import json
import math
import os

import attrs
import torch

from pp4.worker.model import exl3, exl3_checkpoint, hashing, safetensors_dir, sampling
from pp4.worker.model.backends import TorchBackend, make_backend
from pp4.worker.model.config import DEPTHS, MAX_BATCH, QUERY_BLOCK, TP_RANKS, Geometry, ModelSettings

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


# ============================================================================ logical tensors
def logical_tensor_specs(g: Geometry) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, kind); kind decides the synthetic scale (see SyntheticSource)."""
    specs: dict[str, tuple[tuple[int, ...], str]] = {"embed.weight": ((g.vocab, g.hidden), "embed")}
    for i in range(g.layers):
        p = f"layers.{i}."
        specs[p + "attn_norm.weight"] = ((g.hidden,), "norm")
        specs[p + "attn.q.weight"] = ((g.heads * g.head_dim, g.hidden), "matrix")
        specs[p + "attn.k.weight"] = ((g.kv_heads * g.head_dim, g.hidden), "matrix")
        specs[p + "attn.v.weight"] = ((g.kv_heads * g.head_dim, g.hidden), "matrix")
        specs[p + "attn.o.weight"] = ((g.hidden, g.heads * g.head_dim), "matrix")
        specs[p + "mlp_norm.weight"] = ((g.hidden,), "norm")
        specs[p + "mlp.gate.weight"] = ((g.mlp, g.hidden), "matrix")
        specs[p + "mlp.up.weight"] = ((g.mlp, g.hidden), "matrix")
        specs[p + "mlp.down.weight"] = ((g.hidden, g.mlp), "matrix")
    specs["final_norm.weight"] = ((g.hidden,), "norm")
    specs["head.weight"] = ((g.vocab, g.hidden), "head")
    return specs


class SyntheticSource:
    """Reproducible weights from a counter hash of (seed, tensor name, element index).

    Element i of a logical tensor is the same whichever rank, chunk or device asks
    for it: u = hash(seed, crc32(name), i) mapped to [-1, 1), then scaled --
    matrices by 1/sqrt(fan_in), the head additionally by ``head_gain``, the
    embedding not at all, norms as 1 + u/10.
    """

    CHUNK_ELEMENTS = 1 << 24  # bounds the int64 temporaries of one generation step

    def __init__(self, g: Geometry, seed: int, dtype: torch.dtype, device: torch.device):
        self.g, self.seed, self.dtype, self.device = g, seed, dtype, device
        self.specs = logical_tensor_specs(g)

    def fingerprint(self) -> str:
        return f"synthetic:seed={self.seed}"

    def _scale(self, name: str, shape: tuple[int, ...]) -> tuple[float, float]:
        kind = self.specs[name][1]
        if kind == "norm":
            return 0.1, 1.0
        if kind == "embed":
            return 1.0, 0.0
        fan_in = shape[1]
        gain = self.g.head_gain if kind == "head" else 1.0
        return gain / math.sqrt(fan_in), 0.0

    def block(self, name: str, rows: slice, cols: slice | None = None) -> torch.Tensor:
        shape = self.specs[name][0]
        k1, k2 = hashing.stream_keys(self.seed, hashing.name_id(name), hashing.DOMAIN_WEIGHTS)
        scale, offset = self._scale(name, shape)
        r0, r1 = rows.start, rows.stop
        if len(shape) == 1:
            idx = torch.arange(r0, r1, dtype=torch.int64, device=self.device)
            return self._values(idx, k1, k2, scale, offset)
        n_cols = shape[1]
        c0, c1 = (cols.start, cols.stop) if cols is not None else (0, n_cols)
        if shape[0] * n_cols >= 1 << 32:
            raise ValueError(f"{name}: more than 2**32 elements is beyond the 32-bit element counter")
        out = torch.empty(r1 - r0, c1 - c0, dtype=self.dtype, device=self.device)
        cols_t = torch.arange(c0, c1, dtype=torch.int64, device=self.device)
        step = max(1, self.CHUNK_ELEMENTS // max(1, c1 - c0))
        for a in range(r0, r1, step):
            b = min(r1, a + step)
            rows_t = torch.arange(a, b, dtype=torch.int64, device=self.device)
            idx = rows_t[:, None] * n_cols + cols_t[None, :]
            out[a - r0 : b - r0] = self._values(idx, k1, k2, scale, offset)
        return out

    def _values(self, idx, k1, k2, scale, offset):
        u = hashing.symmetric_unit(hashing.hash_elements(idx, k1, k2), torch)
        return (u * scale + offset).to(self.dtype)


class SafetensorsSource:
    """``--weights DIR``: every *.safetensors file in DIR, logical names as above."""

    def __init__(self, directory: str, g: Geometry, dtype: torch.dtype, device: torch.device):
        self.g, self.dtype, self.device = g, dtype, device
        self.specs = logical_tensor_specs(g)
        try:
            files, self.where, digest = safetensors_dir.open_folder(directory)
        except ImportError as exc:
            raise RuntimeError(
                "--weights needs the safetensors package (pip install safetensors); "
                "without it use the synthetic weights (--weight-seed)"
            ) from exc
        if not files:
            raise RuntimeError(f"--weights {directory}: no .safetensors files there")
        self._fingerprint = "safetensors:" + digest
        problems = []
        for name, (shape, _) in self.specs.items():
            if name not in self.where:
                problems.append(f"missing {name}")
                continue
            got = tuple(self.where[name].get_slice(name).get_shape())
            if got != shape:
                problems.append(f"{name} has shape {list(got)}, the geometry needs {list(shape)}")
        if problems:
            raise RuntimeError(f"--weights {directory} does not match the geometry: " + "; ".join(problems))

    def fingerprint(self) -> str:
        return self._fingerprint

    def block(self, name: str, rows: slice, cols: slice | None = None) -> torch.Tensor:
        sl = self.where[name].get_slice(name)
        t = sl[rows] if cols is None else sl[rows, cols]
        return t.to(device=self.device, dtype=self.dtype).contiguous()


def export_safetensors(source: SyntheticSource, directory: str) -> str:
    """Write the logical tensors of ``source`` as one safetensors file (tests, --export-weights)."""
    try:
        from safetensors.torch import save_file
    except ImportError as exc:
        raise RuntimeError("--export-weights needs the safetensors package (pip install safetensors)") from exc
    os.makedirs(directory, exist_ok=True)
    tensors = {}
    for name, (shape, _) in source.specs.items():
        tensors[name] = source.block(name, slice(0, shape[0])).cpu().contiguous()
    path = os.path.join(directory, "draft.safetensors")
    save_file(tensors, path)
    return path


# ============================================================================ rank weights
@attrs.define
class LayerShard:
    """Linears are 16-bit [out, in] tensors, or Exl3Linear with --backend exl3."""

    attn_norm: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    mlp_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@attrs.define
class RankWeights:
    rank: int
    layers: list[LayerShard]
    final_norm: torch.Tensor
    head: torch.Tensor  # [vs, H]
    embed: torch.Tensor  # [vs + 1, H]; the last row is zero, the target of ids the other rank owns
    vocab_to_local: torch.Tensor  # [V] int64: global id -> row of ``embed``
    gumbel_premix: torch.Tensor  # [vs] int64: vocab half of the Gumbel hash for this rank's ids
    head_fp32_cpu: torch.Tensor | None = None  # CPU tests only: torch has no fp32-output fp16 mm there
    # o's input columns: "folded", in the (group member, KV head) order attention writes (the weights
    # are stored that way), or "heads", in query-head order (a checkpoint's, which cannot be permuted
    # once quantized: attention's output is reordered instead).
    o_input: str = "folded"

    def weight_bytes(self) -> int:
        """Bytes one pass must read (embedding rows aside, counted per call)."""
        n = self.final_norm.nbytes + self.head.nbytes  # linears may be tensors or Exl3Linear
        for l in self.layers:
            n += sum(t.nbytes for t in (l.attn_norm, l.qkv, l.o, l.mlp_norm, l.gate_up, l.down))
        return n


def shard_weights(source, g: Geometry, rank: int, dtype, device) -> RankWeights:
    hq, hkv, d, m, vs = g.rank_heads, g.rank_kv_heads, g.head_dim, g.rank_mlp, g.rank_vocab
    H = g.hidden

    def rows(a: int, n: int) -> slice:
        return slice(a * n, (a + 1) * n)

    # o's input columns are stored in (group member, KV head) order -- query head
    # kv*group + member -- the order attention_partial lays its output out in.
    o_order = torch.tensor([(kv * g.group + member) * d + j for member in range(g.group)
                            for kv in range(hkv) for j in range(d)], dtype=torch.int64, device=device)
    layers = []
    for i in range(g.layers):
        p = f"layers.{i}."
        qkv = torch.empty(g.rank_qkv_rows, H, dtype=dtype, device=device)
        qkv[: hq * d] = source.block(p + "attn.q.weight", rows(rank, hq * d))
        qkv[hq * d : (hq + hkv) * d] = source.block(p + "attn.k.weight", rows(rank, hkv * d))
        qkv[(hq + hkv) * d :] = source.block(p + "attn.v.weight", rows(rank, hkv * d))
        gate_up = torch.empty(2 * m, H, dtype=dtype, device=device)
        gate_up[:m] = source.block(p + "mlp.gate.weight", rows(rank, m))
        gate_up[m:] = source.block(p + "mlp.up.weight", rows(rank, m))
        layers.append(
            LayerShard(
                attn_norm=source.block(p + "attn_norm.weight", slice(0, H)),
                qkv=qkv,
                o=source.block(p + "attn.o.weight", slice(0, H), rows(rank, hq * d))[:, o_order].contiguous(),
                mlp_norm=source.block(p + "mlp_norm.weight", slice(0, H)),
                gate_up=gate_up,
                down=source.block(p + "mlp.down.weight", slice(0, H), rows(rank, m)).contiguous(),
            )
        )
    head = source.block("head.weight", rows(rank, vs))
    return RankWeights(
        rank=rank,
        layers=layers,
        final_norm=source.block("final_norm.weight", slice(0, H)),
        head=head,
        **vocab_shard(g, rank, source.block("embed.weight", rows(rank, vs)), dtype, device),
        head_fp32_cpu=head.float() if device.type == "cpu" else None,
    )


def vocab_shard(g: Geometry, rank: int, embed_rows: torch.Tensor, dtype, device) -> dict:
    """A rank's vocabulary tables (RankWeights fields) from its embedding rows [vs, H]: the
    embedding with one zero row after them, the global-id -> row map (ids of the other rank go to
    the zero row), and the vocabulary half of the Gumbel hash for its ids."""
    vs = g.rank_vocab
    embed = torch.zeros(vs + 1, g.hidden, dtype=dtype, device=device)
    embed[:vs] = embed_rows.to(device=device, dtype=dtype)
    ids = torch.arange(g.vocab, dtype=torch.int64, device=device)
    local = ids - rank * vs
    vocab_to_local = torch.where((local >= 0) & (local < vs), local, torch.full_like(local, vs))
    return {"embed": embed, "vocab_to_local": vocab_to_local,
            "gumbel_premix": sampling.vocab_premix(ids[rank * vs : (rank + 1) * vs])}


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
        """n: the residual stream after this layer's attention norm."""
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
        """n: the residual stream after this layer's MLP norm."""
        be, lw = self.backend, self.w.layers[layer]
        act = be.silu_mul(be.linear(n, lw.gate_up), self.g.rank_mlp)
        return be.linear(act, lw.down)

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
        (backend.residual_norm: one kernel per rank where the backend fuses them).
        """
        ranks, collective, eps = self.ranks, self.collective, self.g.norm_eps
        reduce_norm = self.backend.residual_norm
        x, partials = None, [r.embed_partial(tokens) for r in ranks]
        for layer in range(self.g.layers):
            x, normed = reduce_norm(x, partials, collective, [r.w.layers[layer].attn_norm for r in ranks], eps)
            partials = [r.attention_partial(layer, n, step) for r, n in zip(ranks, normed)]
            x, normed = reduce_norm(x, partials, collective, [r.w.layers[layer].mlp_norm for r in ranks], eps)
            partials = [r.mlp_partial(layer, n) for r, n in zip(ranks, normed)]
        return reduce_norm(x, partials, collective, [r.w.final_norm for r in ranks], eps)[1]

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
            **({"exl3": attrs.asdict(self.settings.exl3, filter=lambda a, v: a.name != "build_dir")}
               if self.backend.quantized else {}),
            "head_chunks": self.ranks[0].vocab_chunks,
            "cache_len": self.cache_len,
            "query_block": QUERY_BLOCK,
        }
        return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()
