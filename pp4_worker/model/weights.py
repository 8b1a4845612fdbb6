"""The weights of the tensor-parallel-2 draft model: logical tensors, their sources and each rank's shard.

Logical (unsharded) tensors use Llama names and layouts (``--weights DIR`` reads
exactly these from safetensors; docs/worker.md lists them).  Each rank holds:

* ``qkv``     [(hq + 2*hkv) * D, H]  its query heads, then its K heads, then its V heads (fused)
* ``o``       [H, hq * D]            the input columns of its heads (row-parallel), in
                                     (group member, KV head) order -- see shard_weights
* ``gate_up`` [2 * m, H]             its gate channels, then its up channels (fused)
* ``down``    [H, m]                 the input columns of its channels (row-parallel)
* ``head``    [vs, H]                its vocabulary rows; ``embed`` likewise plus one zero row
* norms                              replicated, as each GPU of a real pair would hold them
"""
from __future__ import annotations

import math
import os

import attrs
import torch

from pp4_worker.model import hashing, safetensors_dir, sampling
from pp4_worker.model.config import Geometry

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
