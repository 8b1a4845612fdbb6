"""``--weights DIR`` for the EXL3 backends: a checkpoint as exllamav3 1.6.5's conversion writes it.

The directory holds exllamav3's config.json (a Llama-architecture model with its
``quantization_config``) and safetensors with, for every quantized linear KEY (the Hugging Face
name without ``.weight``): ``KEY.trellis`` int16 [K/16, N/16, 16*bits], the input signs
``KEY.suh`` fp16 [K] (or packed ``KEY.su``), the output signs and scales ``KEY.svh`` fp16 [N] (or
``KEY.sv``), and a marker ``KEY.mcg`` or ``KEY.mul1`` naming the codebook (none: 3inst).
Embedding and norms stay 16-bit.

Each rank's share is cut from the quantized tensors themselves, the way the worker's ranks need it:
column-parallel linears (q, k, v, gate, up, the head) on whole 16-column tiles and ``svh``,
row-parallel ones (o, down) on whole 16-row tiles and ``suh``. Every cut falls on a multiple of 128,
EXL3's Hadamard block, so the ranks' partial products add up to the whole one. q, k and v (and gate
and up) become one fused linear whose parts keep their own input signs (pp4's GEMM transforms the
input once per part; upstream's kernel runs each part on its own).
"""
from __future__ import annotations

import json
import os

import torch

from pp4_worker.model import safetensors_dir
from pp4_worker.model.config import TP_RANKS, Geometry
from pp4_worker.model.exl3 import HADAMARD, TILE, Exl3Group, Exl3Linear

CODEBOOKS = {"3inst": 0, "mcg": 1, "mul1": 2}


class CheckpointError(ValueError):
    """The directory is not an EXL3 checkpoint the worker can run; the message says why."""


def is_exl3_checkpoint(directory: str) -> bool:
    config = os.path.join(directory, "config.json")
    if not os.path.isfile(config):
        return False
    with open(config) as f:
        q = json.load(f).get("quantization_config") or {}
    return q.get("quant_method") == "exl3"


def read_geometry(directory: str) -> Geometry:
    """The model's shape from its config.json (Llama field names)."""
    path = os.path.join(directory, "config.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"--weights {directory}: no config.json there (an EXL3 checkpoint has one)") from None
    archs = cfg.get("architectures") or []
    if archs and archs[0] not in ("LlamaForCausalLM", "MistralForCausalLM"):
        raise CheckpointError(f"--weights {directory}: architecture {archs[0]}; the worker runs Llama-shaped "
                              "models (LlamaForCausalLM)")
    if cfg.get("rope_scaling"):
        raise CheckpointError(f"--weights {directory}: rope_scaling {cfg['rope_scaling']} is not supported "
                              "(the worker's rope is plain NEOX rotary)")
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        rope = cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        return Geometry(hidden=hidden, heads=heads, kv_heads=int(cfg.get("num_key_value_heads", heads)),
                        head_dim=int(cfg.get("head_dim") or hidden // heads), mlp=int(cfg["intermediate_size"]),
                        vocab=int(cfg["vocab_size"]), layers=int(cfg["num_hidden_layers"]),
                        rope_theta=float(rope), norm_eps=float(cfg["rms_norm_eps"]))
    except KeyError as exc:
        raise CheckpointError(f"--weights {directory}: config.json lacks {exc.args[0]}") from None


class Exl3Checkpoint:
    """The safetensors of one checkpoint, read lazily by tensor name."""

    def __init__(self, directory: str):
        files, self.where, digest = safetensors_dir.open_folder(directory)
        if not files:
            raise CheckpointError(f"--weights {directory}: no .safetensors files there")
        self.directory = directory
        self.fingerprint = "exl3-checkpoint:" + digest

    def has(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str) -> torch.Tensor:
        if name not in self.where:
            raise CheckpointError(f"--weights {self.directory}: tensor {name} is missing")
        return self.where[name].get_tensor(name)

    def linear(self, key: str) -> "QuantizedTensor":
        if not self.has(key + ".trellis"):
            what = "is stored unquantized" if self.has(key + ".weight") else "is missing"
            raise CheckpointError(f"--weights {self.directory}: {key} {what}; the EXL3 backends need every "
                                  "linear quantized (convert with exllamav3 at 2 to 8 bits)")
        if self.has(key + ".bias"):
            raise CheckpointError(f"--weights {self.directory}: {key} has a bias; Llama linears have none")
        trellis = self.get(key + ".trellis")
        if trellis.dtype != torch.int16 or trellis.dim() != 3 or trellis.shape[2] % 16:
            raise CheckpointError(f"--weights {self.directory}: {key}.trellis is {trellis.dtype} "
                                  f"{list(trellis.shape)}; integer bitrates 2 to 8 are supported "
                                  "(half-integer ones: run them through exllamav3 itself)")
        suh = self.get(key + ".suh") if self.has(key + ".suh") else unpack_signs(self.get(key + ".su"))
        svh = self.get(key + ".svh") if self.has(key + ".svh") else unpack_signs(self.get(key + ".sv"))
        codebook = "mcg" if self.has(key + ".mcg") else "mul1" if self.has(key + ".mul1") else "3inst"
        bits = trellis.shape[2] // 16
        if not 2 <= bits <= 8:
            raise CheckpointError(f"--weights {self.directory}: {key} has {bits} bits; 2 to 8 are supported")
        return QuantizedTensor(key, trellis, suh.to(torch.float16), svh.to(torch.float16), bits, CODEBOOKS[codebook])


def unpack_signs(packed: torch.Tensor) -> torch.Tensor:
    """exllamav3's packed signs (bit i of each 16-bit word, lowest first; set: -1) as fp16 +-1."""
    words = packed.view(torch.int16).to(torch.int32) & 0xFFFF
    bits = (words[:, None] >> torch.arange(16, dtype=torch.int32)[None, :]) & 1
    return (1 - 2 * bits).flatten().to(torch.float16)


class QuantizedTensor:
    """One whole quantized linear (y = x @ W, W [K, N]) before it is cut for the ranks."""

    def __init__(self, key, trellis, suh, svh, bits, codebook):
        self.key, self.trellis, self.suh, self.svh, self.bits, self.codebook = key, trellis, suh, svh, bits, codebook

    @property
    def in_features(self) -> int:
        return self.trellis.shape[0] * TILE

    @property
    def out_features(self) -> int:
        return self.trellis.shape[1] * TILE

    def columns(self, cols: slice) -> "QuantizedTensor":
        _check_cut(self.key, cols)
        return QuantizedTensor(self.key, self.trellis[:, cols.start // TILE : cols.stop // TILE], self.suh,
                               self.svh[cols], self.bits, self.codebook)

    def rows(self, rows: slice) -> "QuantizedTensor":
        _check_cut(self.key, rows)
        return QuantizedTensor(self.key, self.trellis[rows.start // TILE : rows.stop // TILE], self.suh[rows],
                               self.svh, self.bits, self.codebook)


def _check_cut(key: str, cut: slice) -> None:
    if cut.start % HADAMARD or cut.stop % HADAMARD:
        raise CheckpointError(f"{key}: a rank's share [{cut.start}, {cut.stop}) does not fall on multiples of "
                              f"{HADAMARD} (EXL3's Hadamard block); use a model whose TP2 shards do")


def fuse(parts: list[QuantizedTensor], device) -> Exl3Linear | Exl3Group:
    """Parts that share an input, concatenated on N, where they share a bit width and codebook
    (parts with equal input signs then share one transform); else run one after another."""
    first = parts[0]
    if any((p.bits, p.codebook) != (first.bits, first.codebook) for p in parts[1:]):
        return Exl3Group(tuple(fuse([p], device) for p in parts))
    trellis = torch.cat([p.trellis for p in parts], dim=1)
    svh = torch.cat([p.svh for p in parts])
    if all(torch.equal(p.suh, first.suh) for p in parts[1:]):
        suh, columns = first.suh, ()
    else:
        suh, columns = torch.stack([p.suh for p in parts]), tuple(p.out_features for p in parts)
    return Exl3Linear(trellis.contiguous().to(device), suh.contiguous().to(device), svh.contiguous().to(device),
                      first.bits, codebook=first.codebook, part_columns=columns)


def single(t: QuantizedTensor, device) -> Exl3Linear:
    return fuse([t], device)


def shard_checkpoint(ckpt: Exl3Checkpoint, g: Geometry, rank: int, dtype, device):
    """Rank ``rank``'s RankWeights from the checkpoint (16-bit tensors in ``dtype``)."""
    from pp4_worker.model.weights import LayerShard, RankWeights, vocab_shard

    hq, hkv, d, m, vs, H = g.rank_heads, g.rank_kv_heads, g.head_dim, g.rank_mlp, g.rank_vocab, g.hidden

    def rows(n: int) -> slice:
        return slice(rank * n, (rank + 1) * n)

    def vector(name: str) -> torch.Tensor:
        return ckpt.get(name).to(device=device, dtype=dtype).contiguous()

    layers = []
    for i in range(g.layers):
        p = f"model.layers.{i}."
        qkv = fuse([ckpt.linear(p + "self_attn.q_proj").columns(rows(hq * d)),
                    ckpt.linear(p + "self_attn.k_proj").columns(rows(hkv * d)),
                    ckpt.linear(p + "self_attn.v_proj").columns(rows(hkv * d))], device)
        gate_up = fuse([ckpt.linear(p + "mlp.gate_proj").columns(rows(m)),
                        ckpt.linear(p + "mlp.up_proj").columns(rows(m))], device)
        layers.append(LayerShard(
            attn_norm=vector(p + "input_layernorm.weight"),
            qkv=qkv,
            o=single(ckpt.linear(p + "self_attn.o_proj").rows(rows(hq * d)), device),
            mlp_norm=vector(p + "post_attention_layernorm.weight"),
            gate_up=gate_up,
            down=single(ckpt.linear(p + "mlp.down_proj").rows(rows(m)), device),
        ))
    embed_all = ckpt.get("model.embed_tokens.weight")
    if tuple(embed_all.shape) != (g.vocab, H):
        raise CheckpointError(f"model.embed_tokens.weight is {list(embed_all.shape)}, config.json says "
                              f"[{g.vocab}, {H}]")
    return RankWeights(
        rank=rank,
        layers=layers,
        final_norm=vector("model.norm.weight"),
        head=single(ckpt.linear("lm_head").columns(rows(vs)), device),
        **vocab_shard(g, rank, embed_all[rows(vs)], dtype, device),
        o_input="heads",
    )


def load(directory: str, g: Geometry, dtype, device) -> tuple[list, str]:
    """Both ranks' weights and the checkpoint's fingerprint."""
    if not is_exl3_checkpoint(directory):
        raise CheckpointError(f"--weights {directory}: not an EXL3 checkpoint (config.json has no "
                              "quantization_config with quant_method exl3); the EXL3 backends read those")
    ckpt = Exl3Checkpoint(directory)
    return [shard_checkpoint(ckpt, g, r, dtype, device) for r in range(TP_RANKS)], ckpt.fingerprint
