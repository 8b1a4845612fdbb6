"""Reference outputs of upstream exllamav3 on an EXL3 checkpoint, for checking pp4's kernels against.

Why: pp4 rebuilds exllamav3's CUDA extension (and patched variants of it); to know they compute
what upstream computes, we need upstream's own numbers on a real EXL3 model. This script runs on
the GPU machine on the checkpoint tests/gpu/exl3_checkpoint.py made (OUTDIR/exl3), with exllamav3's own
Python (Config / Model / Cache / LinearEXL3) over pp4's build of the stock exllamav3_ext, and saves

    OUTDIR/reference.safetensors
        input_ids                     int64 [B, T]   seeded token ids (never 0..2, the specials)
        logits.nc                     fp32 [B, T, V] model.forward, no cache (attn_mode flash_attn_nc)
        logits.cached                 fp32 [B, T, V] prefill of the first P tokens into a Cache, then
                                                      one token per step (attn_mode flash_attn)
        for every quantized linear KEY (model.layers.N.self_attn.q_proj, ..., lm_head):
        KEY.suh, KEY.svh              fp16 [in], [out]      as loaded
        KEY.trellis_cols              int16 [in/16, C/16, 16*K]   trellis of the first C columns
        KEY.reconstruct_cols          fp16 [in, C]          exllamav3_ext.reconstruct(w, trellis, K, mcg, mul1)
                                                             on the FULL trellis, first C columns kept
        KEY.x{R}                      fp16 [R, in]          seeded input, R = 1, 5, 20 rows
        KEY.y{R}                      [R, out]              LinearEXL3.forward(x, {}) (R <= 144: the
                                                             exl3_gemm path, BC_LinearEXL3.run_alloc);
                                                             dtype = the layer's out dtype
    OUTDIR/reference.json
        the exact modules, classes, ext functions and paths used, shapes, K/codebook per linear,
        sanity numbers (cached vs no-cache logits, gemm vs reconstruct+matmul, sliced-trellis decode)

C (--cols, default 128) keeps the file small (~10 MB for the default model); --cols 0 stores whole
tensors (~60 MB). The full trellises are in OUTDIR/exl3 anyway. Trellis tiles are 16x16 and decode
independently, so reconstruct(trellis_cols) == reconstruct_cols (checked, recorded in the JSON).

GPU machine:
    python3 tests/gpu/exl3_reference.py --out /tmp/exl3tiny --exl3-build build
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

ROWS = (1, 5, 20)


def main() -> None:
    args = parse_args()
    out = Path(args.out).absolute()
    ext = load_ext(args.exl3_build)

    import exllamav3
    from exllamav3 import Cache, Config, Model
    from exllamav3.version import __version__ as exllamav3_version

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    config = Config.from_directory(str(out / "exl3"))
    model = Model.from_config(config)
    cache = Cache(model, max_num_tokens=args.batch * args.cache_len)  # before load: load allocates it
    model.load(str(device))

    tensors: dict[str, torch.Tensor] = {}
    info: dict = {
        "exllamav3": {"version": exllamav3_version, "path": str(Path(exllamav3.__file__).parent)},
        "exllamav3_ext": {"file": ext.__file__},
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(device),
        "checkpoint": str(out / "exl3"),
        "architecture": type(config).__name__ + " / " + type(model).__name__,
        "seed": args.seed,
    }

    run_model(args, model, cache, config, device, tensors, info)
    run_linears(args, model, ext, device, tensors, info)

    ref = out / "reference.safetensors"
    from safetensors.torch import save_file
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(ref),
              metadata={"format": "pt", "source": "tests/gpu/exl3_reference.py"})
    (out / "reference.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"\nwrote {ref} ({ref.stat().st_size / 2**20:.1f} MiB, {len(tensors)} tensors) and reference.json")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder holding exl3/ (from exl3_checkpoint.py)")
    ap.add_argument("--exl3-build", default="build", help="pp4 build dir holding the exl3 target")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=12, help="tokens per sequence")
    ap.add_argument("--prefill", type=int, default=8, help="tokens prefilled into the cache; the rest are single steps")
    ap.add_argument("--cache-len", type=int, default=256, help="cache tokens per sequence (multiple of 256)")
    ap.add_argument("--cols", type=int, default=128,
                    help="columns of each reconstructed weight/trellis to store (multiple of 16); 0 = all")
    return ap.parse_args()


def load_ext(build_dir: str):
    """pp4's compiled exllamav3_ext, registered before exllamav3 is imported (tests/gpu/exl3_checkpoint.py)."""
    from exl3_checkpoint import load_ext as register

    return register(build_dir)


# --------------------------------------------------------------------------------------------------
# Whole model

@torch.inference_mode()
def run_model(args, model, cache, config, device, tensors: dict, info: dict) -> None:
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(3, config.vocab_size, (args.batch, args.seq), generator=gen, dtype=torch.long)
    tensors["input_ids"] = ids

    t0 = time.time()
    nc = model.forward(ids, {"attn_mode": "flash_attn_nc"}).float()
    torch.cuda.synchronize(device)
    tensors["logits.nc"] = nc
    info["forward_nc"] = {"call": 'model.forward(input_ids, {"attn_mode": "flash_attn_nc"})',
                          "shape": list(nc.shape), "seconds": round(time.time() - t0, 3),
                          "logit_std": nc.std().item(), "argmax": nc.argmax(-1).tolist()}
    print(f"forward (no cache): logits {list(nc.shape)}, std {nc.std().item():.3f}")

    # Prefill P tokens into the cache, then single-token steps; past_len is where each call starts
    try:
        steps = []
        P = args.prefill
        base = {"attn_mode": "flash_attn", "cache": cache, "batch_shape": (args.batch, args.cache_len)}
        steps.append(model.forward(ids[:, :P], dict(base, past_len=0)).float())
        for t in range(P, args.seq):
            steps.append(model.forward(ids[:, t:t + 1], dict(base, past_len=t)).float())
        cached = torch.cat([s.to(nc.device) for s in steps], dim=1)
        tensors["logits.cached"] = cached
        d = (cached - nc).abs().max().item()
        info["forward_cached"] = {
            "calls": [f'model.forward(input_ids[:, :{P}], {{"attn_mode": "flash_attn", "cache": Cache, '
                      f'"batch_shape": ({args.batch}, {args.cache_len}), "past_len": 0}})'] +
                     [f"model.forward(input_ids[:, {t}:{t + 1}], ..., past_len={t})" for t in range(P, args.seq)],
            "cache": f"Cache(model, max_num_tokens={args.batch * args.cache_len}), layer type "
                     f"{cache.layer_type.__name__}",
            "max_abs_diff_vs_nc": d,
            "argmax_agree": (cached.argmax(-1) == nc.argmax(-1)).float().mean().item(),
        }
        print(f"forward (cache, prefill {P} + {args.seq - P} steps): max |cached - nc| = {d:.4g}")
    except Exception as e:  # the no-cache logits are still worth saving
        info["forward_cached"] = {"error": repr(e)}
        print(f"forward with cache failed: {e!r}")

    info["modules"] = [
        {"key": m.key, "class": f"{type(m).__module__}.{type(m).__name__}",
         **({"inner": f"{type(m.inner).__module__}.{type(m.inner).__name__}"} if getattr(m, "inner", None) else {})}
        for m in model
    ]


# --------------------------------------------------------------------------------------------------
# Each quantized linear

@torch.inference_mode()
def run_linears(args, model, ext, device, tensors: dict, info: dict) -> None:
    from exllamav3.modules.quant import LinearEXL3

    gen = torch.Generator().manual_seed(args.seed + 1)
    info["linears"] = {}
    info["ext_calls"] = {
        "reconstruct": "exllamav3_ext.reconstruct(w fp16 [in, out], trellis, K, mcg: bool, mul1: bool)",
        "gemm": "LinearEXL3.forward(x, {}) -> BC_LinearEXL3.run_alloc(x, out_features, out_dtype == float) "
                f"(exl3_gemm path for rows <= {__import__('exllamav3.modules.quant.exl3', fromlist=['x']).AUTO_RECONSTRUCT_THRESHOLD})",
        "gemm_check": 'LinearEXL3.forward(x, {"reconstruct": True}) (reconstruct + Hadamards + hgemm)',
    }
    for m in model:
        inner = getattr(m, "inner", None)
        if not isinstance(inner, LinearEXL3):
            continue
        k, n, key = inner.in_features, inner.out_features, m.key
        C = n if args.cols <= 0 else min(args.cols, n)
        assert C % 16 == 0

        # The upstream call, as LinearEXL3._reconstruct_inner makes it for a whole tensor
        w = torch.empty((k, n), dtype=torch.half, device=inner.trellis.device)
        ext.reconstruct(w, inner.trellis, inner.K, inner.mcg, inner.mul1)
        tr_cols = inner.trellis[:, :C // 16].contiguous()
        w_cols = torch.empty((k, C), dtype=torch.half, device=w.device)
        ext.reconstruct(w_cols, tr_cols, inner.K, inner.mcg, inner.mul1)
        tensors[f"{key}.suh"] = inner.suh
        tensors[f"{key}.svh"] = inner.svh
        tensors[f"{key}.trellis_cols"] = tr_cols
        tensors[f"{key}.reconstruct_cols"] = w[:, :C]

        W = inner.get_weight_tensor().float()  # original basis: suh/svh and both Hadamards applied
        rec = {"in": k, "out": n, "K": inner.K, "mcg": inner.mcg, "mul1": inner.mul1,
               "codebook": "mcg" if inner.mcg else "mul1" if inner.mul1 else "3inst",
               "trellis_shape": list(inner.trellis.shape), "cols_stored": C,
               "out_dtype": str(inner.default_out_dtype),
               "sliced_trellis_decodes_same": bool(torch.equal(w_cols, w[:, :C])),
               "reconstruct_sum": w.double().sum().item(), "reconstruct_abs_sum": w.double().abs().sum().item(),
               "gemm": {}}
        for R in ROWS:
            x = torch.randn((R, k), generator=gen).half().to(inner.trellis.device)
            y = inner.forward(x, {})
            y_rec = inner.forward(x, {"reconstruct": True})
            y_ref = x.float() @ W
            tensors[f"{key}.x{R}"] = x
            tensors[f"{key}.y{R}"] = y
            rec["gemm"][str(R)] = {
                "y_dtype": str(y.dtype),
                "max_abs_diff_vs_reconstruct_path": (y.float() - y_rec.float()).abs().max().item(),
                "rel_err_vs_x@W": ((y.float() - y_ref).norm() / y_ref.norm()).item(),
            }
        info["linears"][key] = rec
        g = rec["gemm"]
        print(f"{key:<34} [{k}, {n}] K={inner.K} {rec['codebook']:<5} "
              f"gemm vs recon path {max(v['max_abs_diff_vs_reconstruct_path'] for v in g.values()):.3g}, "
              f"vs x@W rel {max(v['rel_err_vs_x@W'] for v in g.values()):.3g}, "
              f"sliced decode same: {rec['sliced_trellis_decodes_same']}")


if __name__ == "__main__":
    main()
