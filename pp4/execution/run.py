"""Run one compile or link: under the build's limits, in the fixed execution root, observed.

The command runs with exactly the environment it is given (pp4/toolchain/compilerenv.py), a
temporary folder of its own, no GPU, and two additions that change no object and are in no key:
nvcc's --threads (how many architectures it compiles at once) and, for compiles, gcc's
`-Wdate-time -Wno-error=date-time` (nvcc: through -Xcompiler, which reaches both of its
preprocessing passes). The second reports a time macro that token pasting makes (CAT(__TIME,
STAMP__)), which no file's bytes name, and `Ran.time_macros` lists what it said (plain text or
-fdiagnostics-format=json); every other spelling is found in the bytes the compile read, which
-w or a system header cannot hide (pp4/reuse/timemacros.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import attrs

from pp4.execution import machine, observe
from pp4.execution.root import FIXED, TMP, Root, enter, unavailable
from pp4.execution.limits import apply, command_for
from pp4.toolchain.compilerenv import process_env
from pp4.toolchain.limits import Limits, cpus_not_allowed

# As gcc says it, and as its JSON diagnostics quote it (\").
DATE_TIME = re.compile(rb'macro \\?"(__DATE__|__TIME__|__TIMESTAMP__)\\?" might prevent reproducible builds')
TRACE_NAME = ".pp4-trace"


@attrs.frozen
class Ran:
    returncode: int
    started: float  # time.time() when it started
    seconds: float
    command: tuple[str, ...]  # as it ran, in the root's paths when root is set, launcher additions left out
    root: Root | None  # None: it ran where it is (why: root_problem)
    root_problem: str | None
    trace: observe.Trace | None  # None: not observed (why: trace_problem)
    trace_problem: str | None
    time_macros: tuple[str, ...]  # __DATE__, __TIME__, __TIMESTAMP__ that gcc's -Wdate-time reported
    tmp: str  # its temporary folder as it saw it
    stderr: bytes
    scratch: str = ""  # the folder of its temporary folder and trace (removed: nothing there outlives it)
    cpu_seconds: float | None = None  # user + system of its whole process tree, the observer's included
    # each path's answer once: a compile's 10,000 paths are asked about three times after it ran
    _reals: dict = attrs.field(factory=dict, init=False, eq=False, repr=False)

    def real(self, path: str) -> str | None:
        """Where a path it saw is on this machine; None for its own temporary folders."""
        try:
            return self._reals[path]
        except KeyError:
            pass
        if self.root is not None:
            found = self.root.real(path)
        else:
            found = None if path == self.scratch or path.startswith(self.scratch + "/") else path
        self._reals[path] = found
        return found


def date_time_flags(argv: list[str]) -> list[str]:
    if Path(argv[0]).name == "nvcc":
        return ["-Xcompiler", "-Wdate-time,-Wno-error=date-time"]
    return ["-Wdate-time", "-Wno-error=date-time"]


SOURCE_ROOT = FIXED + "/src"


def debug_prefix_maps(argv: list[str], root: Root) -> list[str]:
    """Flags that make what an object names of its extension's source root relative to that root,
    the same wherever the checkout and the build folder sit, as Bazel does: `__FILE__`,
    `std::source_location` and `assert` say `csrc/x.cpp` (-fmacro-prefix-map=/pp4/src/=), and debug
    information `./csrc/x.cpp` (-fdebug-prefix-map=/pp4/src=.), which gdb run from that root finds
    (a relative name is looked for in gdb's working folder). The root's other folders keep their
    fixed names (/pp4/torch/..., the working folder /pp4/work), which `source build/pp4.gdb` maps to
    this machine's (written by configure). For nvcc through -Xcompiler: its host compiler also
    preprocesses the device side, so device code's __FILE__ says the same. Given first, so that a
    map of the user's own, later on the command line, wins as gcc's last matching map does; the
    manifest key's format (pp4/reuse/wrapper.py) stands for them."""
    if not any(fixed == SOURCE_ROOT for fixed, _ in root.mounts):
        return []
    maps = [f"-fdebug-prefix-map={SOURCE_ROOT}=.", f"-fmacro-prefix-map={SOURCE_ROOT}/="]
    return [f"-Xcompiler={m}" for m in maps] if Path(argv[0]).name == "nvcc" else maps


def run(argv: list[str], env: dict[str, str], limits: Limits, scratch_parent: str | Path, root: Root | None,
        observed: bool = True, compile: bool = True, stdout: Path | None = None) -> Ran:
    """Run argv (this machine's paths) in `root` (None: where it is), observed unless `observed`
    is False or the observer cannot run here. Its stderr is returned, not printed; its stdout goes
    to the file `stdout` when given (else where the caller's goes)."""
    # The folders it writes, its scratch folder's included: a certain failure (read-only, no byte
    # free) is refused before anything starts, with the line that says why (pp4/execution/machine.py).
    writes = [*machine.written_folders(list(argv)), str(scratch_parent)]
    refused = machine.before(writes)
    if refused is not None:
        raise machine.MachineError(f"{machine.PREFIX} {refused}")
    # Said here, not in the child: a sched_setaffinity refused there is only "Exception occurred in preexec_fn".
    unplaceable = limits.cpus and cpus_not_allowed(limits.cpus, os.sched_getaffinity(0))
    if unplaceable:
        raise machine.MachineError(f"pp4: {unplaceable} (the build's limits, build/pp4.json)")
    root_problem = None
    if root is not None:
        root_problem = unavailable(str(scratch_parent))
        if root_problem is not None:
            root = None
    trace_problem = None if observed else "not asked for"
    if observed:
        trace_problem = observe.unavailable()
    Path(scratch_parent).mkdir(parents=True, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="run-", dir=scratch_parent)
    real_tmp = os.path.join(scratch, "tmp")
    os.mkdir(real_tmp)
    tmp = TMP if root is not None else real_tmp
    command = root.command(list(argv)) if root is not None else list(argv)
    full = command_for(limits, command)
    if compile:
        maps = debug_prefix_maps(command, root) if root is not None else []
        full = full[:1] + maps + full[1:] + date_time_flags(command)
    log = os.path.join(tmp, TRACE_NAME)
    if trace_problem is None:
        full = observe.command(log) + full

    def prepare() -> None:
        apply(limits)
        if root is not None:
            enter(root, scratch, real_tmp)

    started = time.time()
    t0 = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    oom_before = machine.oom_kills()
    # stderr to a file, not a pipe: in the root, the process that waits for the command keeps
    # subprocess's error pipe open until the command ends. A file in memory (memfd), not on a disk:
    # on a full build disk the compiler's own "No space left on device" must still be read back.
    # stdout to a file too (with stderr, unless asked for apart): the command's standard streams
    # are /dev/null and files of its own, never a terminal or a socket that could answer it.
    with os.fdopen(os.memfd_create("pp4-stderr", os.MFD_CLOEXEC), "w+b") as err:
        try:
            with open(stdout, "wb") if stdout else contextlib.nullcontext(err) as out:
                proc = subprocess.run(full, env=process_env(env, Path(tmp)), preexec_fn=prepare,
                                      stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                      cwd=None if root is not None else os.getcwd())
            returncode = proc.returncode
        except OSError as e:
            err.write(f"pp4: cannot run {full[0]}: {e}\n".encode())
            returncode = 127
        err.flush()
        err.seek(0)
        stderr = err.read()
    seconds = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if returncode != 0:  # the last line of what the edge shows, when the cause is the machine
        cause = machine.after(writes, stderr, oom_before, limits.address_space)
        if cause is not None:
            stderr += (b"" if not stderr or stderr.endswith(b"\n") else b"\n") + cause.encode() + b"\n"
    trace = None
    if trace_problem is None:
        try:
            trace = observe.parse(Path(real_tmp, TRACE_NAME).read_text(errors="surrogateescape"))
        except OSError as e:
            trace_problem = f"its trace cannot be read ({e})"
    shutil.rmtree(scratch, ignore_errors=True)
    macros = tuple(sorted({m.decode() for m in DATE_TIME.findall(stderr)}))
    return Ran(returncode, started, seconds, tuple(command), root, root_problem, trace, trace_problem, macros,
               tmp, stderr, scratch, round(cpu, 3))
