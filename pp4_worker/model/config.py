"""Geometry, cells and settings shared by every worker module (no torch import here)."""
from __future__ import annotations

import attrs

# A call receives a query block of this many positions per request: the tokens the
# target accepted since the previous draft call (accepted + bonus), written into the
# draft's KV cache before it proposes.  Fixed so that every cell has static shapes.
QUERY_BLOCK = 5
DEPTHS = (4, 5)
MAX_BATCH = 4
BACKENDS = ("torch", "triton", "exl3", "exl3-decode")
QUANTIZED_BACKENDS = ("exl3", "exl3-decode")  # EXL3-quantized linears: upstream's kernels, pp4's decode GEMM  # kernel sets: pp4_worker/model/backends.py
# Each backend's attention and GEMM when none is named.  The command line, ModelSettings and
# make_backend all read these, so a worker built from code runs what the command line runs.
DEFAULT_ATTENTION = {"torch": "gemm", "triton": "fused", "exl3": "fused", "exl3-decode": "fused"}
DEFAULT_GEMM = {"torch": "cublas", "triton": "triton", "exl3": "cublas", "exl3-decode": "cublas"}
BATCH_SIZES = (1, 2, 3, 4)
TP_RANKS = 2

GREEDY = "greedy"  # every row T0: argmax
SAMPLED = "sampled"  # every row T1: Gumbel-max sample
SWITCH = "switch"  # per-row T0/T1 mask input tensor
MODES = (GREEDY, SAMPLED, SWITCH)

DTYPES = ("float16", "bfloat16")


@attrs.frozen
class Geometry:
    """Logical (unsharded) shape of the draft model; each of the 2 ranks holds half."""

    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    mlp: int = 14336
    vocab: int = 128256
    layers: int = 1
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    # Multiplies the head's 1/sqrt(fan_in) scale so that synthetic logits have a spread
    # like a trained draft's (a few dominant tokens) instead of a near-uniform softmax.
    head_gain: float = 8.0

    def problems(self) -> list[str]:
        """Everything that makes this geometry unusable for a TP2 split (empty if fine)."""
        out = []
        for name in ("hidden", "heads", "kv_heads", "head_dim", "mlp", "vocab"):
            if getattr(self, name) <= 0:
                out.append(f"{name} must be positive, got {getattr(self, name)}")
        if out:
            return out
        if not 1 <= self.layers <= 5:
            out.append(f"layers must be between 1 and 5, got {self.layers}")
        if self.heads % self.kv_heads:
            out.append(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        for name in ("heads", "kv_heads", "mlp", "vocab"):
            if getattr(self, name) % TP_RANKS:
                out.append(f"{name} ({getattr(self, name)}) must split evenly over {TP_RANKS} ranks")
        if self.head_dim % 2:
            out.append(f"head_dim ({self.head_dim}) must be even for rotary embedding")
        return out

    # Per-rank shapes: rank r holds query heads [r*hq, (r+1)*hq), the matching KV heads,
    # MLP channels [r*m, (r+1)*m) and vocabulary rows [r*vs, (r+1)*vs).
    @property
    def rank_heads(self) -> int:
        return self.heads // TP_RANKS

    @property
    def rank_kv_heads(self) -> int:
        return self.kv_heads // TP_RANKS

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def rank_mlp(self) -> int:
        return self.mlp // TP_RANKS

    @property
    def rank_vocab(self) -> int:
        return self.vocab // TP_RANKS

    @property
    def rank_qkv_rows(self) -> int:
        return (self.rank_heads + 2 * self.rank_kv_heads) * self.head_dim

    def as_dict(self) -> dict:
        return attrs.asdict(self)


DEFAULT_GEOMETRY = Geometry()
# The CPU test geometry from the brief: small enough that an eager call takes milliseconds.
TINY_GEOMETRY = Geometry(hidden=256, heads=4, kv_heads=2, head_dim=64, mlp=512, vocab=1000)


@attrs.frozen(order=True)
class CellKey:
    """One CUDA graph: batch size x output depth x sampling mode."""

    batch: int
    depth: int
    mode: str

    @property
    def name(self) -> str:
        return f"B{self.batch}-D{self.depth}-{self.mode}"

    @classmethod
    def parse(cls, name: str) -> "CellKey":
        b, d, mode = name.split("-", 2)
        return cls(int(b[1:]), int(d[1:]), mode)


def cache_length(context: int, max_depth: int = max(DEPTHS)) -> int:
    """KV slots per request: context + query block + fed-back drafts, rounded to 64.

    Rounding keeps K/V blocks and mask rows aligned for the GEMMs (and 16-element
    aligned, which torch's memory-efficient attention needs to read a mask in place).
    """
    need = context + QUERY_BLOCK + max_depth - 1
    return -(-need // 64) * 64


EXL3_BITS = range(2, 9)  # exl3_gemm takes 1..8 bits per weight; 1 bit is no draft anyone runs


@attrs.frozen
class Exl3Options:
    """--backend exl3: which pp4-built module runs it, and the synthetic weights' bit widths."""

    build_dir: str = "build"
    target: str = "exl3"  # or "exl3-facc"
    bits: int = 4  # every linear but the head: 4 bits takes EXL3's GEMV path for a few rows
    head_bits: int = 6  # exllamav3's own default for the output head
    # The synthetic trellis's codebook: "mul1" is what exllamav3 1.6.5's conversion writes by default.
    codebook: str = "mul1"
    # How exl3_gemm's cooperative GEMM picks its kernel shape: "heuristic" (by the sizes; the same
    # in every process) or "autotune" (exllamav3's default: by timing candidates on first use).
    select: str = "heuristic"
    # exl3-decode: the norms and silu*mul fused with the input transforms of the linears after them
    # (other roundings' order in the norm, so other digests than unfused).
    fuse: bool = True


@attrs.frozen
class ModelSettings:
    """What fixes the model's arithmetic: geometry, dtype, weights, backend, KV capacity."""

    geometry: Geometry
    dtype: str = "float16"
    context: int = 1024
    weight_seed: int = 0x5EED_D4AF7
    weights_dir: str | None = None
    backend: str = "torch"
    # Gumbel noise is computed on a second CUDA stream so its many small launches
    # overlap the first pass's weight reads; it joins before the first head.
    overlap_noise: bool = True
    # "gemm": attention as two batched GEMMs around an fp32 softmax (fast for a few query
    # rows); "sdpa": torch's fused kernel, for A/B comparison; "fused": split-KV Triton
    # kernels (triton and exl3).  None: the backend's DEFAULT_ATTENTION.
    attention: str | None = None
    # Chunks each vocabulary shard's row is reduced in (None: automatic; 1: one block per row).
    head_chunks: int | None = None
    # "cublas": every linear through torch.mm; "triton" (triton backend only): the smaller
    # matrices through a skinny-GEMM Triton kernel (pp4_worker/model/backends.py says which).
    # None: the backend's DEFAULT_GEMM.
    gemm: str | None = None
    exl3: Exl3Options | None = None
    # Programmatic dependent launch of the Triton kernels (triton and exl3 backends).  It moves
    # launches earlier and changes no arithmetic, so it is not part of the fingerprint: the
    # same reference digests hold with it on and off.
    pdl: bool = False
    # Each rank's share of a step (its attention, its MLP, its head) on a CUDA stream of its own,
    # joined where the ranks' partials meet, as two GPUs would run them side by side; the
    # kernels and their inputs are the same, so the bits are too: not in the fingerprint either.
    rank_streams: bool = False

    def __attrs_post_init__(self) -> None:
        # Settings always hold concrete choices: the fingerprint names what runs.
        if self.attention is None:
            object.__setattr__(self, "attention", DEFAULT_ATTENTION.get(self.backend, "gemm"))
        if self.gemm is None:
            object.__setattr__(self, "gemm", DEFAULT_GEMM.get(self.backend, "cublas"))

    @property
    def cache_len(self) -> int:
        return cache_length(self.context)
