"""One worker run, phase by phase: device and GPU lock, model, states, exactness gate, timing.
The command line (cli.py) parses and checks the options, then hands them here."""

from __future__ import annotations

import os
import time

from pp4_worker.harness import guards
from pp4_worker.model.config import MODES, QUANTIZED_BACKENDS, CellKey, Exl3Options, Geometry, ModelSettings

STATE_COUNT = 12  # synthetic, and again captured


class EnvironmentProblem(RuntimeError):
    """This machine cannot run the requested configuration (no GPU, missing module...)."""


class Held:
    """Resources to release however the run ends."""

    def __init__(self):
        self.lock = None

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def run(args, argv: list[str], checked, cache_dir: str, caches_late: bool, rss: guards.RssGuard,
         held: Held) -> int:
    """The run's phases, in order: model settings, device and GPU lock, model, states, exactness
    gate, timing.  Each phase adds its part to the JSON document."""
    from pp4_worker.harness import report

    geometry, batch_sizes, depths, max_rss, copy_bytes = checked
    t_start = time.monotonic()
    settings = ModelSettings(
        geometry=geometry, dtype=args.dtype, context=args.context, weight_seed=args.weight_seed,
        weights_dir=args.weights, backend=args.backend, overlap_noise=not args.no_overlap_noise,
        attention=args.attention, head_chunks=args.head_chunks, gemm=args.gemm, pdl=args.pdl == "on",
        rank_streams=args.rank_streams == "on",
        exl3=Exl3Options(args.exl3_build, "exl3" if args.exl3_module == "stock" else "exl3-facc",
                         args.exl3_bits, args.exl3_head_bits, args.exl3_codebook, args.exl3_select,
                         args.exl3_fuse == "on")
        if args.backend in QUANTIZED_BACKENDS else None,
    )
    if args.export_weights:
        return _export_weights(args, geometry)
    # "pp4.worker": the name the reports already written (docs/worker-results/) carry, kept for their readers.
    doc: dict = {"tool": "pp4.worker", "format": 1, "argv": argv}
    gpu = _open_device(args, cache_dir, caches_late, held, max_rss)
    model, worker = _build_model(settings, gpu.device, doc)
    captured, all_states, states_digest = _states(args, worker, model, cache_dir, doc)
    cells = [CellKey(b, d, mode) for b in batch_sizes for d in depths for mode in MODES]
    runners, passed = _gate(args, worker, model, gpu, cells, all_states, states_digest, batch_sizes, depths, doc)
    doc.update(backend=args.backend, attention=args.attention, gemm=args.gemm, pdl=args.pdl, upload=args.upload,
               rank_streams=args.rank_streams, head_chunks=model.ranks[0].vocab_chunks, overlap_noise=settings.overlap_noise, ranks="colocated",
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

    from pp4_worker.model.weights import TORCH_DTYPES, SyntheticSource, export_safetensors

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


def _open_device(args, cache_dir: str, caches_late: bool, held: Held, max_rss: int | None) -> _Device:
    """The device, checked; on a GPU its lock taken (into held) and the pre-flight checks run."""
    import torch

    from pp4_worker.harness import gpu_info

    if args.device == "cuda" and not torch.cuda.is_available():
        raise EnvironmentProblem("--device cuda: no CUDA GPU is visible. On a CPU: --device cpu --geometry tiny "
                                 "(the eager path on a small model; the default 8B geometry takes minutes to build "
                                 "there and its calls crawl)")
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
    _say(f"pp4_worker: backend {args.backend} (attention {args.attention}, gemm {args.gemm}, pdl {args.pdl}, "
         f"upload {args.upload}), ranks colocated (2 logical TP ranks on one device, "
         f"{'side by side on two streams' if args.rank_streams == 'on' else 'one after the other'}), "
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
    from pp4_worker.model.backends import BackendUnavailable
    from pp4_worker.model.draft import DraftWorker
    from pp4_worker.model.model import TensorParallelDraft

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
    from pp4_worker.model import states as state_io

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
    from pp4_worker.harness import gate
    from pp4_worker.model.graphs import build_runners

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
    from pp4_worker.harness import gpu_info, report, timing

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
        from pp4_worker.harness import profiling

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
    from pp4_worker.harness import report

    doc.setdefault("guards", {})["peak_rss_bytes"] = rss.peak
    if args.json:
        report.write_json(args.json, doc)
        _say(f"JSON written to {args.json}")
    if args.plot:
        if timings:
            title = f"pp4_worker {doc.get('backend')} on {doc.get('gate', {}).get('runtime', {}).get('gpu')}"
            _say(report.write_plot(args.plot, timings, title))
        else:
            _say("plot skipped: no timing in this run")


def _torch_uuid(torch, device) -> str:
    u = str(torch.cuda.get_device_properties(device).uuid)
    return u if u.startswith("GPU-") else f"GPU-{u}"

