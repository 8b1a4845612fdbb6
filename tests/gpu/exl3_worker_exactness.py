"""The worker's eager forward on a real EXL3 checkpoint against exllamav3's own forward, on the GPU.

tests/gpu/exl3_reference.py saved exllamav3's logits for seeded token ids: once for the whole
sequence without a cache (``logits.nc``) and once as a prefill followed by single-token steps
through its cache (``logits.cached``). Here each worker backend (--backend exl3: upstream's
kernels; exl3-decode: pp4's decode GEMM) loads the same checkpoint, split over its two ranks, and
computes the same logits both ways through its own KV cache (batch slot 0, one sequence at a time);
both ranks' head shards are joined.

The tolerance is exllamav3's own disagreement with itself: its cached and uncached paths differ by
``d_up`` (different attention kernels and reduction orders on the same weights). The worker passes
when its largest difference from ``logits.nc`` is at most ``2 * d_up`` (and at least 1e-3 of the
logits' spread, should upstream agree with itself exactly), and its greedy choice is upstream's at
every position where upstream's top-2 margin exceeds that tolerance.

    python3 tests/gpu/exl3_worker_exactness.py --checkpoint DIR/exl3 --reference DIR/reference.safetensors \\
        --exl3-build build [--backends exl3-decode,exl3] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pp4_worker.model.config import Exl3Options, ModelSettings  # noqa: E402
from pp4_worker.model.exl3_checkpoint import read_geometry  # noqa: E402
from pp4_worker.model.model import TensorParallelDraft  # noqa: E402


@torch.inference_mode()
def worker_logits(model: TensorParallelDraft, ids: torch.Tensor, prefill: int | None) -> torch.Tensor:
    """fp32 [B, T, V]: every position's logits, both ranks joined. prefill None: the whole
    sequence in one step; else that many tokens, then one token per step."""
    B, T = ids.shape
    out = torch.empty(B, T, model.g.vocab, dtype=torch.float32, device=model.device)
    for b in range(B):
        for rank in model.ranks:
            for cache in rank.kv:
                cache[:, 0].zero_()
        bounds = [(0, T)] if prefill is None else [(0, prefill)] + [(t, t + 1) for t in range(prefill, T)]
        for a, z in bounds:
            positions = torch.arange(a, z, dtype=torch.int64, device=model.device)[None, :]
            normed = model.forward(ids[b : b + 1, a:z].to(model.device), model.call_positions(positions).step(0, z - a))
            shards = [r.backend.linear_fp32(n, r.w.head) for r, n in zip(model.ranks, normed)]
            out[b, a:z] = torch.cat(shards, dim=1)
    return out


def compare(name: str, worker: torch.Tensor, up_nc: torch.Tensor, tol: float) -> dict:
    diff = (worker - up_nc).abs()
    top2 = up_nc.topk(2, dim=-1).values
    margin = top2[..., 0] - top2[..., 1]
    decided = margin > tol
    same = worker.argmax(-1) == up_nc.argmax(-1)
    row = {"max_abs_diff": diff.max().item(), "mean_abs_diff": diff.mean().item(),
           "positions": int(decided.numel()), "decided_positions": int(decided.sum()),
           "greedy_agree_decided": int((same & decided).sum()), "greedy_agree_all": int(same.sum()),
           "passed": bool(diff.max().item() <= tol and bool(same[decided].all()))}
    print(f"{name}: max |worker - exllamav3| {row['max_abs_diff']:.4g} (tolerance {tol:.4g}), greedy "
          f"{row['greedy_agree_decided']}/{row['decided_positions']} where the margin exceeds it, "
          f"{row['greedy_agree_all']}/{row['positions']} in all: {'PASS' if row['passed'] else 'FAIL'}")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="the EXL3 checkpoint folder (exl3/)")
    ap.add_argument("--reference", required=True, help="reference.safetensors from tests/gpu/exl3_reference.py")
    ap.add_argument("--exl3-build", default="build")
    ap.add_argument("--backends", default="exl3-decode,exl3")
    ap.add_argument("--prefill", type=int, default=8, help="as tests/gpu/exl3_reference.py's --prefill")
    ap.add_argument("--json")
    args = ap.parse_args()
    from safetensors.torch import load_file

    ref = load_file(args.reference)
    ids, up_nc = ref["input_ids"], ref["logits.nc"].cuda()
    up_cached = ref["logits.cached"].cuda() if "logits.cached" in ref else None
    d_up = (up_cached - up_nc).abs().max().item() if up_cached is not None else 0.0
    tol = max(2 * d_up, 1e-3 * up_nc.std().item())
    doc = {"upstream_self_diff": d_up, "tolerance": tol, "logit_std": up_nc.std().item(), "backends": {}}
    print(f"exllamav3 cached vs uncached: {d_up:.4g}; tolerance {tol:.4g} (logit std {up_nc.std().item():.3g})")
    g = read_geometry(args.checkpoint)
    ok = True
    for backend in filter(None, args.backends.split(",")):
        settings = ModelSettings(geometry=g, context=256, weights_dir=args.checkpoint, backend=backend,
                                 exl3=Exl3Options(build_dir=args.exl3_build))
        model = TensorParallelDraft(settings, torch.device("cuda"))
        rows = {"whole": compare(f"{backend} whole sequence", worker_logits(model, ids, None), up_nc, tol),
                "stepped": compare(f"{backend} prefill {args.prefill} + steps", worker_logits(model, ids, args.prefill),
                                   up_nc, tol),
                "kernels": model.backend.kernels()}
        ok &= rows["whole"]["passed"] and rows["stepped"]["passed"]
        doc["backends"][backend] = rows
        del model
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
