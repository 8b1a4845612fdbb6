"""Optional per-kernel profile of graph replays (``--profile PATH``), to see where a call's time goes.

Not part of the measurement: the timed numbers come from timing.py.  Uses the
torch profiler (CUPTI), which also reports kernels launched by graph replay.
"""
from __future__ import annotations

import collections

import torch


def _category(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("gemm", "gemv", "cutlass", "cublas", "sm90_xmma", "nvjet", "splitk", "linear_kernel")):
        return "gemm"
    if any(k in n for k in ("fmha", "attention", "flash", "efficient")):
        return "attention"
    if "memcpy" in n or "memset" in n:
        return "copy"
    return "other"


def covered_us(intervals) -> float:
    """Time during which at least one of the (start, end) intervals runs.  With programmatic
    dependent launch a kernel starts before its predecessor ends (and waits inside), so
    summing durations would count that stretch twice."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start >= reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def profile_cells(runners: dict, stager, cells, path: str, log=print) -> dict:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    summary, lines = {}, []
    for cell in cells:
        runner = runners[cell]
        stager.stage(cell)
        runner.run()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            stager.stage(cell)  # exactly one call under the profiler: no need to split calls
            runner.run()
            torch.cuda.synchronize()
        call = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                      key=lambda e: e.time_range.start)
        if len(call) < 4:
            summary[cell.name] = {"error": f"profiler returned {len(call)} device events"}
            continue
        span = call[-1].time_range.end - call[0].time_range.start
        durations = sum(e.time_range.elapsed_us() for e in call)
        busy = covered_us((e.time_range.start, e.time_range.end) for e in call)
        by_cat = collections.Counter()
        by_name = collections.defaultdict(lambda: [0, 0.0])
        for e in call:
            by_cat[_category(e.name)] += e.time_range.elapsed_us()
            by_name[e.name][0] += 1
            by_name[e.name][1] += e.time_range.elapsed_us()
        summary[cell.name] = {"span_us": round(span, 1), "kernel_busy_us": round(busy, 1), "kernels": len(call),
                              "kernel_overlap_us": round(durations - busy, 1),
                              "by_category_us": {k: round(v, 1) for k, v in by_cat.items()}}
        lines.append(f"=== {cell.name}: span {span:.1f} us, kernels {len(call)}, busy {busy:.1f} us, "
                     f"idle between kernels {span - busy:.1f} us, kernels overlapping {durations - busy:.1f} us "
                     "(with --pdl on a kernel starts early and its duration includes its wait for the one "
                     "before); by category (durations) " +
                     ", ".join(f"{k} {v:.1f} us" for k, v in by_cat.most_common()))
        lines.append("  top kernels by total time (count, total us, mean us, name):")
        for name, (count, total) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:25]:
            lines.append(f"    {count:4d} {total:9.1f} {total / count:8.2f}  {name[:150]}")
        lines.append("  kernels of the call in order (start offset us, duration us, gap before us (negative: started before the previous one ended), name):")
        prev_end = call[0].time_range.start
        t0 = call[0].time_range.start
        for e in call:
            lines.append(f"    {e.time_range.start - t0:9.1f} {e.time_range.elapsed_us():8.2f} "
                         f"{e.time_range.start - prev_end:7.2f}  {e.name[:110]}")
            prev_end = e.time_range.end
        log(f"  profile {cell.name}: span {span:.1f} us, {len(call)} kernels, busy {busy:.1f} us")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return summary
