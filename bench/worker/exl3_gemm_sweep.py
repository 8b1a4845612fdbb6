"""pp4's EXL3 decode GEMM at every split of K, side by side, on one GPU.

For each of the worker's matrices (tests/gpu/exl3_decode_check.py's SHAPES, mul1 codebook) and row
count: the split of K the module chooses (splits 0), plainly and with pdl, and each of SPLITS,
each checked against an fp64 oracle (weights from the module's own reconstruct, which
tests/gpu/exl3_decode_check.py checks bit for bit against upstream's) and timed as
tests/gpu/exl3_decode_check.py times it (a CUDA graph of 20 calls, best of 5 replays of 10). Bandwidth
is trellis bytes over time, and its share of the device-to-device copy bandwidth measured first.

    python3 bench/worker/exl3_gemm_sweep.py --exl3-build build [--json OUT] [--rows 1,4,8,20] [--shapes head,...]
        [--splits none]   (only the module's own split, plainly and with pdl)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: pp4, and bench.common for the helpers

from bench.common.exl3_gemm import SHAPES, graph_time, hadamard, random_linear  # noqa: E402

from pp4.certify.loader import load_target  # noqa: E402
from pp4_worker.harness.timing import measure_copy_bandwidth  # noqa: E402

SPLITS = (1, 2, 3, 4, 5, 6, 8, 12, 14, 16)
CODEBOOK = 2  # mul1, as the worker's default checkpoint


def oracle(x, w, suh, svh):
    """fp64 had(had(x * suh) @ W) * svh, every step in fp64."""
    h = hadamard().to(x.device)
    k, n = w.shape
    xh = ((x.double() * suh.double()).view(-1, k // 128, 128) @ h).view(-1, k)
    y = ((xh @ w).view(-1, n // 128, 128) @ h).view(-1, n)
    return y * svh.double()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exl3-build", default="build")
    ap.add_argument("--json")
    ap.add_argument("--rows", default="1,4,8,16,20")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--splits", default=",".join(map(str, SPLITS)),
                    help="the fixed splits timed besides the module's own choice; 'none' for none")
    args = ap.parse_args()
    fixed = () if args.splits == "none" else tuple(int(s) for s in args.splits.split(","))
    mine = load_target("exl3-decode", args.exl3_build)
    device = torch.device("cuda")
    copy = measure_copy_bandwidth(device, 1 << 30)
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bytes_per_s": copy.bytes_per_s,
           "results": []}
    print(f"{out['gpu']}: copy {copy.bytes_per_s / 1e12:.3f} TB/s")
    for name in args.shapes.split(","):
        k, n, bits = SHAPES[name]
        trellis, suh, svh = random_linear(k, n, bits, 7, device)
        w = mine.reconstruct(trellis, CODEBOOK).double()
        out_dtype = torch.float32 if name == "head" else torch.float16
        nbytes = trellis.numel() * 2
        for m in map(int, args.rows.split(",")):
            x = torch.randn(m, k, device=device).to(torch.float16)
            ref = oracle(x, w, suh, svh)
            scale = ref.abs().max().item()
            # (splits, pdl): the module's own split plainly and with programmatic dependent launch
            # (in a graph of back-to-back calls each call's kernels then overlap the one before),
            # then every split plainly.
            for splits, pdl in ((0, False), (0, True), *((sp, False) for sp in fixed)):
                y = torch.empty(m, n, dtype=out_dtype, device=device)
                mine.gemm(x, trellis, suh, svh, [], y, CODEBOOK, splits, pdl)
                err = (y.double() - ref).abs().max().item() / scale
                us = graph_time(lambda: mine.gemm(x, trellis, suh, svh, [], y, CODEBOOK, splits, pdl))
                row = {"linear": name, "rows": m, "bits": bits, "splits": splits, "pdl": pdl, "us": us,
                       "tbps": nbytes / us / 1e6, "of_copy": nbytes / us / 1e6 / (copy.bytes_per_s / 1e12),
                       "max_rel_err": err}
                out["results"].append(row)
                print(f"{name:7s} M={m:2d} splits {splits:2d}{' pdl' if pdl else '    '}: {us:7.1f} us "
                      f"{row['tbps']:.2f} TB/s ({100 * row['of_copy']:.0f}% of copy) err {err:.1e}", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(out, indent=1))
    print("\nper matrix and rows: the module's own split, plainly and with pdl, and the best split:")
    for name in args.shapes.split(","):
        for m in map(int, args.rows.split(",")):
            rows = [r for r in out["results"] if r["linear"] == name and r["rows"] == m]
            if not rows:
                continue
            best = min((r for r in rows if not r["pdl"]), key=lambda r: r["us"])
            auto = next(r for r in rows if r["splits"] == 0 and not r["pdl"])
            pdl = next(r for r in rows if r["splits"] == 0 and r["pdl"])
            print(f"{name:7s} M={m:2d}: chosen {auto['us']:.1f} us ({100 * auto['of_copy']:.0f}% of copy), with pdl "
                  f"{pdl['us']:.1f} us ({100 * pdl['of_copy']:.0f}%); best split {best['splits']} {best['us']:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
