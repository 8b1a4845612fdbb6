"""``python -m pp4.worker``: guards, build, exactness gate, then timing and reports.

This module imports torch only inside ``run`` -- after the private cache
directories are in the environment.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from pp4.sizes import parse_size
from pp4.worker.harness import guards
from pp4.worker.model.config import (
    BACKENDS, BATCH_SIZES, DEFAULT_ATTENTION, DEFAULT_GEMM, DEFAULT_GEOMETRY, DEPTHS, DTYPES, EXL3_BITS, MODES,
    TINY_GEOMETRY, CellKey, Exl3Options, Geometry, ModelSettings
)

STATE_COUNT = 12  # synthetic, and again captured


class UsageError(Exception):
    pass


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
        prog="python -m pp4.worker",
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
                   help="on (the triton backend's default on CUDA; exl3 may ask for it): launch the Triton "
                        "kernels with programmatic dependent launch, so each starts while the one before it "
                        "finishes and waits in its first instruction for that one's writes; the same bits either way")
    a.add_argument("--head-chunks", type=int, default=None,
                   help="chunks each vocabulary shard row is reduced in (default: automatic; 1: one per row)")
    a.add_argument("--upload", choices=("before-graph", "in-graph"), default="before-graph",
                   help="where a call's one packed copy of the request inputs to the GPU runs: launched just "
                        "before the replay (default) or as the graph's first node (within run-to-run spread of each other "
                        "in two H200 A/B runs)")
    a.add_argument("--no-overlap-noise", action="store_true",
                   help="compute the Gumbel noise on the main stream instead of beside pass 0")
    e = p.add_argument_group("EXL3 kernels (--backend exl3)")
    e.add_argument("--exl3-build", metavar="DIR", default="build",
                   help="pp4 build directory holding the EXL3 module (default: build)")
    e.add_argument("--exl3-module", choices=("stock", "facc"), default="stock",
                   help="which pp4-built EXL3 module runs the kernels (targets exl3 and exl3-facc)")
    e.add_argument("--exl3-bits", type=int, default=Exl3Options().bits,
                   help=f"bits per weight of every linear but the head (default {Exl3Options().bits})")
    e.add_argument("--exl3-head-bits", type=int, default=Exl3Options().head_bits,
                   help=f"bits per weight of the output head (default {Exl3Options().head_bits})")
    e.add_argument("--exl3-select", choices=("heuristic", "autotune"), default=Exl3Options().select,
                   help="how EXL3's cooperative GEMM picks its kernel: heuristic (by the sizes, the same in "
                        "every process: digests reproduce; default) or autotune (exllamav3's own: by timing "
                        "candidates on first use, so another process may pick another kernel and other bits)")
    m = p.add_argument_group("model")
    m.add_argument("--geometry", choices=("default", "tiny"), default="default",
                   help="default: 8B-class draft (4096 hidden, 32/8 heads of 128, MLP 14336, vocab 128256); "
                        "tiny: the CPU test model")
    m.add_argument("--layers", type=int, default=1, help="1 to 5 (default 1)")
    for name in ("hidden", "heads", "kv-heads", "head-dim", "mlp", "vocab"):
        m.add_argument(f"--{name}", type=int, default=None, help=f"override the preset's {name}")
    m.add_argument("--context", type=int, default=1024, help="KV context length capacity (default 1024)")
    m.add_argument("--dtype", choices=DTYPES, default="float16")
    m.add_argument("--weights", metavar="DIR", help="safetensors weights (names in docs/worker.md)")
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
        args.pdl = "on" if args.backend == "triton" and args.device == "cuda" else "off"
    if args.pdl == "on" and args.backend == "torch":
        raise UsageError("--pdl on needs --backend triton or exl3 (the torch backend launches no Triton kernels)")
    if args.pdl == "on" and args.device != "cuda":
        raise UsageError("--pdl on needs --device cuda (programmatic dependent launch is a GPU launch attribute)")
    if args.attention == "fused" and args.backend == "torch":
        raise UsageError("--attention fused needs --backend triton or exl3 (--backend torch has gemm and sdpa)")
    if args.backend == "exl3":
        if args.device != "cuda":
            raise UsageError("--backend exl3 runs EXL3's CUDA kernels: it needs --device cuda")
        if args.dtype != "float16":
            raise UsageError(f"--backend exl3 needs --dtype float16 (EXL3's kernels take fp16), got {args.dtype}")
        for flag in ("exl3_bits", "exl3_head_bits"):
            if getattr(args, flag) not in EXL3_BITS:
                raise UsageError(f"--{flag.replace('_', '-')} must be between {EXL3_BITS.start} and "
                                 f"{EXL3_BITS.stop - 1}, got {getattr(args, flag)}")
    else:
        changed = [f for f in ("exl3_build", "exl3_module", "exl3_bits", "exl3_head_bits", "exl3_select")
                   if getattr(args, f) != build_parser().get_default(f)]
        if changed:
            raise UsageError(f"--{changed[0].replace('_', '-')} needs --backend exl3")
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


class EnvironmentProblem(RuntimeError):
    """This machine cannot run the requested configuration (no GPU, missing module...)."""


class _Held:
    """Resources to release however the run ends."""

    def __init__(self):
        self.lock = None

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        checked = validate(args)
    except UsageError as exc:
        parser.error(str(exc))  # exits 2 with "python -m pp4.worker: error: <message>"
    cache_dir, created = guards.setup_private_caches(args.cache_dir)
    late = guards.caches_were_late()
    rss = guards.RssGuard(checked[3])
    held = _Held()
    try:
        rss.start()  # inside the try: a trip at any point after this is handled below
        return _run(args, list(sys.argv[1:] if argv is None else argv), checked, cache_dir, late, rss, held)
    except guards.GuardError as exc:  # includes RssLimitExceeded (exit 3)
        print(f"pp4.worker: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except EnvironmentProblem as exc:
        print(f"pp4.worker: {exc}", file=sys.stderr, flush=True)
        return guards.EXIT_ENVIRONMENT
    finally:
        rss.stop()
        held.release()
        if created:
            shutil.rmtree(cache_dir, ignore_errors=True)


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def _run(args, argv: list[str], checked, cache_dir: str, caches_late: bool, rss: guards.RssGuard,
         held: _Held) -> int:
    """The run's phases, in order: model settings, device and GPU lock, model, states, exactness
    gate, timing.  Each phase adds its part to the JSON document."""
    from pp4.worker.harness import report

    geometry, batch_sizes, depths, max_rss, copy_bytes = checked
    t_start = time.monotonic()
    settings = ModelSettings(
        geometry=geometry, dtype=args.dtype, context=args.context, weight_seed=args.weight_seed,
        weights_dir=args.weights, backend=args.backend, overlap_noise=not args.no_overlap_noise,
        attention=args.attention, head_chunks=args.head_chunks, gemm=args.gemm, pdl=args.pdl == "on",
        exl3=Exl3Options(args.exl3_build, "exl3" if args.exl3_module == "stock" else "exl3-facc",
                         args.exl3_bits, args.exl3_head_bits, args.exl3_select) if args.backend == "exl3" else None,
    )
    if args.export_weights:
        return _export_weights(args, geometry)
    doc: dict = {"tool": "pp4.worker", "format": 1, "argv": argv}
    gpu = _open_device(args, cache_dir, caches_late, held, max_rss)
    model, worker = _build_model(settings, gpu.device, doc)
    captured, all_states, states_digest = _states(args, worker, model, cache_dir, doc)
    cells = [CellKey(b, d, mode) for b in batch_sizes for d in depths for mode in MODES]
    runners, passed = _gate(args, worker, model, gpu, cells, all_states, states_digest, batch_sizes, depths, doc)
    doc.update(backend=args.backend, attention=args.attention, gemm=args.gemm, pdl=args.pdl, upload=args.upload,
               head_chunks=model.ranks[0].vocab_chunks, overlap_noise=settings.overlap_noise, ranks="colocated",
               device=str(gpu.device), execution="cuda-graph" if gpu.cuda else "eager",
               geometry=geometry.as_dict(), dtype=args.dtype, context=args.context, cache_len=model.cache_len,
               weights=model.weights_fingerprint, weight_bytes_per_pass=model.weight_bytes_per_pass(),
               guards=gpu.guard_doc, notes=[report.EXCLUSIONS])
    if not passed:
        _finish(args, doc, rss, None)
        return guards.EXIT_GATE
    if args.gate_only:
        _finish(args, doc, rss, None)
        return 0
    timings = _time(args, worker, model, gpu, runners, cells, captured, copy_bytes, doc)
    _finish(args, doc, rss, timings)
    _say(f"done in {time.monotonic() - t_start:.0f} s")
    return 0


def _export_weights(args, geometry: Geometry) -> int:
    import torch

    from pp4.worker.model.model import TORCH_DTYPES, SyntheticSource, export_safetensors

    src = SyntheticSource(geometry, args.weight_seed, TORCH_DTYPES[args.dtype], torch.device("cpu"))
    try:
        _say(f"wrote {export_safetensors(src, args.export_weights)}")
    except RuntimeError as exc:
        raise EnvironmentProblem(str(exc)) from None
    return 0


class _Device:
    """The device a run uses, and what the GPU guards found before it started."""

    def __init__(self, device, uuid: str | None, guard_doc: dict, clocks_before: dict | None):
        self.device, self.uuid, self.guard_doc, self.clocks_before = device, uuid, guard_doc, clocks_before
        self.cuda = device.type == "cuda"


def _open_device(args, cache_dir: str, caches_late: bool, held: _Held, max_rss: int | None) -> _Device:
    """The device, checked; on a GPU its lock taken (into held) and the pre-flight checks run."""
    import torch

    from pp4.worker.harness import gpu_info

    if args.device == "cuda" and not torch.cuda.is_available():
        raise EnvironmentProblem("--device cuda: no CUDA GPU is visible (use --device cpu for the eager CPU path)")
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.ranks == "pair":
        if n_gpus < 2:
            raise EnvironmentProblem(f"--ranks pair needs 2 CUDA GPUs (one per rank, NCCL all-reduce); found {n_gpus}")
        raise EnvironmentProblem("--ranks pair is not implemented yet: RankShard and ColocatedSum are the seams "
                                 "(one process per GPU, NCCL all-reduce of the partials and an all-gather of ShardStats)")
    if args.device == "cuda" and args.gpu >= n_gpus:
        raise EnvironmentProblem(f"--gpu {args.gpu}: only {n_gpus} CUDA GPU(s) visible")
    device = torch.device("cuda", args.gpu) if args.device == "cuda" else torch.device("cpu")
    cuda = device.type == "cuda"
    _say(f"pp4.worker: backend {args.backend} (attention {args.attention}, gemm {args.gemm}, pdl {args.pdl}, "
         f"upload {args.upload}), ranks colocated (2 logical TP ranks on one device, one after the other), "
         f"device {device}, {'CUDA graphs' if cuda else 'eager (CPU: no graphs, host clock)'}")
    _say(f"private caches: {cache_dir}" + (" (torch was already imported: CUDA cache may be the default)"
                                           if caches_late else ""))
    guard_doc = {"cache_dir": cache_dir, "max_rss_bytes": max_rss}
    if not cuda:
        _say("CPU device: no GPU lock or pre-flight")
        return _Device(device, None, guard_doc, None)
    torch.cuda.set_device(device)
    uuid = gpu_info.resolve_uuid(args.gpu) or _torch_uuid(torch, device)
    lock = guards.GpuLock(args.lock_dir, uuid, args.lock_timeout)
    _say(f"GPU {uuid}: taking lock {lock.path} (up to {args.lock_timeout:g} s)")
    held.lock = lock.acquire()
    guard_doc.update(lock=lock.path, lock_waited_s=round(lock.waited_s, 3))
    pre = guards.preflight(uuid, args.expect_power_limit, os.getpid())
    guard_doc["preflight"] = pre.as_dict()
    _say(f"pre-flight: power limit {pre.power_limit_w} W (default {pre.default_power_limit_w} W), "
         f"other compute processes: {'unknown' if pre.other_processes is None else len(pre.other_processes)}")
    for problem in pre.problems:
        _say(f"  pre-flight {'REFUSED' if args.strict else 'warning'}: {problem}")
    if args.strict and pre.problems:
        raise guards.GuardError("--strict: pre-flight found problems (listed above); not running")
    return _Device(device, uuid, guard_doc, gpu_info.snapshot(uuid).as_dict())


def _build_model(settings: ModelSettings, device, doc: dict):
    from pp4.worker.model.backends import BackendUnavailable
    from pp4.worker.model.draft import DraftWorker
    from pp4.worker.model.model import TensorParallelDraft

    g = settings.geometry
    t0 = time.monotonic()
    try:
        model = TensorParallelDraft(settings, device)
    except BackendUnavailable as exc:
        raise EnvironmentProblem(str(exc)) from None
    except ValueError as exc:  # e.g. --head-chunks not dividing the shard vocabulary
        raise EnvironmentProblem(str(exc)) from None
    except RuntimeError as exc:
        if "safetensors" in str(exc) or "--weights" in str(exc):
            raise EnvironmentProblem(str(exc)) from None
        raise
    wbytes = model.weight_bytes_per_pass()
    _say(f"model: {g.layers} layer(s), hidden {g.hidden}, {g.heads}/{g.kv_heads} heads "
         f"of {g.head_dim}, MLP {g.mlp}, vocab {g.vocab}, {settings.dtype}, KV capacity "
         f"{model.cache_len} slots; weights {model.weights_fingerprint}; {wbytes / 1e9:.3f} GB read per pass "
         f"({time.monotonic() - t0:.1f} s to build)")
    kernels = model.backend.kernels()
    _say("kernels: " + "; ".join(f"{step}: {what}" for step, what in kernels.items()))
    if model.backend.quantized:
        module = model.backend.ext
        _say(f"EXL3 module: {module.__name__} from {module.__file__} (pp4-built, checked against its pin)")
        kernels["exl3_module"] = module.__file__
    doc["kernels"] = kernels
    return model, DraftWorker(model)


def _states(args, worker, model, cache_dir: str, doc: dict):
    """(captured states, all states, their digest): synthetic ones and ones captured from eager
    worker runs (loaded from --states, captured now into --capture-states, or privately)."""
    from pp4.worker.model import states as state_io

    synthetic = state_io.synthetic_states(worker, STATE_COUNT, args.state_seed)
    captured_dir = args.states
    if args.capture_states:
        t0 = time.monotonic()
        caps = state_io.capture_states(worker, STATE_COUNT)
        state_io.save_states(caps, args.capture_states, model.fingerprint())
        _say(f"captured {len(caps)} states from eager worker runs into {args.capture_states} "
             f"({time.monotonic() - t0:.1f} s)")
        captured_dir = captured_dir or args.capture_states
    if captured_dir is None:
        captured_dir = os.path.join(cache_dir, "states")
        caps = state_io.capture_states(worker, STATE_COUNT)
        state_io.save_states(caps, captured_dir, model.fingerprint())
        _say(f"no --states given: captured {len(caps)} states into {captured_dir} (private, removed at exit)")
    try:
        captured = state_io.load_states(captured_dir, model.fingerprint())
    except (FileNotFoundError, ValueError) as exc:
        raise EnvironmentProblem(str(exc)) from None
    all_states = synthetic + captured
    states_digest = state_io.states_digest(all_states)
    _say(f"states: {len(synthetic)} synthetic + {len(captured)} captured (loaded from {captured_dir}), "
         f"contexts {min(s.context_length for s in all_states)}-{max(s.context_length for s in all_states)}")
    doc["states"] = {"synthetic": len(synthetic), "captured": len(captured), "captured_dir": captured_dir,
                     "sha256": states_digest}
    return captured, all_states, states_digest


def _gate(args, worker, model, gpu: _Device, cells, all_states, states_digest: str, batch_sizes, depths,
          doc: dict):
    """(the runners to time, whether the exactness gate passed): graphs captured on a GPU, every
    cell checked against the eager path and, with --reference, against stored digests."""
    from pp4.worker.harness import gate
    from pp4.worker.model.graphs import build_runners

    t0 = time.monotonic()
    eager = build_runners(worker, cells, graphs=False)
    runners = (build_runners(worker, cells, graphs=True, upload_in_graph=args.upload == "in-graph")
               if gpu.cuda else eager)
    if gpu.cuda:
        _say(f"captured {len(cells)} CUDA graphs ({time.monotonic() - t0:.1f} s)")
    t0 = time.monotonic()
    _say(f"exactness gate on {len(all_states)} states, batch sizes {batch_sizes}, depths {depths}:")
    result = gate.run_gate(worker, runners, eager if gpu.cuda else None, all_states, batch_sizes, depths, log=_say)
    identity = gate.runtime_identity(gpu.device)
    config_sha = gate.config_fingerprint(model.fingerprint(), states_digest)
    ref_doc = None
    if args.reference:
        try:
            ref_failures = gate.check_reference(args.reference, result.digests, identity, config_sha)
        except (OSError, ValueError) as exc:
            ref_failures = [gate.GateFailure("reference", "-", (), None, f"cannot read {args.reference}: {exc}")]
        result.failures.extend(ref_failures)
        ref_doc = {"path": args.reference, "matched": not ref_failures}
        _say(f"  reference {args.reference}: {'all digests match' if not ref_failures else 'MISMATCH'}")
    doc["gate"] = {
        "ok": result.ok, "checks": result.checks, "batches": result.batches, "graph_vs_eager": result.graph_vs_eager,
        "failures": [f.describe() for f in result.failures[:200]], "failure_count": len(result.failures),
        "digests": result.digests, "config_sha256": config_sha, "runtime": identity, "reference": ref_doc,
        "seconds": round(time.monotonic() - t0, 1),
    }
    if not result.ok:
        _say(f"GATE FAILED: {len(result.failures)} difference(s); no timing reported.")
        for f in result.failures[:40]:
            _say("  " + f.describe())
        if len(result.failures) > 40:
            _say(f"  ... and {len(result.failures) - 40} more")
        return runners, False
    _say(f"gate passed: {result.checks} checks over {result.batches} batches "
         f"({'graph==eager included' if result.graph_vs_eager else 'eager only'}), {time.monotonic() - t0:.1f} s")
    if args.write_reference:
        gate.write_reference(args.write_reference, result.digests, identity, config_sha)
        _say(f"reference digests written to {args.write_reference}")
    return runners, True


def _time(args, worker, model, gpu: _Device, runners, cells, captured, copy_bytes: int, doc: dict):
    """Every cell timed against its weight-read floor; the diagnostics and clocks beside them."""
    from pp4.worker.harness import gpu_info, report, timing

    device, cuda, uuid, clocks_before = gpu.device, gpu.cuda, gpu.uuid, gpu.clocks_before
    wbytes = model.weight_bytes_per_pass()
    fixture = captured[:4]
    for slot, st in enumerate(fixture):
        worker.load_request(slot, st)
    stager = timing.InputStager(worker, fixture)
    bw = timing.measure_copy_bandwidth(device, copy_bytes)
    _say(f"device-to-device copy: {bw.bytes_per_s / 1e12:.3f} TB/s (read + write, {bw.bytes_moved / 1e9:.2f} GB "
         f"in {bw.median_ms:.3f} ms); weight-read floor of one pass {wbytes / bw.bytes_per_s * 1e3:.3f} ms")
    _say(f"timing {len(cells)} cells: {args.repetitions} repetitions x {args.calls} calls, order reversed each "
         f"repetition, fixture = captured states {[s.name for s in fixture]}")
    sampler = gpu_info.ClockSampler(uuid) if cuda else None
    if sampler:
        sampler.__enter__()
    try:
        samples = timing.time_cells(runners, stager, cells, args.repetitions, args.calls, args.warmup, device, log=_say)
    finally:
        if sampler:
            sampler.__exit__(None, None, None)
    breakdown = []
    if cuda:  # diagnostic: what the events hold besides the graph's kernels
        for cell in [c for c in cells if c.name in ("B1-D4-greedy", "B4-D5-switch")] or cells[:1]:
            b = timing.call_breakdown(runners, stager, cell, 200, device)
            breakdown.append(b)
            _say(f"outside the kernels, {cell.name} (median of 200, ms): staging {b['staging_ms']:.4f}, upload "
                 f"{b['upload_ms']:.4f}, replay "
                 f"{b['replay_ms']:.4f}, both {b['staging_and_replay_ms']:.4f}; a one-kernel graph "
                 f"{b['one_kernel_graph_ms']:.4f}")
    # After the timing, never before: the profiler (CUPTI) leaves the process with slower launches;
    # a profiled process timed up to 4% slower on the H200 (docs/worker.md, Timing).
    if args.profile and cuda:
        from pp4.worker.harness import profiling

        wanted = [c for c in cells if c.name in ("B1-D4-greedy", "B4-D4-greedy", "B4-D4-sampled", "B4-D4-switch")]
        try:
            doc["profile"] = profiling.profile_cells(runners, stager, wanted or cells[:1], args.profile, log=_say)
            _say(f"per-kernel profile written to {args.profile}")
        except Exception as exc:  # a profiler problem must not cost the measurement
            _say(f"profile skipped: {type(exc).__name__}: {exc}")
    timings, counts = [], {}
    for cell in cells:
        t = timing.cell_stats(cell.name, samples[cell.name])
        t.floor_ms, t.floor_with_kv_ms, counts[cell.name] = timing.weight_floor(model, cell, bw)
        t.ratio = t.median_ms / t.floor_ms
        timings.append(t)
    clocks_after = gpu_info.snapshot(uuid).as_dict() if cuda else None
    during = sampler.summary((clocks_before or {}).get("max_sm_clock_mhz")) if sampler else None
    note = ("times: CUDA events around input staging + graph replay, per call on an idle GPU; floor = weights "
            "read once per pass (D passes) at the copy bandwidth; ratio = median / floor; +KV adds the K/V slots "
            "attention reads" if cuda else "times: host wall clock around eager CPU calls (NOT a GPU measurement)")
    _say("")
    _say(report.timing_table(timings, note))
    _say(report.EXCLUSIONS)
    if cuda:
        _say(f"clocks: before SM {clocks_before.get('sm_clock_mhz')} MHz, during {during}, after SM "
             f"{clocks_after.get('sm_clock_mhz')} MHz; power limit {clocks_after.get('power_limit_w')} W"
             + ("  ** THROTTLING SEEN **" if during and during.get("throttled") else ""))
    doc["timing"] = {
        "method": note, "repetitions": args.repetitions, "calls_per_repetition": args.calls, "warmup": args.warmup,
        "fixture": [s.name for s in fixture], "copy_bandwidth": bw.as_dict(), "ratio_target": report.RATIO_TARGET,
        "cells": [dict(t.summary(), **counts[t.cell]) for t in timings],
        "samples_ms": {t.cell: [round(v, 5) for v in t.samples_ms] for t in timings},
        "breakdown": breakdown,
    }
    doc["clocks"] = {"before": clocks_before, "during": during, "after": clocks_after}
    return timings


def _finish(args, doc: dict, rss: guards.RssGuard, timings) -> None:
    from pp4.worker.harness import report

    doc.setdefault("guards", {})["peak_rss_bytes"] = rss.peak
    if args.json:
        report.write_json(args.json, doc)
        _say(f"JSON written to {args.json}")
    if args.plot:
        if timings:
            title = f"pp4.worker {doc.get('backend')} on {doc.get('gate', {}).get('runtime', {}).get('gpu')}"
            _say(report.write_plot(args.plot, timings, title))
        else:
            _say("plot skipped: no timing in this run")


def _torch_uuid(torch, device) -> str:
    u = str(torch.cuda.get_device_properties(device).uuid)
    return u if u.startswith("GPU-") else f"GPU-{u}"

