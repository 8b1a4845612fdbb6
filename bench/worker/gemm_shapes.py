"""The worker's GEMM shapes, cuBLAS against the Triton skinny GEMM's tile choices, on one GPU.

    python bench/worker/gemm_shapes.py [--out DIR] [--rows 1,4,20] [--jobs 16] [--shapes qkv,o,down,gate_up,head]

Each measurement is one CUDA graph of back-to-back GEMMs, each on its own copy of the weight
(copies enough for 512 MB, ten times an H200's L2), so every GEMM streams its weight from HBM
as it does inside a draft pass, launch gaps included.  Per GEMM: the median over 15 replays
of (graph time / GEMMs in it).  Every Triton tile choice is checked against float64 first
(relative error < 1e-3) and for the same bits on a second run; a choice that fails is
reported, not timed.  The Triton kernels are compiled first in --jobs processes (Triton's
disk cache), because one process compiles one at a time.

Writes DIR/gemm_shapes.json (every measurement) and DIR/gemm_shapes.txt (per shape and row
count: cuBLAS, pp4's plan, the five fastest tile choices), and prints the text.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import attrs  # noqa: E402
import torch  # noqa: E402

# (name, N, K, output dtype) of one rank's matrices in the default geometry (hidden 4096, MLP
# 14336, vocabulary 128256, TP 2).  The head's logits are fp32, as the worker computes them.
SHAPES = [("qkv", 3072, 4096, torch.float16), ("o", 4096, 2048, torch.float16),
          ("down", 4096, 7168, torch.float16), ("gate_up", 14336, 4096, torch.float16),
          ("head", 64128, 4096, torch.float32)]
STREAM_BYTES = 512 << 20
REPLAYS = 15


def tile_choices(n: int, k: int):
    from pp4_worker.kernels.skinny_gemm import WIDE_N, SkinnyTiles
    wide = n >= WIDE_N  # the head: thousands of column blocks already, so no splits
    for block_n, block_k, splits, warps, stages in itertools.product(
            (16, 32, 64, 128), (64, 128, 256), (1,) if wide else (1, 2, 4, 8), (4, 8), (3, 4, 5)):
        if k % (splits * block_k) == 0:
            yield SkinnyTiles(block_n, block_k, splits, warps, stages)


def cases(shapes, rows_list):
    for (name, n, k, dtype), rows in itertools.product(shapes, rows_list):
        for tiles in tile_choices(n, k):
            yield name, n, k, dtype, rows, tiles


def _compile_some(batch):
    """Run each case once on a small weight: fills Triton's disk cache for the timing process."""
    from pp4_worker.kernels import triton_kernels
    from pp4_worker.kernels.skinny_gemm import SkinnyGemm
    gemm = SkinnyGemm(triton_kernels, torch.device("cuda"))
    failed = []
    for case in batch:
        _, n, k, dtype, rows, tiles = case
        x = torch.randn(rows, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        try:
            gemm(x, w, tiles, out_dtype=dtype)
        except Exception as exc:  # e.g. a tile choice that needs more shared memory than an SM has
            failed.append((case, f"{type(exc).__name__}: {str(exc)[:200]}"))
    torch.cuda.synchronize()
    return failed


def graph_time_us(fn, calls: int) -> float:
    fn(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gemm-out")
    ap.add_argument("--rows", default="1,4,20")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    args = ap.parse_args(argv)
    rows_list = [int(r) for r in args.rows.split(",")]
    known = {s[0]: s for s in SHAPES}
    unknown = [name for name in args.shapes.split(",") if name not in known]
    if unknown:
        ap.error(f"--shapes: unknown {unknown}; choose from {sorted(known)}")
    shapes = [known[name] for name in args.shapes.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from pp4_worker.kernels import triton_kernels
    from pp4_worker.kernels.skinny_gemm import SkinnyGemm, plan

    all_cases = list(cases(shapes, rows_list))
    # One compile per Triton specialization: cases that share it go to the same process.
    by_key = {}
    for case in all_cases:
        _, _, _, dtype, rows, tiles = case
        key = (dtype, max(16, 1 << (rows - 1).bit_length()), rows == 1, tiles.splits == 1,
               tiles.block_n, tiles.block_k, tiles.num_warps, tiles.num_stages)
        by_key.setdefault(key, []).append(case)
    groups = sorted(by_key.values(), key=len, reverse=True)
    batches = [[] for _ in range(args.jobs)]
    for group in groups:
        min(batches, key=len).extend(group)
    ctx = __import__("multiprocessing").get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
        failed = dict(itertools.chain.from_iterable(pool.map(_compile_some, batches)))
    print(f"compiled {len(all_cases)} cases in {args.jobs} processes; {len(failed)} failed to compile", flush=True)

    gemm = SkinnyGemm(triton_kernels, torch.device("cuda"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = []
    lines = [f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, per GEMM in a graph of "
             f"{STREAM_BYTES >> 20} MB of distinct weights (median of {REPLAYS} replays)"]
    for name, n, k, dtype in shapes:
        nbytes = n * k * 2
        copies = max(4, -(-STREAM_BYTES // nbytes))
        weights = [(torch.randn(n, k, device="cuda", generator=gen) / k ** 0.5).half() for _ in range(copies)]
        for rows in rows_list:
            x = torch.randn(rows, k, device="cuda", generator=gen).half()
            ref = x.double() @ weights[0].double().T
            outs = [None]

            def cublas(i):
                outs[0] = (torch.mm(x, weights[i % copies].t()) if dtype == torch.float16
                           else torch.mm(x, weights[i % copies].t(), out_dtype=dtype))
            row = {"shape": name, "n": n, "k": k, "rows": rows, "bytes": nbytes}
            cub = graph_time_us(cublas, copies)
            results.append(dict(row, kernel="cublas", us=cub, tbps=nbytes / cub / 1e6))
            mine = plan(rows, n, k)
            timed = []
            for tiles in tile_choices(n, k):
                if (name, n, k, dtype, rows, tiles) in failed:
                    results.append(dict(row, kernel="triton", tiles=list(attrs.astuple(tiles)),
                                        compile_error=failed[(name, n, k, dtype, rows, tiles)]))
                    continue
                y = gemm(x, weights[0], tiles, out_dtype=dtype)
                err = ((y.double() - ref).norm() / ref.norm()).item()
                same = torch.equal(gemm(x, weights[0], tiles, out_dtype=dtype), y)
                rec = dict(row, kernel="triton", tiles=list(attrs.astuple(tiles)),
                           rel_err=err, same_bits=same, planned=tiles == mine)
                if err < 1e-3 and same:

                    def tri(i, tiles=tiles):
                        outs[0] = gemm(x, weights[i % copies], tiles, out_dtype=dtype)
                    rec["us"] = graph_time_us(tri, copies)
                    rec["tbps"] = nbytes / rec["us"] / 1e6
                    timed.append(rec)
                results.append(rec)
            timed.sort(key=lambda r: r["us"])
            bad = [r for r in results if r["shape"] == name and r["rows"] == rows
                   and r["kernel"] == "triton" and "us" not in r and "compile_error" not in r]
            planned = [r for r in timed if r["planned"]]
            lines.append(f"\n{name} N={n} K={k} rows={rows} ({nbytes / 1e6:.1f} MB): cuBLAS {cub:.2f} us "
                         f"({nbytes / cub / 1e6:.2f} TB/s)" + (f"; {len(bad)} tile choices FAILED the checks" if bad else ""))
            shown = planned[:1] + [r for r in timed[:5] if not r["planned"]]
            for r in shown:
                lines.append(f"  {'plan ' if r['planned'] else '     '}tiles(n,k,splits,warps,stages)={r['tiles']}: "
                             f"{r['us']:.2f} us ({r['tbps']:.2f} TB/s) = {r['us'] / cub:.3f}x cuBLAS")
            print("\n".join(lines[-1 - len(shown):]), flush=True)
        weights = None  # free the copies before the next shape allocates its own
        torch.cuda.empty_cache()
    lines += ["", "One tile choice for every row count (what a plan by shape alone can pick): the three with "
              "the least total time over the rows"]
    for name, n, k, _ in shapes:
        cub = {r["rows"]: r["us"] for r in results if r["shape"] == name and r["kernel"] == "cublas"}
        totals = {}
        for r in results:
            if r["shape"] == name and r["kernel"] == "triton" and "us" in r:
                totals.setdefault(tuple(r["tiles"]), {})[r["rows"]] = r["us"]
        full = {t: v for t, v in totals.items() if len(v) == len(rows_list)}
        best = sorted(full.items(), key=lambda kv: sum(kv[1].values()))[:3]
        lines.append(f"{name}: cuBLAS " + ", ".join(f"{cub[r]:.2f}" for r in rows_list) + f" us at rows {rows_list}")
        for t, v in best:
            lines.append(f"  tiles {list(t)}: " + ", ".join(f"{v[r]:.2f}" for r in rows_list)
                         + f" us = {sum(v.values()) / sum(cub.values()):.3f}x cuBLAS's total")
    print("\n".join(lines[-4 * len(shapes) - 1:]))
    (out / "gemm_shapes.json").write_text(json.dumps(results, indent=1))
    (out / "gemm_shapes.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
