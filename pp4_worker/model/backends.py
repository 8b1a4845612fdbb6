"""Kernel backends: the handful of primitives one rank's layer is built from.

The model code calls only these methods, so another kernel set (EXL3's rms norm,
rope and quantized linears from a pp4-built ``exllamav3_ext``) can replace the
plain-torch one without touching ranks, graphs, the gate or timing.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from pp4_worker.kernels import skinny_gemm
from pp4_worker.kernels.skinny_gemm import SkinnyGemm
from pp4_worker.model import sampling
from pp4_worker.model.config import DEFAULT_ATTENTION, DEFAULT_GEMM, GREEDY, SAMPLED, SWITCH

EXL3_NEEDS_CUDA = "--backend exl3 runs EXL3's CUDA kernels: it needs --device cuda"


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here; the message says what to do."""


def unfused_residual_norm(backend, x, partials, collective, norm_weights, eps: float):
    """(x + all_reduce(partials), [that through each rank's norm weight]) in separate steps, the
    norm being ``backend.rms_norm``; x None: the all-reduce alone.  The ranks' residual streams
    are identical, so one copy is kept."""
    total = collective.all_reduce(partials)
    x = total if x is None else x + total
    return x, [backend.rms_norm(x, w, eps) for w in norm_weights]


class TorchBackend:
    """Plain torch: cuBLAS GEMMs (fp32 output where it matters), torch's fused rms_norm and softmax."""

    name = "torch"

    ATTENTION = ("gemm", "sdpa")
    # Whether a call needs its rotary factors gathered and its attention masks built up front.
    reads_position_tables = True
    # Whether a step needs each row's first position as a packed int32 [B] (EXL3's rope).
    reads_start_positions = False
    # Whether the linears are EXL3-quantized (pp4_worker/model/exl3.py) rather than 16-bit matrices.
    quantized = False
    # Whether two ranks' steps may run at once on two streams (--rank-streams): nothing a kernel
    # keeps between launches is shared by the ranks.
    ranks_may_overlap = True

    def __init__(self, device: torch.device, attention: str = DEFAULT_ATTENTION["torch"]):
        if attention not in self.ATTENTION:
            raise BackendUnavailable(f"--backend {self.name} has no attention {attention!r} "
                                     f"(choose {', '.join(self.ATTENTION)})")
        self.device = device
        self.is_cuda = device.type == "cuda"
        self.attention_kind = attention
        if self.is_cuda:
            self._check_fp32_out_mm()
            # Split-K partial sums in fp32, not fp16/bf16: accuracy over a few percent of speed.
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False

    def prepare(self, g) -> None:
        """Constants that depend on the geometry (none here)."""

    def kernels(self) -> dict[str, str]:
        """Which kernels run each step, for the report."""
        return {"linears": "cuBLAS (torch.mm; the head with fp32 output)", "rms norm": "torch",
                "rope": "torch", "attention": f"torch ({self.attention_kind})", "other steps": "torch"}

    def _check_fp32_out_mm(self) -> None:
        a = torch.zeros(2, 8, dtype=torch.float16, device=self.device)
        try:
            torch.mm(a, a.t(), out_dtype=torch.float32)
        except (TypeError, RuntimeError) as exc:  # torch older than the out_dtype overload
            raise BackendUnavailable(
                "the torch backend needs torch.mm(..., out_dtype=torch.float32) on CUDA "
                f"(an fp32 head without upcasting the weights); this torch {torch.__version__} lacks it: {exc}"
            ) from exc

    def rms_norm(self, x, weight, eps: float):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    def linear(self, x, weight):
        """x @ weight.T in the weight dtype (fp32 accumulation inside cuBLAS)."""
        return torch.mm(x, weight.t())

    def linear_fp32(self, x, weight, cpu_weight_fp32=None):
        """x @ weight.T with fp32 output from fp16/bf16 operands: the head's one matmul.

        On CUDA this is a single cuBLAS call reading the 16-bit weights; on the CPU
        (tests only) torch has no fp32-output 16-bit matmul, so it upcasts.
        """
        if self.is_cuda:
            return torch.mm(x, weight.t(), out_dtype=torch.float32)
        w = cpu_weight_fp32 if cpu_weight_fp32 is not None else weight.float()
        return torch.mm(x.float(), w.t())

    def rope_(self, qk, cos, sin_signed) -> None:
        """Rotary embedding in place, rotate-half convention.

        qk [B, T, heads, D]; cos = [cos, cos], sin_signed = [-sin, sin], each
        [B, T, 1, D] in the model dtype (as HF Llama applies it; mixed fp16/fp32
        operands would take torch's slow non-vectorised path):
        out = x*cos + swap_halves(x)*sin_signed.  Three kernels.
        """
        d = qk.shape[-1]
        swapped = qk.unflatten(-1, (2, d // 2)).flip(-2).flatten(-2)
        qk.mul_(cos)
        qk.addcmul_(swapped, sin_signed)

    def attention(self, q, k, v, mask, scale: float):
        """q [B, kvh, L, D] (query heads folded into L), k/v [B, kvh, S, D], mask [B, 1, L, S]
        additive fp32 -> [B, kvh, L, D].

        Two cuBLAS batched GEMMs around an fp32 softmax.  torch's fused attention
        kernels tile over queries, so with L <= 20 they put only B*kvh blocks on the
        whole cache (~50 us on an H200 for 1088 slots); the GEMMs tile over the slots.
        Scores and softmax stay fp32; probabilities enter the second GEMM as 16-bit,
        as they do inside flash/efficient attention.
        """
        if self.attention_kind == "sdpa":
            return self._attention_sdpa(q, k, v, mask, scale)
        B, H, L, D = q.shape
        S = k.shape[2]
        q3, k3, v3 = q.reshape(B * H, L, D), k.reshape(B * H, S, D), v.reshape(B * H, S, D)
        if self.is_cuda:
            scores = torch.bmm(q3, k3.transpose(1, 2), out_dtype=torch.float32)
        else:
            scores = torch.bmm(q3.float(), k3.float().transpose(1, 2))
        scores = torch.add(mask, scores.view(B, H, L, S), alpha=scale)  # mask + scale * q.k
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        return torch.bmm(probs.view(B * H, L, S), v3).view(B, H, L, D)

    def attention_mask_dtype(self, model_dtype):
        """gemm adds the mask to fp32 scores (fused builds it from positions and never reads
        it); torch's SDPA wants it in the query dtype."""
        return model_dtype if self.attention_kind == "sdpa" else torch.float32

    def _attention_sdpa(self, q, k, v, mask, scale: float):
        """torch's fused attention (memory-efficient kernel on CUDA); kept for A/B runs."""
        if self.is_cuda:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    def mlp(self, n, gate_up, down, channels: int):
        """down(silu(gate) * up) of n, the MLP norm's output; a backend may fuse the steps."""
        return self.linear(self.silu_mul(self.linear(n, gate_up), channels), down)

    def last_positions(self, n, B: int, T: int):
        """Each row's last position of n [B*T, H], a norm's output (what the head reads)."""
        return n.view(B, T, -1)[:, -1]

    def silu_mul(self, gate_up, channels: int):
        gate, up = gate_up.split(channels, dim=-1)
        act = F.silu(gate)
        return act.mul_(up)

    # ---------------------------------------------------------------- steps another backend may fuse
    def embed_partial(self, tokens, vocab_to_local, embed, vocab_offset: int):
        """Vocab-parallel embedding: own rows, the zero row for ids the other rank owns."""
        return F.embedding(vocab_to_local[tokens.reshape(-1)], embed)

    def residual_norm(self, x, partials, collective, norm_weights, eps: float, consumers=None):
        """(new residual, each rank's normed input to its linear in ``consumers``, where given)."""
        return unfused_residual_norm(self, x, partials, collective, norm_weights, eps)

    def rope_cache_fold(self, qkv, step, cache, hq: int, hkv: int, group: int):
        """qkv [B, T, hq + 2*hkv, D]: rotate q and k, write K and V of every position into
        ``cache`` [2, batch, hkv, S, D] at step.positions, and return q folded to
        [B, hkv, T*group, D] (the query heads sharing a KV head become query rows)."""
        B, T, _, d = qkv.shape
        self.rope_(qkv[:, :, : hq + hkv], step.cos, step.sin_signed)  # q and k heads are adjacent
        cache[:, step.batch_rows, :, step.positions] = qkv[:, :, hq:].view(B, T, 2, hkv, d)
        return qkv[:, :, :hq].view(B, T, hkv, group, d).permute(0, 2, 1, 3, 4).reshape(B, hkv, T * group, d)

    def unfold_heads(self, att, T: int, group: int):
        """[B, hkv, T*group, D] -> rows (b, t), columns (member, kv head, D): o's column order."""
        B, hkv, _, d = att.shape
        return att.view(B, hkv, T, group, d).permute(0, 2, 3, 1, 4).reshape(B * T, group * hkv * d)

    def attend(self, q, cache, step, scale: float, T: int, group: int):
        """q [B, hkv, T*group, D] against the cache -> [B*T, hq*D] in o's column order."""
        B = q.shape[0]
        return self.unfold_heads(self.attention(q, cache[0, :B], cache[1, :B], step.mask, scale), T, group)

    def gumbel_noise(self, seeds, row_depth, premix, out) -> None:
        """out [D, B, V] <- log(E) for every (depth, row, vocab id of this rank): the noise a
        sampling call makes once (beside pass 0) and shard_stats reads."""
        keys = sampling.row_depth_keys(seeds, row_depth)
        sampling.gumbel_log_exponential(keys, premix, torch, out=out)

    def shard_stats(self, logits, mode: str, noise, t1_mask, vocab_offset: int, chunks: int):
        scores = sampling.selection_scores(logits, mode, noise, t1_mask, torch)
        return sampling.shard_stats(logits, scores, vocab_offset, chunks, torch)

    def merge_choice(self, stats, proposals, confidences, q_payload, depth: int, mode: str, t1_mask, zero):
        """Both ranks' ShardStats -> column ``depth`` of the proposals, confidences and q payload."""
        sampling.merge_shard_stats(stats, proposals[:, depth], confidences[:, depth], torch)
        sampling.write_q_payload(mode, confidences[:, depth], q_payload[:, depth], t1_mask, zero, torch)


class TritonBackend(TorchBackend):
    """cuBLAS GEMMs and attention as in the torch backend; every small step between them
    fused into Triton kernels (pp4_worker/kernels/triton_kernels.py): embedding gather, all-reduce
    + residual add + rms norm, rope + K/V write + query fold, head unfold, silu*mul, and
    the Gumbel noise, the head's per-chunk statistics and cross-rank merge.

    On a CPU it runs only under TRITON_INTERPRET=1 (the tests); numbers differ from the
    torch backend's in the last bits (fp32 inside, one rounding), which is why exactness
    is checked within a backend.
    """

    name = "triton"
    MODES = {GREEDY: 0, SAMPLED: 1, SWITCH: 2}
    # fused: split-KV attention in two Triton kernels, its output written in o's layout;
    # gemm and sdpa: the torch backend's, for A/B runs.
    ATTENTION = ("fused", "gemm", "sdpa")
    ATTENTION_SPLIT = 64  # cache slots per program: 17 splits x B x hkv programs for 1088 slots

    # --gemm triton: matrices up to this size with a long enough K (qkv and down of the default
    # geometry, which cuBLAS runs with a split-K reduce kernel after them) go through
    # pp4_worker/kernels/skinny_gemm.py; gate_up (117 MB) measured even with cuBLAS and stays there.
    # The head (fp32 logits) goes through it at any size: its tiles took 0.82-0.91x cuBLAS's time.
    SKINNY_MAX_BYTES = 64 << 20
    GEMMS = ("cublas", "triton")

    def __init__(self, device: torch.device, attention: str = DEFAULT_ATTENTION["triton"],
                 gemm: str = DEFAULT_GEMM["triton"], pdl: bool = False):
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise BackendUnavailable("--backend triton needs a CUDA device (or TRITON_INTERPRET=1 on a CPU, "
                                     "tests only: the interpreter is very slow)")
        try:
            from pp4_worker.kernels import triton_kernels
        except ImportError as exc:
            raise BackendUnavailable(f"--backend triton needs the triton package ({exc}); "
                                     "pip install triton, or use --backend torch") from exc
        if gemm not in self.GEMMS:
            raise BackendUnavailable(f"unknown --gemm {gemm!r} (choose {' or '.join(self.GEMMS)})")
        if pdl and device.type != "cuda":
            raise BackendUnavailable("--pdl on needs a CUDA device (programmatic dependent launch is a GPU launch attribute)")
        if pdl and not triton_kernels.HAS_PDL:
            raise BackendUnavailable(f"--pdl on needs a Triton with griddepcontrol (3.4 or later); this is {triton_kernels.triton.__version__}")
        self.k = triton_kernels
        self.gemm = gemm
        # Every Triton launch gets these: the kernel's wait-then-release prologue and the launch
        # attribute that lets it start before its predecessor has finished (triton_kernels._pdl_enter).
        self.launch = {"PDL": True, "launch_pdl": True} if pdl else {}
        self.pdl = pdl
        self.skinny = SkinnyGemm(triton_kernels, device, self.launch) if gemm == "triton" else None
        super().__init__(device, attention)
        # rope_cache_fold indexes the table by position; fused attention masks by position.
        self.reads_position_tables = attention != "fused"

    def kernels(self) -> dict[str, str]:
        linears = "cuBLAS (torch.mm)" + (", qkv/down/head skinny_linear_kernel" if self.gemm == "triton" else "")
        attention = "triton (split-KV)" if self.attention_kind == "fused" else f"torch ({self.attention_kind})"
        return {"linears": linears, "rms norm": "triton", "rope": "triton (with the K/V write and q fold)",
                "attention": attention, "other steps": "triton"}

    def linear(self, x, weight):
        M, K = x.shape
        if (self.gemm != "triton" or not skinny_gemm.takes(M, K)
                or weight.numel() * weight.element_size() > self.SKINNY_MAX_BYTES):
            return super().linear(x, weight)
        return self.skinny(x, weight)

    def linear_fp32(self, x, weight, cpu_weight_fp32=None):
        if self.gemm != "triton" or not skinny_gemm.takes(*x.shape):
            return super().linear_fp32(x, weight, cpu_weight_fp32)
        return self.skinny(x, weight, out_dtype=torch.float32)

    def rms_norm(self, x, weight, eps: float):
        H = x.shape[-1]
        x2 = x if x.dim() == 2 else x.reshape(-1, H)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
        self.k.rms_norm_kernel[(x2.shape[0],)](x2, weight, out, x2.stride(0), H, eps,
                                                BLOCK=self.k.next_power_of_2(H), **self.launch)
        return out.view(x.shape)

    def silu_mul(self, gate_up, channels: int):
        rows = gate_up.shape[0]
        out = torch.empty(rows, channels, dtype=gate_up.dtype, device=gate_up.device)
        n = rows * channels
        self.k.silu_mul_kernel[(self.k.cdiv(n, 1024),)](gate_up, out, channels, n, BLOCK=1024, **self.launch)
        return out

    def embed_partial(self, tokens, vocab_to_local, embed, vocab_offset: int):
        B, T = tokens.shape
        H = embed.shape[1]
        out = torch.empty(B * T, H, dtype=embed.dtype, device=embed.device)
        block = min(1024, self.k.next_power_of_2(H))
        self.k.embed_gather_kernel[(B * T, self.k.cdiv(H, block))](
            tokens, tokens.stride(0), tokens.stride(1), T, embed, out, vocab_offset, embed.shape[0] - 1, H, BLOCK=block, **self.launch)
        return out

    def residual_norm(self, x, partials, collective, norm_weights, eps: float, consumers=None):
        """One kernel per rank: each reads both partials (what its all-reduce would bring it),
        adds its residual and applies its norm; the first also writes the new residual."""
        if len(partials) != 2:
            return unfused_residual_norm(self, x, partials, collective, norm_weights, eps)
        p0, p1 = partials
        H = p0.shape[-1]
        rows = p0.numel() // H
        x_new = torch.empty_like(p0)
        normed = []
        for rank, w in enumerate(norm_weights):
            n = torch.empty_like(p0)
            self.k.residual_sum_norm_kernel[(rows,)](p0 if x is None else x, p0, p1, w, x_new, n, H, eps,
                                                     HAS_X=x is not None, WRITE_X=rank == 0,
                                                     BLOCK=self.k.next_power_of_2(H), **self.launch)
            normed.append(n)
        return x_new, normed

    def rope_cache_fold(self, qkv, step, cache, hq: int, hkv: int, group: int):
        B, T, heads, d = qkv.shape
        q = torch.empty(B, hkv, T * group, d, dtype=qkv.dtype, device=qkv.device)
        pos = step.positions
        self.k.rope_cache_fold_kernel[(B * T, hq + hkv)](
            qkv, pos, pos.stride(0), pos.stride(1), step.rope_table, cache, q,
            T, cache.shape[1], cache.shape[3], qkv, qkv, HQ=hq, HKV=hkv, D=d, **self.launch)
        return q

    def unfold_heads(self, att, T: int, group: int):
        B, hkv, _, d = att.shape
        att = att.contiguous()
        out = torch.empty(B * T, group * hkv * d, dtype=att.dtype, device=att.device)
        self.k.unfold_attention_kernel[(B * T, group * hkv)](att, out, T, HKV=hkv, GROUP=group, D=d, **self.launch)
        return out

    def attend(self, q, cache, step, scale: float, T: int, group: int):
        if self.attention_kind != "fused":
            return super().attend(q, cache, step, scale, T, group)
        B, hkv, rows, d = q.shape
        S = cache.shape[3]
        block_s = self.ATTENTION_SPLIT
        nsplit = self.k.cdiv(S, block_s)
        # tl.dot needs 16 rows at least; blocks of 32 rows keep a prefill chunk's tiles small.
        block_l = min(32, max(16, self.k.next_power_of_2(rows)))
        row_blocks = self.k.cdiv(rows, block_l)
        rows_padded = row_blocks * block_l
        dev = q.device
        m = torch.empty(B * hkv, nsplit, rows_padded, dtype=torch.float32, device=dev)
        l = torch.empty_like(m)
        acc = torch.empty(B * hkv, nsplit, rows_padded, d, dtype=torch.float32, device=dev)
        pos = step.positions
        self.k.attention_split_kernel[(B * hkv, nsplit, row_blocks)](
            q, cache, pos, pos.stride(0), pos.stride(1), m, l, acc, T, cache.shape[1], S, scale, nsplit,
            rows_padded, HKV=hkv, GROUP=group, D=d, BLOCK_L=block_l, BLOCK_S=block_s, **self.launch)
        out = torch.empty(B * T, group * hkv * d, dtype=q.dtype, device=dev)
        self.k.attention_combine_kernel[(B * T, group * hkv)](
            m, l, acc, pos, pos.stride(0), pos.stride(1), out, T, nsplit, rows_padded,
            HKV=hkv, GROUP=group, D=d, BLOCK_S=block_s, BLOCK_SPLIT=self.k.next_power_of_2(nsplit), **self.launch)
        return out

    def gumbel_noise(self, seeds, row_depth, premix, out) -> None:
        D, B, V = out.shape
        if out.stride(2) != 1 or row_depth.stride(1) != 1 or seeds.stride(0) != 1:
            raise ValueError("gumbel_noise wants contiguous vocab rows, seeds and table rows")
        block = 1024
        self.k.gumbel_noise_kernel[(D * B, self.k.cdiv(V, block))](
            seeds, row_depth, row_depth.stride(0), premix, out, B, V, out.stride(0), out.stride(1), BLOCK=block, **self.launch)

    def shard_stats(self, logits, mode: str, noise, t1_mask, vocab_offset: int, chunks: int):
        B, V = logits.shape
        length = V // chunks
        dev = logits.device
        score = torch.empty(B, chunks, dtype=torch.float32, device=dev)
        best_id = torch.empty(B, chunks, dtype=torch.int64, device=dev)
        best_logit = torch.empty(B, chunks, dtype=torch.float32, device=dev)
        lse = torch.empty(B, chunks, dtype=torch.float32, device=dev)
        mode_id = self.MODES[mode]
        noise_t = noise if mode_id else logits  # unread when greedy
        t1 = t1_mask if mode == SWITCH else logits
        self.k.head_chunk_stats_kernel[(B, chunks)](
            logits, noise_t, noise_t.stride(0), t1, score, best_id, best_logit, lse,
            V, vocab_offset, chunks, length, MODE=mode_id, BLOCK=self.k.next_power_of_2(length), **self.launch)
        return sampling.ShardStats(score, best_id, best_logit, lse)

    def merge_choice(self, stats, proposals, confidences, q_payload, depth: int, mode: str, t1_mask, zero):
        if len(stats) != 2:
            raise ValueError("the merge is written for exactly two vocabulary shards")
        s0, s1 = stats
        B, chunks = s0.best_score.shape
        t1 = t1_mask if mode == SWITCH else s0.best_score
        self.k.merge_choice_kernel[(B,)](
            s0.best_score, s0.best_id, s0.best_logit, s0.chunk_logsumexp,
            s1.best_score, s1.best_id, s1.best_logit, s1.chunk_logsumexp, t1,
            proposals, confidences, q_payload, depth, proposals.stride(0), q_payload.stride(0), chunks,
            MODE=self.MODES[mode], BLOCK=self.k.next_power_of_2(2 * chunks), **self.launch)
