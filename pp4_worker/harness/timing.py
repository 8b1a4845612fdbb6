"""Timing complete worker calls, the copy-bandwidth ceiling, and per-cell statistics.

A timed call is what the worker does for one request batch: write the request
inputs (query tokens, context lengths, seeds, T0/T1 mask) into the worker's pinned
input buffer, upload them to the GPU in one copy, then replay the cell's graph
(with --upload in-graph the copy is the graph's first node).  CUDA events bracket that on
an idle GPU (each call is synchronised before the next), so host gaps inside the
call are included.  Collectives between two GPUs, transport of inputs and proposals
between target and draft, and target verification are outside the timing.
"""
from __future__ import annotations

import time

import attrs
import torch

from pp4_worker.model import sampling
from pp4_worker.model.config import QUERY_BLOCK, CellKey
from pp4_worker.model.draft import DraftWorker, StaticInputs


@attrs.define
class CellTiming:
    cell: str
    samples_ms: list[float]
    median_ms: float
    p20_ms: float
    p80_ms: float
    iqr_over_median: float
    floor_ms: float | None = None  # weights read once per pass at the copy bandwidth
    floor_with_kv_ms: float | None = None  # plus the K/V slots attention reads
    ratio: float | None = None  # median / floor_ms

    def summary(self) -> dict:
        d = attrs.asdict(self)
        d.pop("samples_ms")
        return d


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    v = sorted(values)
    if not v:
        raise ValueError("no samples")
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def cell_stats(cell: str, samples_ms: list[float]) -> CellTiming:
    med = percentile(samples_ms, 50)
    iqr = percentile(samples_ms, 75) - percentile(samples_ms, 25)
    return CellTiming(cell, samples_ms, med, percentile(samples_ms, 20), percentile(samples_ms, 80),
                      iqr / med if med > 0 else float("nan"))


@attrs.define
class CopyBandwidth:
    bytes_per_s: float
    median_ms: float
    bytes_moved: int  # read + written per copy

    def as_dict(self) -> dict:
        return attrs.asdict(self)


def measure_copy_bandwidth(device: torch.device, nbytes: int, reps: int = 20) -> CopyBandwidth:
    """Device-to-device copy of ``nbytes``; counts bytes read plus bytes written."""
    n = nbytes // 4
    src = torch.arange(n, dtype=torch.int32, device=device)  # not zeros: no special-cased data
    dst = torch.empty_like(src)
    times = []
    for i in range(reps + 3):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            b.record()
            b.synchronize()
            ms = a.elapsed_time(b)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            ms = (time.perf_counter() - t0) * 1e3
        if i >= 3:
            times.append(ms)
    if not torch.equal(dst[-16:], src[-16:]):
        raise RuntimeError("copy-bandwidth probe copied wrong data")
    med = percentile(times, 50)
    moved = 2 * n * 4
    del src, dst
    return CopyBandwidth(moved / (med * 1e-3), med, moved)


class InputStager:
    """The timing fixture's request, packed as the worker's inputs are; ``stage`` is part of
    every timed call: it writes the request into the worker's (pinned) input buffer, after
    which the runner uploads it, in the graph or just before it (graphs.py)."""

    def __init__(self, worker: DraftWorker, states: list):
        B = len(states)
        self.worker = worker
        self.request = StaticInputs.allocate(torch.device("cpu"))
        self.request.query_tokens[:B] = torch.stack([s.query_tokens for s in states]).to(torch.int64)
        self.request.context_lengths[:B] = torch.tensor([s.context_length for s in states], dtype=torch.int64)
        self.request.seeds[:B] = torch.tensor([s.seed for s in states], dtype=torch.int64)
        self.request.t1_mask[:B] = torch.tensor(sampling.alternating_masks(B)[0], dtype=torch.bool)

    def stage(self, cell: CellKey) -> None:
        self.worker.inputs.packed.copy_(self.request.packed)


def time_cells(runners: dict, stager: InputStager, cells: list[CellKey], repetitions: int, calls: int,
               warmup: int, device: torch.device, log=print) -> dict[str, list[float]]:
    """Interleave every cell, ``calls`` timed calls each, over ``repetitions`` passes whose
    cell order reverses each time (so drift and order effects hit every cell alike)."""
    cuda = device.type == "cuda"
    samples: dict[str, list[float]] = {c.name: [] for c in cells}

    def one_call(cell: CellKey) -> float:
        runner = runners[cell]
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            stager.stage(cell)
            runner.run()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        stager.stage(cell)
        runner.run()
        return (time.perf_counter() - t0) * 1e3

    for cell in cells:
        for _ in range(warmup):
            one_call(cell)
    for rep in range(repetitions):
        order = cells if rep % 2 == 0 else list(reversed(cells))
        t0 = time.perf_counter()
        for cell in order:
            for _ in range(calls):
                samples[cell.name].append(one_call(cell))
        log(f"  repetition {rep + 1}/{repetitions} ({'forward' if rep % 2 == 0 else 'reversed'} order): "
            f"{time.perf_counter() - t0:.1f} s")
    return samples


def weight_floor(model, cell: CellKey, bandwidth: CopyBandwidth) -> tuple[float, float, dict]:
    """(weights floor ms, weights + KV floor ms, byte counts) for one call of ``cell``.

    A depth-D call makes D passes; each reads every weight once.  Embedding rows:
    the query block's B*5 then B per later pass.
    """
    passes = cell.depth
    w = model.weight_bytes_per_pass() * passes
    emb = model.embedding_bytes(cell.batch * QUERY_BLOCK + cell.batch * (cell.depth - 1))
    kv = model.kv_bytes_per_pass(cell.batch) * passes
    bw = bandwidth.bytes_per_s
    counts = {"passes": passes, "weight_bytes": w, "embedding_bytes": emb, "kv_bytes": kv}
    return (w + emb) / bw * 1e3, (w + emb + kv) / bw * 1e3, counts


def call_breakdown(runners: dict, stager: InputStager, cell: CellKey, calls: int, device: torch.device) -> dict:
    """Where a timed call's time goes outside its kernels (diagnostic, not the measurement):
    median ms of ``calls`` calls each of the host write of the request alone, the upload copy
    alone, the runner alone (the graph replay, plus the upload when it is not in the graph),
    staging and runner (what the timing measures), and the replay of a graph holding one tiny
    kernel (the launch itself).  Same events and idle start as a timed call."""
    if device.type != "cuda":
        return {}

    def median_of(fn) -> float:
        times = []
        for _ in range(calls):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return percentile(times, 50)

    runner = runners[cell]
    tiny = torch.zeros(1, device=device)
    empty = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        tiny.add_(1)  # warm-up outside capture
    torch.cuda.current_stream(device).wait_stream(side)
    with torch.cuda.graph(empty):
        tiny.add_(1)
    stager.stage(cell)
    runner.run()
    out = {
        "cell": cell.name,
        "calls": calls,
        "staging_ms": median_of(lambda: stager.stage(cell)),
        "upload_ms": median_of(runner.worker.upload),
        "replay_ms": median_of(runner.run),
        "staging_and_replay_ms": median_of(lambda: (stager.stage(cell), runner.run())),
        "one_kernel_graph_ms": median_of(empty.replay),
    }
    return out
