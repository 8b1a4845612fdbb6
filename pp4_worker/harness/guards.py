"""Resource guards: private caches, a lock per GPU, a pre-flight check, a resident-memory limit.

* Private caches: CUDA's JIT cache, Triton's and torch-extension build dirs must not
  land in (or be read from) a shared home directory; set before torch is imported.
* GPU lock: fcntl.flock on ``<lock dir>/<GPU UUID>.lock``, so two harness runs (or
  any tool honouring the same lock) never time the same card at once.
* Pre-flight: the card's power cap and other compute processes, reported; refused
  with --strict.
* RSS guard: a daemon thread reads /proc/self/statm; above the limit it stops the run
  cleanly (an exception in the main thread, exit code 3) and, if the main thread is
  stuck in native code, hard-exits after a grace period.
"""
from __future__ import annotations

import errno
import fcntl
import os
import signal
import socket
import sys
import tempfile
import threading
import time

import attrs

EXIT_GATE = 1
EXIT_USAGE = 2
EXIT_RSS = 3
EXIT_GUARD = 4
EXIT_ENVIRONMENT = 5

CACHE_VARIABLES = {
    "CUDA_CACHE_PATH": "cuda",
    "TRITON_CACHE_DIR": "triton",
    "TORCH_EXTENSIONS_DIR": "torch_extensions",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "EXLLAMAV3_TUNE_CACHE": "exllamav3_tune",  # EXL3's GEMM autotuner keeps its choices on disk
}



class GuardError(RuntimeError):
    """A guard refused to start or stopped the run; ``exit_code`` says which."""

    def __init__(self, message: str, exit_code: int = EXIT_GUARD):
        super().__init__(message)
        self.exit_code = exit_code


# ---------------------------------------------------------------------------- private caches
def setup_private_caches(base: str | None) -> tuple[str, bool]:
    """Point every JIT/build cache at ``base`` (a fresh 0700 temp dir when None).

    Returns (dir, created_here).  Must run before torch is imported: CUDA reads
    CUDA_CACHE_PATH when it initialises, Triton and torch.utils.cpp_extension read
    theirs when first used.
    """
    created = base is None
    if created:
        base = tempfile.mkdtemp(prefix="pp4-worker-cache-")
    os.makedirs(base, mode=0o700, exist_ok=True)
    for var, sub in CACHE_VARIABLES.items():
        path = os.path.join(base, sub)
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.environ[var] = path
    return base, created


def caches_were_late() -> bool:
    """True when torch was imported before the caches were redirected (in-process use)."""
    return "torch" in sys.modules


# ---------------------------------------------------------------------------- GPU lock
class GpuLock:
    """Exclusive flock on ``<lock_dir>/<uuid>.lock``, waiting up to ``timeout_s``."""

    POLL_S = 0.2

    def __init__(self, lock_dir: str, uuid: str, timeout_s: float):
        self.path = os.path.join(lock_dir, f"{uuid}.lock")
        self.lock_dir, self.uuid, self.timeout_s = lock_dir, uuid, timeout_s
        self.fd: int | None = None
        self.waited_s = 0.0

    def acquire(self) -> "GpuLock":
        os.makedirs(self.lock_dir, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        t0 = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
            if time.monotonic() - t0 >= self.timeout_s:
                holder = self._holder(fd)
                os.close(fd)
                raise GuardError(
                    f"GPU {self.uuid} is locked by another run ({holder}); waited {self.timeout_s:g} s "
                    f"for {self.path} (raise --lock-timeout to wait longer)"
                )
            time.sleep(self.POLL_S)
        self.waited_s = time.monotonic() - t0
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
        self.fd = fd
        return self

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            text = os.read(fd, 200).decode(errors="replace").strip()
            return text or "holder unknown"
        except OSError:
            return "holder unknown"

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


# ---------------------------------------------------------------------------- pre-flight
@attrs.define
class Preflight:
    power_limit_w: float | None
    default_power_limit_w: float | None
    other_processes: list[dict] | None
    problems: list[str]

    def as_dict(self) -> dict:
        return attrs.asdict(self)


def preflight(uuid: str, expect_power_w: float | None, own_pid: int) -> Preflight:
    from pp4_worker.harness import gpu_info

    snap = gpu_info.snapshot(uuid)
    procs = gpu_info.compute_processes(uuid)
    others = None if procs is None else [p for p in procs if p["pid"] != own_pid]
    problems = []
    if others:
        problems.append(f"{len(others)} other compute process(es) on the GPU: "
                        + ", ".join(f"pid {p['pid']}" for p in others))
    if others is None:
        problems.append("could not list compute processes on the GPU")
    cap, default = snap.power_limit_w, snap.default_power_limit_w
    if expect_power_w is not None:
        if cap is None or abs(cap - expect_power_w) > 1.0:
            problems.append(f"power limit is {cap} W, expected {expect_power_w:g} W")
    elif cap is not None and default is not None and cap < default - 1.0:
        problems.append(f"power limit {cap:g} W is below the default {default:g} W (capped card)")
    if cap is None:
        problems.append("could not read the power limit")
    return Preflight(cap, default, others, problems)


# ---------------------------------------------------------------------------- RSS guard
class RssLimitExceeded(GuardError):
    def __init__(self, message: str):
        super().__init__(message, EXIT_RSS)


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


class RssGuard:
    """Polls this process's resident set size; trips once above ``limit_bytes``.

    On trip: records the message, raises RssLimitExceeded in the main thread (via
    SIGUSR1 to the main thread + a handler that raises), and if that handler has not
    run ``grace_s`` later (native code that does not return), prints the message and
    exits with code 3.
    """

    def __init__(self, limit_bytes: int, interval_s: float = 0.25, grace_s: float = 30.0,
                 interrupt_main: bool = True):
        self.limit, self.interval, self.grace = limit_bytes, interval_s, grace_s
        self.interrupt_main = interrupt_main
        self.tripped = threading.Event()
        self.message = ""
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pp4-rss-guard", daemon=True)
        self._old_handler = None

    def start(self) -> "RssGuard":
        if self.interrupt_main and threading.current_thread() is threading.main_thread():
            self._old_handler = signal.signal(signal.SIGUSR1, self._raise_in_main)
        else:
            self.interrupt_main = False
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._old_handler is not None:
            signal.signal(signal.SIGUSR1, self._old_handler)
            self._old_handler = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _raise_in_main(self, signum, frame):
        # The main thread runs Python again, so the hard exit (for native code that never
        # returns) is not needed: disarm it here, not only in stop(), because the signal may
        # land before a ``with`` body is entered, and then __exit__ never runs.
        self._stop.set()
        if self._old_handler is not None:
            signal.signal(signal.SIGUSR1, self._old_handler)
            self._old_handler = None
        raise RssLimitExceeded(self.message)

    def _loop(self) -> None:
        while not self._stop.is_set():
            rss = current_rss_bytes()
            self.peak = max(self.peak, rss)
            if rss > self.limit:
                self.message = (
                    f"resident memory {rss / 2**30:.2f} GiB exceeds --max-rss {self.limit / 2**30:.2f} GiB; "
                    "run stopped"
                )
                self.tripped.set()
                if self.interrupt_main:
                    # A real signal (not _thread.interrupt_main) also wakes a main thread
                    # blocked in sleep or I/O; the handler raises there.
                    signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
                    if not self._stop.wait(self.grace):
                        sys.stderr.write(f"pp4_worker: {self.message} (hard exit)\n")
                        sys.stderr.flush()
                        os._exit(EXIT_RSS)
                return
            self._stop.wait(self.interval)
