"""Instructions per weight in the main loop of each exl3-decode GEMM kernel, read off its SASS.

A static count, no GPU needed: for every decode_gemm_kernel<bits, codebook, 8-row blocks> in an
object file, the instructions of its main loop (from the backward branch's target to that
branch), divided by the weights one lane decodes in them (8 per tile, one MMA per tile and 8-row
block). Issue rate
bounds a kernel that is not memory-bound, so this says how far the decode is from the bandwidth
floor before any timing: an H200 issues about 33e12 warp-lane instructions a second against 4.1 TB/s.

A scheduler issues one warp instruction a clock; two pipes behind it take two clocks for one (16
lanes a clock): the ALU pipe (shifts, logic, byte permutes, compares, address adds) and the
FMA-heavy pipe (integer multiply-adds and dot products; an fp16x2 op takes one clock there, being
issued to both FMA pipes at once: NVIDIA's description of sm_86 and sm_90). Printed per tile (8
weights a lane): issue clocks, and each pipe's clocks; the largest bounds the loop (a pipe only
where it holds more than half of the instructions).

    python bench/worker/exl3_decode_sass.py build/exl3-decode/obj/gemm_mul1.cu.o [--cuobjdump PATH]

cuobjdump: NVIDIA's wheel nvidia-cuda-cuobjdump (pip download --no-deps nvidia-cuda-cuobjdump==13.2.86,
then unzip; the binary is nvidia/cu13/bin/cuobjdump) with nvidia-cuda-nvdisasm's nvdisasm beside it
or on PATH (cuobjdump runs it for -sass), or a CUDA toolkit's.
"""
from __future__ import annotations

import argparse
from collections import Counter
import re
import shutil
import subprocess
import sys


ALU = {"SHF", "LOP3", "PRMT", "ISETP", "LEA", "IADD3", "VIADD", "SEL", "MOV", "IABS", "SGXT", "BMSK", "POPC", "FLO"}
FMA_HEAVY = {"IMAD", "IDP", "IMUL"}


def pipe_cycles(loop: list[str]) -> tuple[int, int]:
    """(ALU clocks, FMA-heavy clocks) a warp's pass through the loop takes on each pipe."""
    ops = Counter()
    for line in loop:
        words = line.split("*/", 1)[1].split()
        op = words[1] if words[0].startswith("@") else words[0]
        ops[op.split(".")[0].rstrip(";")] += 1
    alu = 2 * sum(n for op, n in ops.items() if op in ALU)
    fma = 2 * sum(n for op, n in ops.items() if op in FMA_HEAVY) + ops["HFMA2"] + ops["HADD2"] + ops["HMUL2"]
    return alu, fma


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("objects", nargs="+")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    args = ap.parse_args()
    for obj in args.objects:
        sass = subprocess.run([args.cuobjdump, "-sass", obj], capture_output=True, text=True, check=True).stdout
        lines = sass.splitlines()
        starts = [i for i, line in enumerate(lines) if "Function :" in line and "decode_gemm_kernel" in line]
        for n, i in enumerate(starts):
            end = starts[n + 1] if n + 1 < len(starts) else len(lines)
            body = [line for line in lines[i:end] if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
            mmas = [j for j, line in enumerate(body) if "HMMA" in line]
            address = [int(re.match(r"\s+/\*([0-9a-f]{4})\*/", line).group(1), 16) for line in body]

            def target(j):
                found = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", body[j])
                return int(found.group(1), 16) if found else None

            # The main loop: from the target of the first backward branch after the last MMA to that
            # branch (ptxas may put loads for the next step before the barrier, so the barrier is not
            # where the loop starts; a forward branch after the MMAs leads out of it).
            branch = next(j for j in range(mmas[-1], len(body))
                          if target(j) is not None and target(j) <= address[mmas[-1]])
            first = address.index(target(branch))
            loop = body[first : branch + 1]
            bits, codebook, blocks = re.search(r"ILi(\d)ELi(\d)ELi(\d)", lines[i]).groups()
            tiles = len([line for line in loop if "HMMA" in line]) // int(blocks)
            alu, fma = pipe_cycles(loop)
            print(f"{obj}: {bits} bits, codebook {codebook}, {8 * int(blocks)} rows: {len(loop)} instructions "
                  f"per loop step ({tiles} tiles a lane) = {len(loop) / (8 * tiles):.1f} per weight; ALU "
                  f"{alu / tiles:.0f}, FMA-heavy {fma / tiles:.0f}, issue {len(loop) / tiles:.0f} clocks a tile")
    return 0


if __name__ == "__main__":
    sys.exit(main())
