"""pp4's EXL3 decode GEMM against exllamav3's own kernels, on the GPU: exactness, then speed.

1. Decode: pp4_exl3_decode.reconstruct against exllamav3_ext.reconstruct (upstream's decoder) on
   random trellises of every bit width 2..8 and all three codebooks: bit for bit.
2. GEMM: pp4_exl3_decode.gemm and upstream's exl3_gemm against an fp64 oracle built from upstream's
   decoded weights and upstream's input transform (had_r_128), at the worker's row counts and
   layer shapes. The oracle leaves out only the GEMM's own accumulation; the error of each
   kernel against it is printed as a fraction of the output's largest value.
3. A real checkpoint (--reference OUTDIR/reference.safetensors from tests/gpu/exl3_reference.py):
   pp4's GEMM on each linear against LinearEXL3.forward's outputs saved there.
4. Speed: each GEMM alone in a CUDA graph of 20 launches, pp4 then upstream, the same weights,
   as microseconds and as trellis bytes per second.

    python3 tests/gpu/exl3_decode_check.py --exl3-build build [--reference DIR/reference.safetensors] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common.exl3_gemm import SHAPES, graph_time, hadamard, random_linear  # noqa: E402,F401  (F401: exl3_fused_check imports random_linear here)
from pp4.certify.loader import load_target  # noqa: E402

ROWS = (1, 4, 5, 8, 16, 20)


def upstream_gemm(up, x, trellis, suh, svh, out_dtype, codebook):
    y = torch.empty(x.shape[0], svh.shape[0], dtype=out_dtype, device=x.device)
    up.exl3_gemm(x, trellis, y, suh, torch.empty_like(x), svh, -1, codebook == 1, codebook == 2, 0)
    return y


def decoded(up, trellis, codebook) -> torch.Tensor:
    """W [K, N] fp64 from upstream's decoder."""
    w = torch.empty(trellis.shape[0] * 16, trellis.shape[1] * 16, dtype=torch.float16, device=trellis.device)
    up.reconstruct(w, trellis, trellis.shape[2] // 16, codebook == 1, codebook == 2)
    return w.double()


def oracle(up, x, w, suh, svh):
    """fp64 had(had_r_128(x * suh) @ W) * svh, W and the input transform from upstream's kernels."""
    n = svh.shape[0]
    xh = torch.empty_like(x)
    up.had_r_128(x, xh, suh, None, 1.0)
    h = hadamard().to(x.device)
    y = xh.double() @ w
    y = (y.view(-1, n // 128, 128) @ h).view(-1, n)
    return y * svh.double()


def check_decode(up, mine, device, out):
    rows = []
    for codebook in (0, 1, 2):
        for bits in range(2, 9):
            trellis, _, _ = random_linear(256, 512, bits, 1000 * codebook + bits, device)
            w_up = torch.empty(256, 512, dtype=torch.float16, device=device)
            up.reconstruct(w_up, trellis, bits, codebook == 1, codebook == 2)
            w_mine = mine.reconstruct(trellis, codebook)
            same = torch.equal(w_up.view(torch.int16), w_mine.view(torch.int16))
            rows.append({"codebook": codebook, "bits": bits, "bit_identical": same,
                         "differing": int((w_up.view(torch.int16) != w_mine.view(torch.int16)).sum())})
    bad = [r for r in rows if not r["bit_identical"]]
    print(f"decode: {len(rows) - len(bad)} of {len(rows)} (codebook, bits) pairs bit-identical to upstream's reconstruct")
    for r in bad:
        print(f"  codebook {r['codebook']} bits {r['bits']}: {r['differing']} weights differ")
    out["decode"] = rows


def check_gemm(up, mine, device, out, codebooks=(2, 0)):
    rows_out = []
    for codebook in codebooks:
        for name, (k, n, bits) in SHAPES.items():
            trellis, suh, svh = random_linear(k, n, bits, hash(name) & 0xFFFF, device)
            out_dtype = torch.float32 if name == "head" else torch.float16
            w = decoded(up, trellis, codebook)
            for m in ROWS:
                x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.float16).to(device)
                ref = oracle(up, x, w, suh, svh)
                y_mine = torch.empty(m, n, dtype=out_dtype, device=device)
                mine.gemm(x, trellis, suh, svh, [], y_mine, codebook, 0)
                y_up = upstream_gemm(up, x, trellis, suh, svh, out_dtype, codebook)
                scale = ref.abs().max().item()
                err_mine = (y_mine.double() - ref).abs().max().item() / scale
                err_up = (y_up.double() - ref).abs().max().item() / scale
                rows_out.append({"codebook": codebook, "linear": name, "rows": m, "err_pp4": err_mine,
                                 "err_upstream": err_up, "max_abs": scale})
                print(f"gemm cb{codebook} {name:7s} M={m:2d}: pp4 {err_mine:.2e}  upstream {err_up:.2e} "
                      f"(max |y| {scale:.3g})")
            del w
    out["gemm"] = rows_out


def check_reference(mine, path, device, out):
    from safetensors.torch import load_file

    t = load_file(path, device=str(device))
    info = json.loads(Path(path).with_suffix(".json").read_text()) if Path(path).with_suffix(".json").exists() else {}
    results = []
    for key in sorted({k.rsplit(".", 1)[0] for k in t if k.endswith(".suh")}):
        ckpt_dir = Path(path).parent / "exl3"
        from pp4_worker.model.exl3_checkpoint import Exl3Checkpoint

        lin = Exl3Checkpoint(str(ckpt_dir)).linear(key)
        trellis, suh, svh = lin.trellis.to(device), lin.suh.to(device), lin.svh.to(device)
        for r in (1, 5, 20):
            x, y_up = t.get(f"{key}.x{r}"), t.get(f"{key}.y{r}")
            if x is None or y_up is None:
                continue
            y = torch.empty_like(y_up)
            mine.gemm(x.contiguous(), trellis, suh, svh, [], y, lin.codebook, 0)
            scale = y_up.abs().max().item()
            err = (y.double() - y_up.double()).abs().max().item() / max(scale, 1e-30)
            results.append({"linear": key, "rows": r, "bits": lin.bits, "codebook": lin.codebook,
                            "max_rel_diff_vs_upstream_forward": err})
            print(f"checkpoint {key} ({lin.bits} bits, cb{lin.codebook}) M={r}: pp4 vs LinearEXL3.forward {err:.2e}")
        w = mine.reconstruct(trellis, lin.codebook)
        cols = t.get(f"{key}.reconstruct_cols")
        if cols is not None:
            same = torch.equal(w[:, : cols.shape[1]].view(torch.int16), cols.view(torch.int16))
            results.append({"linear": key, "reconstruct_bit_identical": same})
            print(f"checkpoint {key}: decode bit-identical to upstream's reconstruct: {same}")
    out["checkpoint"] = {"info": info.get("linears", {}), "results": results}


def check_speed(up, mine, device, out, codebook=2):
    rows_out = []
    for name, (k, n, bits) in SHAPES.items():
        trellis, suh, svh = random_linear(k, n, bits, 7, device)
        out_dtype = torch.float32 if name == "head" else torch.float16
        nbytes = trellis.numel() * 2
        for m in (1, 4, 5, 20):
            x = torch.randn(m, k, device=device).to(torch.float16)
            y1 = torch.empty(m, n, dtype=out_dtype, device=device)
            y2 = torch.empty(m, n, dtype=out_dtype, device=device)
            xh = torch.empty_like(x)
            t_mine = graph_time(lambda: mine.gemm(x, trellis, suh, svh, [], y1, codebook, 0))
            sms = 0 if m <= 8 and bits <= 4 else torch.cuda.get_device_properties(device).multi_processor_count
            t_up = graph_time(lambda: up.exl3_gemm(x, trellis, y2, suh, xh, svh, -1, codebook == 1,
                                                   codebook == 2, sms))
            rows_out.append({"linear": name, "rows": m, "bits": bits, "trellis_bytes": nbytes, "us_pp4": t_mine,
                             "us_upstream": t_up, "tbps_pp4": nbytes / t_mine / 1e6, "tbps_upstream": nbytes / t_up / 1e6})
            print(f"speed cb{codebook} {name:7s} M={m:2d} {nbytes / 2**20:7.1f} MiB: pp4 {t_mine:7.1f} us "
                  f"({nbytes / t_mine / 1e6:.2f} TB/s)  upstream {t_up:7.1f} us ({nbytes / t_up / 1e6:.2f} TB/s)")
    out["speed"] = rows_out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exl3-build", default="build")
    ap.add_argument("--reference", help="reference.safetensors from tests/gpu/exl3_reference.py")
    ap.add_argument("--json")
    ap.add_argument("--skip", default="", help="comma list of decode,gemm,checkpoint,speed to skip")
    args = ap.parse_args()
    up = load_target("exl3", args.exl3_build)
    mine = load_target("exl3-decode", args.exl3_build)
    device = torch.device("cuda")
    skip = set(filter(None, args.skip.split(",")))
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    steps = [("decode", lambda: check_decode(up, mine, device, out)),
             ("gemm", lambda: check_gemm(up, mine, device, out)),
             ("checkpoint", lambda: args.reference and check_reference(mine, args.reference, device, out)),
             ("speed", lambda: check_speed(up, mine, device, out))]
    for name, step in steps:
        if name in skip:
            continue
        try:
            step()
        except Exception as exc:  # one failing step must not hide the others' figures
            import traceback

            traceback.print_exc()
            out[name + "_error"] = repr(exc)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
