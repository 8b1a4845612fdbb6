"""pp4's fused EXL3 steps (norm_transform, gemm_swiglu, gemm_transformed) against the steps run apart,
on the GPU; needs only the exl3-decode module.

1. norm_transform: the new residual bit for bit against torch's fp16(x + fp16(p0 + p1)); its
   transformed output (two parts) against an oracle: the norm in fp32 (torch), rounded to fp16 as
   the worker's norm kernel does, then x * suh and the 128-point Hadamard transform in fp64,
   rounded to fp16.
2. gemm_transformed: from that oracle's fp16 input transform against gemm from x itself.
3. gemm_swiglu then gemm_transformed (down) against the MLP run apart from the same transformed
   input: gemm_transformed (gate_up), torch's silu(gate) * up in fp32 rounded once, gemm (down);
   with gate_up as one part and as two (gate and up, each its own suh, as a checkpoint has them).

A check fails where its largest difference exceeds two fp16 steps at the largest value (the
kernels add in another order than the oracle: the sum of squares, the butterflies). Prints one
line per check with that difference and how many elements differ at all; exit 1 if one fails.

    python3 tests/gpu/exl3_fused_check.py --exl3-build build [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from exl3_decode_check import random_linear  # noqa: E402

from pp4.certify.loader import load_target  # noqa: E402
from pp4_worker.model.exl3_reference import hadamard128  # noqa: E402

H, MLP, ROWS = 4096, 7168, (1, 4, 5, 20, 32)
CODEBOOK = 2  # mul1


def transform(x16: torch.Tensor, suh: torch.Tensor) -> torch.Tensor:
    """fp16 of the exact input transform of fp16 x: had128(x * suh) / sqrt(128), in fp64."""
    return hadamard128((x16 * suh).double()).half()


def off(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference as a fraction of the largest value wanted (one fp16 step at the largest
    value is 2**-10 of it, at most): elements near zero after a Hadamard transform's cancellations
    are many fp16 steps apart for a difference far below the others' rounding."""
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


TOLERANCE = 2 ** -9  # two fp16 steps at the largest value


def check_norm(mine, device, out) -> bool:
    ok = True
    g = torch.Generator(device="cpu").manual_seed(7)
    for rows in ROWS:
        for has_x in (False, True):
            p0, p1, x = (torch.randn(rows, H, generator=g).half().to(device) for _ in range(3))
            w = (1 + torch.rand(H, generator=g) / 10).half().to(device)
            suh = (torch.randint(0, 2, (2, H), generator=g) * 2 - 1).half().to(device)
            x_out = torch.empty(rows, H, dtype=torch.float16, device=device)
            xh = torch.empty(2, rows, H, dtype=torch.float16, device=device)
            mine.norm_transform(x if has_x else None, p0, p1, w, suh, x_out, xh, 1e-5, False)
            r = (p0.float() + p1.float()).half()
            if has_x:
                r = (x.float() + r.float()).half()
            rf = r.float()
            n = (rf * torch.rsqrt((rf * rf).mean(-1, keepdim=True) + 1e-5) * w.float()).half()
            want = torch.stack([transform(n, suh[p]) for p in range(2)])
            err = off(xh, want)
            row = {"rows": rows, "x": has_x, "residual_equal": bool(torch.equal(x_out, r)),
                   "xh_off": err, "xh_differing": int((xh != want).sum()), "elements": xh.numel()}
            row["ok"] = row["residual_equal"] and err <= TOLERANCE
            ok &= row["ok"]
            out.setdefault("norm_transform", []).append(row)
            print(f"norm_transform rows {rows:2d} x {has_x!s:5}: residual bit for bit {row['residual_equal']}, "
                  f"xh {row['xh_differing']} of {row['elements']} differ, by at most {err:.1e} of the largest")
    return ok


def check_transformed(mine, device, out) -> bool:
    ok = True
    trellis, suh, svh = random_linear(H, 3072, 4, 11, device)
    g = torch.Generator(device="cpu").manual_seed(8)
    for rows in ROWS:
        x = torch.randn(rows, H, generator=g).half().to(device)
        y_plain = torch.empty(rows, 3072, dtype=torch.float16, device=device)
        y_fused = torch.empty_like(y_plain)
        mine.gemm(x, trellis, suh.view(1, -1), svh, [], y_plain, CODEBOOK, 0, False)
        mine.gemm_transformed(transform(x, suh)[None].contiguous(), trellis, svh, [], y_fused, CODEBOOK, 0, False)
        err = off(y_fused, y_plain)
        row = {"rows": rows, "off": err, "differing": int((y_fused != y_plain).sum()), "ok": err <= TOLERANCE}
        ok &= row["ok"]
        out.setdefault("gemm_transformed", []).append(row)
        print(f"gemm_transformed rows {rows:2d}: {row['differing']} of {y_plain.numel()} differ from gemm, "
              f"by at most {err:.1e} of the largest")
    return ok


def check_swiglu(mine, device, out) -> bool:
    ok = True
    trellis, suh, svh = random_linear(H, 2 * MLP, 4, 12, device)
    down = random_linear(MLP, H, 4, 13, device)
    g = torch.Generator(device="cpu").manual_seed(9)
    suh_up = (torch.randint(0, 2, (H,), generator=g) * 2 - 1).half().to(device)
    for parts, columns in ((1, []), (2, [MLP, MLP])):
        suhs = [suh] if parts == 1 else [suh, suh_up]
        for rows in ROWS:
            x = torch.randn(rows, H, generator=g).half().to(device)
            xh = torch.stack([transform(x, s_) for s_ in suhs]).contiguous()
            # apart: gate_up, silu * up (fp32, rounded once), down
            y_gu = torch.empty(rows, 2 * MLP, dtype=torch.float16, device=device)
            mine.gemm_transformed(xh, trellis, svh, columns, y_gu, CODEBOOK, 0, False)
            gate, up = y_gu[:, :MLP].float(), y_gu[:, MLP:].float()
            act = (gate / (1.0 + torch.exp(-gate)) * up).half()
            want = torch.empty(rows, H, dtype=torch.float16, device=device)
            mine.gemm(act, down[0], down[1].view(1, -1), down[2], [], want, CODEBOOK, 0, False)
            # fused
            xh_down = torch.empty(1, rows, MLP, dtype=torch.float16, device=device)
            mine.gemm_swiglu(xh, trellis, svh, columns, down[1], xh_down, CODEBOOK, 0, False)
            got = torch.empty_like(want)
            mine.gemm_transformed(xh_down, down[0], down[2], [], got, CODEBOOK, 0, False)
            err = off(got, want)
            row = {"parts": parts, "rows": rows, "down_input_off": off(xh_down[0], transform(act, down[1])),
                   "off": err, "differing": int((got != want).sum()), "ok": err <= TOLERANCE}
            ok &= row["ok"]
            out.setdefault("gemm_swiglu", []).append(row)
            print(f"gemm_swiglu parts {parts} rows {rows:2d}: output {row['differing']} of {want.numel()} differ "
                  f"from the MLP apart, by at most {err:.1e} of the largest (down's input "
                  f"{row['down_input_off']:.1e} from the oracle's)")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exl3-build", default="build")
    ap.add_argument("--json")
    args = ap.parse_args()
    mine = load_target("exl3-decode", args.exl3_build)
    device = torch.device("cuda")
    out: dict = {"gpu": torch.cuda.get_device_name()}
    ok = check_norm(mine, device, out) & check_transformed(mine, device, out) & check_swiglu(mine, device, out)
    out["ok"] = ok
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    print("fused steps:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
