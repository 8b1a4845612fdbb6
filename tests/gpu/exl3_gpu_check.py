#!/usr/bin/env python3
"""On a GPU: stock EXL3, facc EXL3 and P2P import into one process (each checked against its pin),
and one real kernel of each variant runs on the same input.

- rms_norm: a kernel the facc patch does not touch, so both variants must agree bit for bit.
- hgemm_f16acc: the fp16-accumulator GEMM the patch makes accumulate in fp32; both are compared
  with an fp64 reference: stock's error should be larger, facc's near fp32 rounding.

    python tests/gpu/exl3_gpu_check.py BUILD_DIR      the modules in a build folder, through pp4's loader
    python tests/gpu/exl3_gpu_check.py --installed    the modules as `ninja wheel` installs them
                                                  (exllamav3_ext, exllamav3_ext_facc, pp4_p2p); pp4 is
                                                  not imported, and need not be installed
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def modules(where: str):
    if where == "--installed":
        import exllamav3_ext
        import exllamav3_ext_facc
        import pp4_p2p

        assert "pp4" not in sys.modules
        return exllamav3_ext, exllamav3_ext_facc, pp4_p2p
    sys.path.insert(0, str(REPO))
    from pp4.certify.loader import load_target

    return load_target("exl3", where), load_target("exl3-facc", where), load_target("p2p", where)


def main() -> int:
    import torch

    stock, facc, p2p = modules(sys.argv[1])
    ctx_before = torch.cuda.is_initialized()
    print(f"imported together: {stock.__name__}, {facc.__name__}, {p2p.__name__}; CUDA initialised by imports: {ctx_before}")
    out = {"imported": [stock.__name__, facc.__name__, p2p.__name__], "cuda_initialised_by_import": ctx_before}

    torch.manual_seed(0)
    dev = torch.device("cuda:0")
    x = torch.randn(64, 4096, dtype=torch.half, device=dev)
    w = torch.randn(4096, dtype=torch.half, device=dev)
    ys = []
    for m in (stock, facc):
        y = torch.empty_like(x)
        m.rms_norm(x, w, y, 1e-6, 0.0, 1.0, False, False)
        ys.append(y)
    torch.cuda.synchronize()
    same = torch.equal(ys[0], ys[1])
    print(f"rms_norm (untouched by the patch): stock == facc bit for bit: {same}")
    out["rms_norm_bit_identical"] = same

    M, K, N = 16, 8192, 4096
    a = torch.randn(M, K, dtype=torch.half, device=dev)
    b = torch.randn(K, N, dtype=torch.half, device=dev) / K ** 0.5
    ref = (a.double() @ b.double())
    errs = {}
    for name, m in (("stock", stock), ("facc", facc)):
        c = torch.empty(M, N, dtype=torch.half, device=dev)
        m.hgemm_f16acc(a, b, c)
        torch.cuda.synchronize()
        errs[name] = ((c.double() - ref).norm() / ref.norm()).item()
    c16 = (a @ b).double()
    errs["torch (cuBLAS)"] = ((c16 - ref).norm() / ref.norm()).item()
    for k, v in errs.items():
        print(f"hgemm M={M} K={K} N={N}: {k:15} relative error vs fp64 {v:.3e}")
    out["hgemm_rel_error"] = errs
    print(json.dumps(out))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
