"""``python -m pp4_worker``: guards, build, exactness gate, then timing and reports.

torch is imported only inside ``run.run`` (pp4_worker/harness/run.py), after the private cache
directories are in the environment.
"""
from __future__ import annotations

import argparse
import re
import shutil
import sys
import warnings

from pp4_worker.harness import guards
from pp4_worker.harness.run import EnvironmentProblem, Held, run
from pp4_worker.model.config import (
    BACKENDS, BATCH_SIZES, DEFAULT_ATTENTION, DEFAULT_GEMM, DEFAULT_GEOMETRY, DEPTHS, DTYPES, EXL3_BITS,
    QUANTIZED_BACKENDS, TINY_GEOMETRY, Exl3Options, Geometry, ModelSettings
)


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it and as pp4's own commands end
# The worker reads sizes as pp4.sizes does, with its own few lines: it needs pp4 only through the
# loader and the pin (tests/test_layers.py).
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(?:i?b)?\s*", re.IGNORECASE)


class UsageError(Exception):
    pass


def parse_size(text: str) -> int:
    """Bytes from "48G", "512M", "1.5GiB" or "1048576" (powers of 1024); exact for whole numbers."""
    match = _SIZE.fullmatch(str(text))
    if not match:
        raise ValueError(f"not a size: {text!r} (use a byte count or a number with K, M, G, T or P, e.g. 48G)")
    number, unit = match.groups()
    scale = 1024 ** ("KMGTP".index(unit.upper()) + 1) if unit else 1
    return int(float(number) * scale) if "." in number else int(number) * scale


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not values:
        raise UsageError(f"{flag}: expected comma-separated integers, got {text!r}")
    return sorted(set(values))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pp4_worker",
        description="Time one whole TP2 speculative-decoding draft-worker call per cell on one GPU, "
                    "after an exactness gate.",
    )
    a = p.add_argument_group("device and kernels")
    a.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: graphs + CUDA-event timing; cpu: eager only, host clock (tests, dry runs)")
    a.add_argument("--gpu", type=int, default=0, help="CUDA device index (default 0)")
    a.add_argument("--backend", choices=BACKENDS, default="torch")
    a.add_argument("--ranks", choices=("colocated", "pair"), default="colocated",
                   help="colocated: both TP ranks on one GPU, one after the other; pair: two GPUs (not yet)")
    a.add_argument("--attention", choices=("fused", "gemm", "sdpa"), default=None,
                   help="fused: split-KV Triton kernels (triton backend's default); gemm: two batched GEMMs "
                        "around an fp32 softmax (torch backend's default); sdpa: torch's fused kernel")
    a.add_argument("--gemm", choices=("cublas", "triton"), default=None,
                   help="triton (the triton backend's default): qkv, down and the head through a skinny "
                        "Triton GEMM (split-K where it pays); cublas: every linear through torch.mm "
                        "(the other backends' default)")
    a.add_argument("--pdl", choices=("on", "off"), default=None,
                   help="on (the triton and exl3-decode backends' default on CUDA; exl3 may ask for it): launch "
                        "the Triton kernels (and exl3-decode's) with programmatic dependent launch, so each starts while the one before it "
                        "finishes and waits in its first instruction for that one's writes; the same bits either way")
    a.add_argument("--head-chunks", type=int, default=None,
                   help="chunks each vocabulary shard row is reduced in (default: automatic; 1: one per row)")
    a.add_argument("--upload", choices=("before-graph", "in-graph"), default="before-graph",
                   help="where a call's one packed copy of the request inputs to the GPU runs: launched just "
                        "before the replay (default) or as the graph's first node (within run-to-run spread of each other "
                        "in two H200 A/B runs)")
    a.add_argument("--rank-streams", choices=("on", "off"), default=None,
                   help="on (the triton and exl3-decode backends' default on CUDA): each rank's attention, MLP "
                        "and head on a CUDA stream of its own, side by side, joined where the ranks' partials are "
                        "added, as two GPUs would run them; off: the ranks one after the other. The same kernels "
                        "on the same inputs, so the same bits either way")
    a.add_argument("--no-overlap-noise", action="store_true",
                   help="compute the Gumbel noise on the main stream instead of beside pass 0")
    e = p.add_argument_group("EXL3 kernels (--backend exl3: upstream's; --backend exl3-decode: pp4's decode GEMM)")
    e.add_argument("--exl3-build", metavar="DIR", default="build",
                   help="pp4 build directory holding the EXL3 module (default: build)")
    e.add_argument("--exl3-module", choices=("stock", "facc"), default="stock",
                   help="which pp4-built EXL3 module runs the kernels (targets exl3 and exl3-facc)")
    e.add_argument("--exl3-bits", type=int, default=Exl3Options().bits,
                   help=f"bits per weight of every linear but the head (default {Exl3Options().bits})")
    e.add_argument("--exl3-head-bits", type=int, default=Exl3Options().head_bits,
                   help=f"bits per weight of the output head (default {Exl3Options().head_bits})")
    e.add_argument("--exl3-codebook", choices=("3inst", "mcg", "mul1"), default=Exl3Options().codebook,
                   help="the synthetic weights' codebook (default mul1, what exllamav3's conversion writes); a "
                        "checkpoint given with --weights names its own")
    e.add_argument("--exl3-select", choices=("heuristic", "autotune"), default=Exl3Options().select,
                   help="how EXL3's cooperative GEMM picks its kernel: heuristic (by the sizes, the same in "
                        "every process: digests reproduce; default) or autotune (exllamav3's own: by timing "
                        "candidates on first use, so another process may pick another kernel and other bits)")
    e.add_argument("--exl3-fuse", choices=("on", "off"), default="on",
                   help="--backend exl3-decode: run each norm, and silu*mul, in one kernel with the input "
                        "transform of the linear after it (default on; off: every step its own kernel, as an A/B)")
    m = p.add_argument_group("model")
    m.add_argument("--geometry", choices=("default", "tiny"), default="default",
                   help="default: 8B-class draft (4096 hidden, 32/8 heads of 128, MLP 14336, vocab 128256); "
                        "tiny: the CPU test model")
    m.add_argument("--layers", type=int, default=1, help="1 to 5 (default 1)")
    for name in ("hidden", "heads", "kv-heads", "head-dim", "mlp", "vocab"):
        m.add_argument(f"--{name}", type=int, default=None, help=f"override the preset's {name}")
    m.add_argument("--context", type=int, default=1024, help="KV context length capacity (default 1024)")
    m.add_argument("--dtype", choices=DTYPES, default="float16")
    m.add_argument("--weights", metavar="DIR",
                   help="safetensors weights (names in docs/worker.md); with --backend exl3 or exl3-decode, a "
                        "checkpoint as exllamav3 writes it, whose config.json gives the geometry")
    m.add_argument("--weight-seed", type=lambda s: int(s, 0), default=ModelSettings(DEFAULT_GEOMETRY).weight_seed)
    m.add_argument("--export-weights", metavar="DIR", help="write the synthetic weights as safetensors and exit")
    s = p.add_argument_group("cells and states")
    s.add_argument("--batch-sizes", default="1,2,3,4")
    s.add_argument("--depths", default="4,5")
    s.add_argument("--states", metavar="DIR", help="load the 12 captured states from DIR")
    s.add_argument("--capture-states", metavar="DIR",
                   help="run the worker, save the 12 states it produces in DIR (then load them back)")
    s.add_argument("--state-seed", type=lambda s: int(s, 0), default=0x57A7E)
    g = p.add_argument_group("gate")
    g.add_argument("--reference", metavar="PATH", help="check every cell's output digest against this JSON")
    g.add_argument("--write-reference", metavar="PATH", help="write this run's digests as a reference JSON")
    g.add_argument("--gate-only", action="store_true", help="stop after the gate (no timing)")
    t = p.add_argument_group("timing and output")
    t.add_argument("--repetitions", type=int, default=5)
    t.add_argument("--calls", type=int, default=50, help="timed calls per cell per repetition")
    t.add_argument("--warmup", type=int, default=5, help="untimed calls per cell before timing")
    t.add_argument("--copy-bytes", default=None, help="buffer size of the copy-bandwidth probe (2G on CUDA, 64M on CPU)")
    t.add_argument("--profile", metavar="PATH",
                   help="after the gate, write a per-kernel profile of one replay of a few cells to PATH (text)")
    t.add_argument("--json", metavar="PATH")
    t.add_argument("--plot", metavar="PATH")
    r = p.add_argument_group("guards")
    r.add_argument("--lock-dir", default="/tmp/pp4-gpu-locks")
    r.add_argument("--lock-timeout", type=float, default=600.0, help="seconds to wait for the GPU lock")
    r.add_argument("--strict", action="store_true",
                   help="refuse to run if other processes use the GPU or its power limit is capped/unexpected")
    r.add_argument("--expect-power-limit", type=float, metavar="WATTS")
    r.add_argument("--max-rss", default="48G", help="resident-memory limit of this process (default 48G)")
    r.add_argument("--cache-dir", help="private CUDA/Triton/extension cache dir (default: a fresh temp dir)")
    return p


def validate(args) -> tuple[Geometry, list[int], list[int], int, int]:
    batch_sizes = _int_list(args.batch_sizes, "--batch-sizes")
    for b in batch_sizes:
        if b not in BATCH_SIZES:
            raise UsageError(f"--batch-sizes: each batch size must be between 1 and 4, got {b}")
    depths = _int_list(args.depths, "--depths")
    for d in depths:
        if d not in DEPTHS:
            raise UsageError(f"--depths: each depth must be 4 or 5, got {d}")
    if not 1 <= args.layers <= 5:
        raise UsageError(f"--layers must be between 1 and 5, got {args.layers}")
    if args.context < 32:
        raise UsageError(f"--context must be at least 32, got {args.context}")
    for flag in ("repetitions", "calls"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must not be negative, got {args.warmup}")
    try:
        max_rss = parse_size(args.max_rss)
    except ValueError as exc:
        raise UsageError(f"--max-rss: {exc}") from None
    try:
        copy_bytes = parse_size(args.copy_bytes or ("2G" if args.device == "cuda" else "64M"))
    except ValueError as exc:
        raise UsageError(f"--copy-bytes: {exc}") from None
    if args.reference and args.write_reference:
        raise UsageError("use either --reference or --write-reference, not both")
    if args.export_weights and args.weights:
        raise UsageError("--export-weights writes the synthetic weights; it cannot be combined with --weights")
    if args.lock_timeout < 0:
        raise UsageError(f"--lock-timeout must not be negative, got {args.lock_timeout}")
    if args.attention is None:
        args.attention = DEFAULT_ATTENTION[args.backend]
    if args.gemm is None:
        args.gemm = DEFAULT_GEMM[args.backend]
    if args.gemm != "cublas" and args.backend != "triton":
        raise UsageError(f"--gemm {args.gemm} needs --backend triton")
    if args.pdl is None:
        args.pdl = "on" if args.backend in ("triton", "exl3-decode") and args.device == "cuda" else "off"
    if args.pdl == "on" and args.backend == "torch":
        raise UsageError("--pdl on needs --backend triton or exl3 (the torch backend launches no Triton kernels)")
    if args.rank_streams is None:
        args.rank_streams = "on" if args.backend in ("triton", "exl3-decode") and args.device == "cuda" else "off"
    if args.rank_streams == "on" and args.device != "cuda":
        raise UsageError("--rank-streams on needs --device cuda (streams are CUDA's)")
    if args.rank_streams == "on" and args.backend == "exl3":
        raise UsageError("--rank-streams on: --backend exl3's GEMM (upstream's) keeps one lock buffer per device, "
                         "which two ranks at once would share; use --rank-streams off")
    if args.pdl == "on" and args.device != "cuda":
        raise UsageError("--pdl on needs --device cuda (programmatic dependent launch is a GPU launch attribute)")
    if args.attention == "fused" and args.backend == "torch":
        raise UsageError("--attention fused needs --backend triton or exl3 (--backend torch has gemm and sdpa)")
    if args.backend in QUANTIZED_BACKENDS:
        if args.device != "cuda":
            raise UsageError(f"--backend {args.backend} runs EXL3's CUDA kernels: it needs --device cuda")
        if args.dtype != "float16":
            raise UsageError(f"--backend {args.backend} needs --dtype float16 (EXL3's kernels take fp16), "
                             f"got {args.dtype}")
        for flag in ("exl3_bits", "exl3_head_bits"):
            if getattr(args, flag) not in EXL3_BITS:
                raise UsageError(f"--{flag.replace('_', '-')} must be between {EXL3_BITS.start} and "
                                 f"{EXL3_BITS.stop - 1}, got {getattr(args, flag)}")
    else:
        changed = [f for f in ("exl3_build", "exl3_module", "exl3_bits", "exl3_head_bits", "exl3_select",
                               "exl3_codebook") if getattr(args, f) != build_parser().get_default(f)]
        if changed:
            raise UsageError(f"--{changed[0].replace('_', '-')} needs --backend exl3 or exl3-decode")
    if args.exl3_fuse != "on" and args.backend != "exl3-decode":
        raise UsageError("--exl3-fuse needs --backend exl3-decode (the fused kernels are pp4's decode GEMM's)")
    if args.weights and args.backend in QUANTIZED_BACKENDS:
        from pp4_worker.model import exl3_checkpoint

        try:
            geometry = exl3_checkpoint.read_geometry(args.weights)
        except exl3_checkpoint.CheckpointError as exc:
            raise UsageError(str(exc)) from None
        problems = geometry.problems()
        if problems:
            raise UsageError(f"--weights {args.weights}: its geometry cannot be split for TP2: " + "; ".join(problems))
        return geometry, batch_sizes, depths, max_rss, copy_bytes
    base = TINY_GEOMETRY if args.geometry == "tiny" else DEFAULT_GEOMETRY
    overrides = {"layers": args.layers}
    for name in ("hidden", "heads", "kv_heads", "head_dim", "mlp", "vocab"):
        v = getattr(args, name)
        if v is not None:
            overrides[name] = v
    geometry = Geometry(**{**base.as_dict(), **overrides})
    problems = geometry.problems()
    if problems:
        raise UsageError("geometry: " + "; ".join(problems))
    return geometry, batch_sizes, depths, max_rss, copy_bytes


def main(argv: list[str] | None = None) -> int:
    """Ctrl-C ends the run with one line and 130, no traceback; the `finally` blocks below still
    release the GPU lock and remove the private caches on the way out."""
    try:
        return run_command(argv)
    except KeyboardInterrupt:
        print("pp4_worker: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def run_command(argv: list[str] | None) -> int:
    # torch warns at import when NumPy is missing or built for another ABI; the worker never uses NumPy.
    warnings.filterwarnings("ignore", message=r"Failed to initiali[sz]e NumPy", category=UserWarning)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        checked = validate(args)
    except UsageError as exc:
        parser.error(str(exc))  # exits 2 with "python -m pp4_worker: error: <message>"
    cache_dir, created = guards.setup_private_caches(args.cache_dir)
    late = guards.caches_were_late()
    rss = guards.RssGuard(checked[3])
    held = Held()
    try:
        rss.start()  # inside the try: a trip at any point after this is handled below
        return run(args, list(sys.argv[1:] if argv is None else argv), checked, cache_dir, late, rss, held)
    except guards.GuardError as exc:  # includes RssLimitExceeded (exit 3)
        print(f"pp4_worker: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except EnvironmentProblem as exc:
        print(f"pp4_worker: {exc}", file=sys.stderr, flush=True)
        return guards.EXIT_ENVIRONMENT
    finally:
        rss.stop()
        held.release()
        if created:
            shutil.rmtree(cache_dir, ignore_errors=True)
