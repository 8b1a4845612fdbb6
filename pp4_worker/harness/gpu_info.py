"""Read-only GPU queries: identity, power limits, clocks, throttle reasons, processes.

pynvml (nvidia-ml-py) when importable, else ``nvidia-smi --query``; both only read.
Nothing here changes a setting of the card.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import attrs

# NVML clock-event ("throttle") reason bits that mean the card ran slower than it could.
THROTTLE_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}

SMI_FIELDS = [
    "uuid", "name", "driver_version", "power.limit", "power.default_limit", "enforced.power.limit",
    "power.max_limit", "power.draw", "clocks.sm", "clocks.mem", "clocks.max.sm", "temperature.gpu",
]


@attrs.define
class GpuSnapshot:
    uuid: str
    name: str = ""
    driver: str = ""
    power_limit_w: float | None = None
    default_power_limit_w: float | None = None
    max_power_limit_w: float | None = None
    power_draw_w: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    temperature_c: float | None = None
    throttle: list[str] = attrs.Factory(list)
    source: str = ""

    def as_dict(self) -> dict:
        return attrs.asdict(self)


def _num(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def _smi(args: list[str]) -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        return subprocess.run([exe, *args], capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # not installed, or no driver: fall back to nvidia-smi
        return None


def resolve_uuid(index: int) -> str | None:
    """UUID of CUDA device ``index`` as this process sees it, without creating a context."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if index >= len(entries):
            return None
        entry = entries[index]
        if entry.startswith(("GPU-", "MIG-")):
            return entry
        index = int(entry)
    out = _smi(["--query-gpu=index,uuid", "--format=csv,noheader"])
    if out is None:
        return None
    for line in out.strip().splitlines():
        i, uuid = (x.strip() for x in line.split(","))
        if int(i) == index:
            return uuid
    return None


def snapshot(uuid: str) -> GpuSnapshot:
    nv = _nvml()
    if nv is not None:
        try:
            return _snapshot_nvml(nv, uuid)
        except Exception:
            pass
    return _snapshot_smi(uuid)


def _snapshot_nvml(nv, uuid: str) -> GpuSnapshot:
    h = nv.nvmlDeviceGetHandleByUUID(uuid)
    s = GpuSnapshot(uuid=uuid, source="nvml")

    def get(fn, *a):
        try:
            return fn(h, *a)
        except Exception:
            return None

    name = get(nv.nvmlDeviceGetName)
    s.name = name.decode() if isinstance(name, bytes) else (name or "")
    try:
        drv = nv.nvmlSystemGetDriverVersion()
        s.driver = drv.decode() if isinstance(drv, bytes) else drv
    except Exception:
        pass
    mw = lambda v: None if v is None else v / 1000.0  # noqa: E731
    s.power_limit_w = mw(get(nv.nvmlDeviceGetEnforcedPowerLimit))
    s.default_power_limit_w = mw(get(nv.nvmlDeviceGetPowerManagementDefaultLimit))
    limits = get(nv.nvmlDeviceGetPowerManagementLimitConstraints)
    s.max_power_limit_w = mw(limits[1]) if limits else None
    s.power_draw_w = mw(get(nv.nvmlDeviceGetPowerUsage))
    s.sm_clock_mhz = get(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)
    s.mem_clock_mhz = get(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM)
    s.max_sm_clock_mhz = get(nv.nvmlDeviceGetMaxClockInfo, nv.NVML_CLOCK_SM)
    s.temperature_c = get(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
    reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    bits = get(reasons_fn) if reasons_fn else None
    if bits:
        s.throttle = [name for bit, name in THROTTLE_BITS.items() if bits & bit]
    return s


def _snapshot_smi(uuid: str) -> GpuSnapshot:
    s = GpuSnapshot(uuid=uuid, source="nvidia-smi")
    out = _smi([f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits", "-i", uuid])
    if out is None:
        s.source = "unavailable"
        return s
    vals = [v.strip() for v in out.strip().splitlines()[0].split(",")]
    f = dict(zip(SMI_FIELDS, vals))
    s.name, s.driver = f.get("name", ""), f.get("driver_version", "")
    s.power_limit_w = _num(f.get("enforced.power.limit", "")) or _num(f.get("power.limit", ""))
    s.default_power_limit_w = _num(f.get("power.default_limit", ""))
    s.max_power_limit_w = _num(f.get("power.max_limit", ""))
    s.power_draw_w = _num(f.get("power.draw", ""))
    s.sm_clock_mhz = _num(f.get("clocks.sm", ""))
    s.mem_clock_mhz = _num(f.get("clocks.mem", ""))
    s.max_sm_clock_mhz = _num(f.get("clocks.max.sm", ""))
    s.temperature_c = _num(f.get("temperature.gpu", ""))
    for field in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        r = _smi([f"--query-gpu={field}", "--format=csv,noheader", "-i", uuid])
        if r and r.strip().startswith("0x"):
            bits = int(r.strip(), 16)
            s.throttle = [name for bit, name in THROTTLE_BITS.items() if bits & bit]
            break
    return s


def compute_processes(uuid: str) -> list[dict] | None:
    """Other compute processes on the GPU (None when it cannot be read)."""
    nv = _nvml()
    if nv is not None:
        try:
            h = nv.nvmlDeviceGetHandleByUUID(uuid)
            return [{"pid": p.pid, "used_mib": (p.usedGpuMemory or 0) / 2**20}
                    for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]
        except Exception:
            pass
    out = _smi(["--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits", "-i", uuid])
    if out is None:
        return None
    procs = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            procs.append({"pid": int(parts[0]), "name": parts[1], "used_mib": _num(parts[2])})
    return procs


class ClockSampler:
    """Samples SM clock, power and throttle reasons while timing runs (a daemon thread)."""

    def __init__(self, uuid: str, interval_s: float = 0.25):
        self.uuid, self.interval = uuid, interval_s
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pp4-clock-sampler", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            s = snapshot(self.uuid)
            self.samples.append({"t_s": round(time.monotonic() - t0, 3), "sm_mhz": s.sm_clock_mhz,
                                 "power_w": s.power_draw_w, "throttle": s.throttle})
            self._stop.wait(self.interval)

    def summary(self, max_sm_mhz: float | None) -> dict:
        clocks = sorted(s["sm_mhz"] for s in self.samples if s["sm_mhz"])
        reasons = sorted({r for s in self.samples for r in s["throttle"]})
        out = {"samples": len(self.samples), "throttle_reasons_seen": reasons}
        if clocks:
            out.update(sm_mhz_min=clocks[0], sm_mhz_median=clocks[len(clocks) // 2], sm_mhz_max=clocks[-1])
        low = bool(clocks and max_sm_mhz and clocks[len(clocks) // 2] < 0.9 * max_sm_mhz)
        out["throttled"] = bool(reasons) or low
        return out
