"""The observer, the observation sets and the fixed root, on their own: pp4-observe's log read as
it wrote it, states of paths now, sets named by content, commands mapped into the root."""

from __future__ import annotations

import ctypes
import hashlib
import errno
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from pp4.execution import observe
from pp4.execution.root import Root
from pp4.execution.run import run
from pp4.reuse import inputsets, observations, pathstates
from pp4.reuse.actionkey import FileHasher
from pp4.store import hashed, packs
from pp4.toolchain.limits import Limits

LOG = """\
100\texecve\t0\t\t/usr/bin/gcc
100\topenat\t0\t\t/work/a.c
100\tnewfstatat\t2\t\t/work/inc/x.h
101\texecve\t0\t\t/usr/lib/cc1
101\texecve\t2\t\t/usr/local/bin/as
101\taccess\t0\t\t/work/rel.h
101\treadlink\t0\t\t/usr/lib
101\tlstat\t0\t\t/a\\tb c\u00e9\\\\d
101\topenat\t2\tn\t/work/link.h
101\tnewfstatat\t0\tn\t/work/link.h
101\topenat\t0\tw\t/work/out.o
101\tgetdents64\t0\t\t/tmp
101\tunlink\t0\t\t/tmp/cc123.s
101\trename\t0\t\t/work/o.tmp\t/work/o
101\tnewfstatat\t0\te\t
101\topenat\t0\t\t/proc/cpuinfo
101\tchdir\t0\t\t/work/sub
"""


def observed_program(tmp_path, name: str, source: str):
    """A small C program built with the observer's own compiler, to run under the observer (the
    test is skipped where the observer cannot run)."""
    if observe.unavailable():
        pytest.skip(observe.unavailable())
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    subprocess.run([observe.compiler(), str(src), "-o", str(tmp_path / name)], check=True)
    return tmp_path / name


def test_the_log_is_read_as_the_observer_wrote_it():
    t = observe.parse(LOG)
    assert t.reads[("/work/a.c", True)] == "ok"
    assert t.reads[("/work/inc/x.h", True)] == "ENOENT"
    assert t.reads[("/work/rel.h", True)] == "ok"
    assert t.reads[("/usr/lib", False)] == "ok", "readlink looks at the path itself"
    assert t.reads[("/a\tb c\u00e9\\d", False)] == "ok", "the log's escapes are undone"
    assert t.reads[("/work/link.h", False)] == "ok" and ("/work/link.h", True) not in t.reads
    assert t.executed == {"/usr/bin/gcc", "/usr/lib/cc1"}, "a program not found was not run"
    assert t.reads[("/usr/local/bin/as", True)] == "ENOENT"
    assert t.writes == {"/work/out.o", "/tmp/cc123.s", "/work/o.tmp", "/work/o"}
    assert t.listed == {"/tmp"}
    assert not any(p.startswith("/proc") for p, _ in t.reads)
    assert t.opaque == ()


def test_what_cannot_be_read_is_never_trusted():
    t = observe.parse("7\tmount\t0\t\t/mnt\n7\topenat\t0\t?\t\n7\tforeign-abi-5\t0\t?\t\n7\topenat\t0\n")
    assert len(t.opaque) == 4, t.opaque


def test_relative_paths_are_read_in_the_callers_folder(tmp_path):
    """The observer resolves a relative path against the process's folder at the time of the call
    (here after a cd in a child shell), and answers with what was there."""
    if observe.unavailable():
        pytest.skip(observe.unavailable())
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "there.h").write_text("x")
    ran = run(["/bin/sh", "-c", f"cd '{tmp_path}' && cd sub && cat there.h missing.h; ls > /dev/null; touch made"], {"PATH": "/usr/bin:/bin"},
              Limits(), tmp_path / "runs", None, compile=False)
    assert ran.trace is not None and ran.trace.opaque == ()
    assert ran.trace.reads[(str(tmp_path / "sub" / "there.h"), True)] == "ok"
    assert ran.trace.reads[(str(tmp_path / "sub" / "missing.h"), True)] == "ENOENT"
    assert str(tmp_path / "sub") in ran.trace.listed
    # touch sets the times through the descriptor it opened (utimensat with no path): seen as a write
    assert str(tmp_path / "sub" / "made") in ran.trace.writes


def test_a_static_program_and_every_child_are_seen(tmp_path):
    """A seccomp filter acts on system calls, not library calls: a statically linked program's are seen too,
    and so are those of every process it starts."""
    if observe.unavailable():
        pytest.skip(observe.unavailable())
    src = tmp_path / "p.c"
    src.write_text('#include <stdio.h>\n#include <unistd.h>\nint main(){FILE*f=fopen("' + str(tmp_path / "data") + '","r");'
                   'if(f)fclose(f); if(fork()==0){execl("/bin/cat","cat","' + str(tmp_path / "child") + '",(char*)0);} '
                   'return 0;}\n')
    static = tmp_path / "p"
    if subprocess.run(["gcc", "-static", "-o", str(static), str(src)], capture_output=True).returncode != 0:
        pytest.skip("no static libc to link with")
    (tmp_path / "data").write_text("x")
    ran = run([str(static)], {"PATH": "/usr/bin:/bin"}, Limits(), tmp_path / "runs", None, compile=False)
    assert ran.returncode == 0 and ran.trace is not None
    assert ran.trace.reads[(str(tmp_path / "data"), True)] == "ok"
    assert ran.trace.reads[(str(tmp_path / "child"), True)] == "ENOENT"
    assert "/bin/cat" in ran.trace.executed


def realpath_of(function):
    """name -> (result or None, errno or 0, what a PATH_MAX buffer holds afterwards) of one C
    realpath, with a NULL buffer and with a PATH_MAX one."""
    function.restype, function.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]

    def call(name: str | None):
        answers = []
        for buffered in (False, True):
            buf = ctypes.create_string_buffer(os.pathconf("/", "PC_PATH_MAX")) if buffered else None
            ctypes.set_errno(0)
            got = function(name.encode() if name is not None else None, buf)
            err = ctypes.get_errno() if not got else 0
            answers.append((ctypes.string_at(got).decode() if got else None, errno.errorcode.get(err, err),
                            buf.value.decode() if buffered else None))
        return answers
    return call


@pytest.fixture
def preload():
    if observe.unavailable():
        pytest.skip(observe.unavailable())
    return ctypes.CDLL(str(observe.preload_path()), use_errno=True)


def test_the_preloads_realpath_answers_as_the_c_librarys(tmp_path, monkeypatch, preload):
    """observer_realpath.c's realpath against glibc's own (the oracle) on every kind of name: links
    absolute and relative, chains, loops, dangling links, '.', '..', missing and non-folder
    components, trailing slashes, relative names, too many links."""
    libc = ctypes.CDLL(None, use_errno=True)
    ours, theirs = realpath_of(preload.realpath), realpath_of(libc.realpath)
    t = tmp_path
    (t / "d" / "e").mkdir(parents=True)
    (t / "d" / "f").write_text("x")
    links = {"abs": str(t / "d"), "rel": "d/e/..", "chain": "rel", "file": "d/f", "loop1": "loop2", "loop2": "loop1",
             "self": "self", "dangling": "nowhere/x", "up": "..", "dotted": "./d/./e", "to_root": "/",
             "d/e/back": "../../d", "slashes": "d//e//"}
    for name, target in links.items():
        os.symlink(target, t / name)
    for i in range(45):  # a chain of 41 links fails (ELOOP), one of 40 resolves
        os.symlink(f"c{i + 1}" if i < 44 else "d", t / f"c{i}")
    monkeypatch.chdir(t)
    names = ["", ".", "..", "/", "//", "/..", "/../..", "d", "d/", "d/.", "d/..", "d/f", "d/f/", "d/f/.", "d/f/..",
             "d/f/x", "d//e///", "./d/./e/../f", "missing", "missing/", "missing/..", "d/missing", "d/missing/..",
             "c4", "c5", "c5/", "c3/e", *links, *(f"{name}/" for name in links), *(f"{name}/." for name in links),
             *(f"{name}/../d" for name in links), "abs/e/back/f", "chain/f/", "file/", "file/..", "dangling/..",
             "x" * 300, "/" + "a/" * 3000]
    names += [str(t / n) for n in names if n and not n.startswith("/")]
    for name in names:
        assert ours(name) == theirs(name), name
    assert ours(None) == theirs(None)


def test_the_preload_forgets_links_its_process_changes(tmp_path, preload):
    """Answers are remembered per process; a link this process changes through the C library is
    looked at again."""
    ours = realpath_of(preload.realpath)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    link = str(tmp_path / "l")
    assert preload.symlink(str(tmp_path / "a").encode(), link.encode()) == 0
    assert ours(link)[0][0] == str(tmp_path / "a")
    assert preload.unlink(link.encode()) == 0 and preload.symlink(str(tmp_path / "b").encode(), link.encode()) == 0
    assert ours(link)[0][0] == str(tmp_path / "b")


def test_the_preload_and_the_logs_repeats_change_nothing_observed(tmp_path):
    """A compile observed with the preload makes fewer calls, and the log leaves out repeats (a
    call, flags and path already logged with something there) and stats of open files: the paths
    observed and their answers are the same with and without the preload, and each line is new."""
    if observe.unavailable():
        pytest.skip(observe.unavailable())
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "h.h").write_text("#include <vector>\n#include <map>\n")
    (tmp_path / "a.cpp").write_text('#include <h.h>\n#include <string>\nint f() { return 1; }\n')
    traces = []
    for prefix in ([str(observe.observer_path())], observe.command("")[:-1]):
        log = tmp_path / "log"
        cmd = [*prefix, str(log), "g++", "-isystem", str(tmp_path / "inc"), "-c", str(tmp_path / "a.cpp"),
               "-o", str(tmp_path / "a.o")]
        subprocess.run(cmd, check=True, cwd=tmp_path)
        lines = log.read_text().splitlines()
        found = [tuple(ln.split("\t")[1:]) for ln in lines if ln.split("\t")[2] == "0"]
        assert len(found) == len(set(found)), "a repeat was logged"
        assert not any("e" in f[2] and f[3] == "" for f in found), "an open file's stat was logged"
        trace = observe.parse("\n".join(lines))
        traces.append({k: v for k, v in trace.reads.items() if not k[0].startswith(("/tmp/cc", str(tmp_path / "a.o")))})
    assert traces[0] == traces[1]
    assert not any("realpath" in p for p, _ in traces[1])


def test_a_preload_path_the_loader_would_split_is_left_out(tmp_path):
    """LD_PRELOAD is split at spaces and colons: a cache folder with one in its name must not put
    the loader's complaints into a compile's messages; the command is observed as before."""
    if observe.unavailable():
        pytest.skip(observe.unavailable())
    odd = tmp_path / "my cache:x"
    odd.mkdir()
    lib = odd / "realpath.so"
    lib.write_bytes(observe.preload_path().read_bytes())
    log, data = tmp_path / "log", tmp_path / "data"
    data.write_text("x")
    proc = subprocess.run([str(observe.observer_path()), "--preload", str(lib), str(log), "/bin/cat", str(data)],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert observe.parse(log.read_text()).reads[(str(data), True)] == "ok"


def test_states_name_what_is_there_now(tmp_path):
    states = pathstates.States(FileHasher())
    f = tmp_path / "f.h"
    f.write_text("a")
    (tmp_path / "link.h").symlink_to("f.h")
    assert len(states.state(str(f))) == 64
    assert states.state(str(tmp_path / "missing.h")) == pathstates.ABSENT
    assert states.state(str(tmp_path / "f.h" / "x")) == pathstates.ABSENT, "ENOTDIR is absent too"
    assert states.state(str(tmp_path)) == pathstates.FOLDER
    assert states.state(str(tmp_path / "link.h"), follow=False) == "L@f.h"
    assert states.state(str(tmp_path / "link.h")) == states.state(str(f))
    assert states.listing(str(tmp_path)).startswith(pathstates.LISTING)


def test_a_set_is_named_by_its_content_and_checked_against_the_machine(tmp_path):
    folder = tmp_path / "inc"
    folder.mkdir()
    header = folder / "h.h"
    header.write_text("one")
    probe = folder / "probe.h"
    states = pathstates.States(FileHasher())
    pairs = [[str(header), states.state(str(header))], [str(probe), pathstates.ABSENT],
             [str(folder), states.listing(str(folder))]]
    d = tmp_path / "sets"
    sid, data = inputsets.encode(pairs)
    assert sid == inputsets.set_id(list(reversed(pairs)))
    pack = inputsets.pack({sid: data})
    inputsets.write_pack(d, pack)
    assert inputsets.SetChecker(pathstates.States(FileHasher())).matches(d, pack.name, sid, None)
    probe.write_text("appeared")
    fresh = inputsets.SetChecker(pathstates.States(FileHasher()))
    assert not fresh.matches(d, pack.name, sid, None), "a file appearing where the compile looked"
    assert any("absent when compiled" in line for line in pathstates.differences(pairs, lambda p: p, fresh.states))
    assert not fresh.matches(d, pack.name, "0" * 64, None), "a set its pack lacks never matches"
    assert not fresh.matches(d, "0" * 64, sid, None), "a missing pack never matches"


def test_a_damaged_or_forged_pack_is_never_read_and_verify_removes_it(tmp_path):
    d = tmp_path / "sets"
    sid, data = inputsets.encode([["/x", pathstates.ABSENT]])
    pack = inputsets.pack({sid: data})
    inputsets.write_pack(d, pack)
    path = hashed.path_of(d, pack.name)
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x01
    path.write_bytes(bytes(raw))
    checker = inputsets.SetChecker(pathstates.States(FileHasher()))
    assert checker.load(d, pack.name, sid) is None
    assert packs.verify(d, repair=True)[0][2] is True and not path.exists(), "what `pp4.store verify` runs"

    # Forged: a pack named by its own bytes, whose set is not the one its name says. Only the set's
    # own check can tell.
    other, other_data = inputsets.encode([["/x", pathstates.ABSENT], ["/y", pathstates.ABSENT]])
    forged = packs.pack({sid: other_data})  # packing never asks whether a set's bytes hash to its name
    packs.write(d, forged)
    assert checker.load(d, forged.name, sid) is None
    assert not checker.matches(d, forged.name, sid, None)
    damage = packs.verify(d, repair=False)
    assert [(p, "hash to its name" in why) for p, why, _ in damage] == [(str(hashed.path_of(d, forged.name)), True)]


def test_commands_are_mapped_into_the_root_except_what_the_user_wrote(tmp_path):
    work, src, torch = tmp_path / "work", tmp_path / "proj", tmp_path / "venv" / "torch"
    for p in (work, src, torch):
        p.mkdir(parents=True)
    (tmp_path / "torchlink").symlink_to(torch)
    root = Root.make(str(work), {"$TORCH": str(tmp_path / "torchlink")}, str(src))
    argv = ["g++", f"-I{tmp_path / 'torchlink'}/include", "-isystem", f"{torch}/include", f'-DDATA="{src}/data"',
            "-c", f"{src}/a.cpp", "-o", "build/a.o", f"-Wl,-rpath,{torch}/lib", f"{src}2/b.cpp"]
    assert root.command(argv) == ["g++", "-I/pp4/torch/include", "-isystem", "/pp4/torch/include",
                                  f'-DDATA="{src}/data"', "-c", "/pp4/src/a.cpp", "-o", "build/a.o",
                                  f"-Wl,-rpath,{torch}/lib", f"{src}2/b.cpp"]
    assert root.real("/pp4/torch/include/x.h") == f"{os.path.realpath(torch)}/include/x.h"
    assert root.real("/pp4/tmp/cc1.s") is None and root.real("/usr/include/x.h") == "/usr/include/x.h"
    shown = root.shown(b"/pp4/src/a.cpp:3:1: error: expected ';' before '}' token\n")
    assert shown == f"{os.path.realpath(src)}/a.cpp:3:1: error: expected ';' before '}}' token\n".encode(), \
        "messages point at the files a user edits"


def driver_expansion(words) -> list[str]:
    """The CPU options a gcc driver's -march=native became (-march=<cpu>, -m<feature>, cache sizes)."""
    return [w for w in words if w.startswith(("-march=", "-mtune=", "-m", "l1-cache", "l2-cache"))
            and not w.startswith(("-mtune=generic", "-march=x86-64"))]


@pytest.mark.parametrize("how", ["argument", "response-file", "wrapper", "specs-free-spelling"])
def test_a_driver_that_expands_native_is_found_from_what_it_was_started_with(tmp_path, how):
    """-march=native is read from the programs' arguments and the COLLECT_GCC_OPTIONS a driver hands
    its children, not from the command's text: given directly, in a response file, added by a CXX
    wrapper script, or with a space inside one -Xcompiler-style word, the driver that expanded it
    is keyed on `DRIVER -### ... -march=native`, and that dry run spells out exactly the options
    the compile's cc1 received (the oracle: cc1's own recorded arguments)."""
    if observe.unavailable():
        pytest.skip(observe.unavailable())
    from pp4.reuse import nativecpu

    (tmp_path / "a.c").write_text("int f(void) { return 1; }\n")
    gcc = "/usr/bin/gcc"
    argv = [gcc, "-O2", "-march=native", "-c", str(tmp_path / "a.c"), "-o", str(tmp_path / "a.o")]
    if how == "response-file":
        (tmp_path / "flags.rsp").write_text("-O2 -march=native\n")
        argv = [gcc, f"@{tmp_path / 'flags.rsp'}", "-c", str(tmp_path / "a.c"), "-o", str(tmp_path / "a.o")]
    elif how == "wrapper":
        wrapper = tmp_path / "cc-wrapper"
        wrapper.write_text(f'#!/bin/sh\nexec {gcc} -march=native "$@"\n')
        wrapper.chmod(0o755)
        argv = [str(wrapper), "-O2", "-c", str(tmp_path / "a.c"), "-o", str(tmp_path / "a.o")]
    elif how == "specs-free-spelling":
        argv = ["/bin/sh", "-c", f"{gcc} $0 -c {tmp_path / 'a.c'} -o {tmp_path / 'a.o'}", "-O2 -march=native"]
    ran = run(argv, {"PATH": "/usr/bin:/bin"}, Limits(), tmp_path / "runs", None, compile=False)
    assert ran.returncode == 0, ran.stderr
    cpu, gpu, problem = nativecpu.drivers(ran.trace)
    assert problem is None and gpu == {}
    assert cpu == {gcc: ["-march=native"]}, cpu
    (cc1,) = [e for e in ran.trace.execs if e.program.endswith("/cc1")]
    said = subprocess.run([gcc, "-###", "-E", "-x", "c", os.devnull, "-march=native"], capture_output=True, text=True)
    (line,) = [ln for ln in said.stderr.splitlines() if "/cc1 " in ln]
    import shlex

    assert driver_expansion(shlex.split(line)) == driver_expansion(cc1.argv)


def test_no_native_option_means_no_cpu_observation(tmp_path):
    if observe.unavailable():
        pytest.skip(observe.unavailable())
    from pp4.reuse import nativecpu

    (tmp_path / "a.c").write_text("int f(void) { return 1; }\n")
    ran = run(["/usr/bin/gcc", "-O2", "-march=x86-64-v2", "-DNAME=native", "-c", str(tmp_path / "a.c"), "-o",
               str(tmp_path / "a.o")], {"PATH": "/usr/bin:/bin"}, Limits(), tmp_path / "runs", None, compile=False)
    assert nativecpu.drivers(ran.trace) == ({}, {}, None)


@pytest.mark.parametrize("argv, flags", [
    (["/t/nvcc", "-arch=native", "-c", "a.cu"], ["-arch=native"]),
    (["/t/nvcc", "-arch", "native", "-c", "a.cu"], ["-arch=native"]),
    (["/t/nvcc", "--gpu-architecture=native", "-c", "a.cu"], ["--gpu-architecture=native"]),
    (["/t/nvcc", "-gencode", "arch=compute_90,code=sm_90", "-DNATIVE=native", "-c", "a.cu"], []),
])
def test_nvccs_native_gpu_options_are_read_from_its_arguments(argv, flags):
    from pp4.reuse import nativecpu

    assert nativecpu.gpu_flags(argv) == flags
    trace = observe.parse(f"9\texecve\t0\t\t/t/nvcc\n9\t+exec\t1\t\t{len(argv)}\t" + "\t".join(argv) + "\tPATH=/bin\n")
    assert nativecpu.drivers(trace) == ({}, {"/t/nvcc": flags} if flags else {}, None)


def test_a_program_other_than_nvcc_that_asks_the_gpu_driver_is_not_keyed():
    from pp4.reuse import nativecpu

    log = ("9\texecve\t0\t\t/t/nvcc\n9\t+exec\t1\t\t1\t/t/nvcc\n9\topenat\t2\t\t/dev/nvidiactl\n"
           "10\texecve\t0\t\t/opt/probe\n10\t+exec\t9\t\t1\t/opt/probe\n10\topenat\t0\t\t/dev/nvidia0\n")
    cpu, gpu, problem = nativecpu.drivers(observe.parse(log))
    assert problem is not None and "/opt/probe asked the GPU driver" in problem
    cpu, gpu, problem = nativecpu.drivers(observe.parse(log.split("10\t")[0]))
    assert problem is None and gpu == {"/t/nvcc": ["-arch=native"]}


def test_every_system_call_of_the_running_kernel_is_classed(tmp_path):
    """The observer's table names every x86-64 system call the running kernel has (read from
    /proc/kallsyms, where each has an `__x64_sys_` entry point); a kernel with a call it does not
    know fails here until the call is classed. (Unknown numbers are not let through meanwhile:
    the filter hands every call it does not allow to the observer, which reports it.)"""
    if observe.unavailable():
        pytest.skip(observe.unavailable())
    table = subprocess.run([str(observe.observer_path()), "--table"], capture_output=True, text=True, check=True).stdout
    classes = {line.split("\t")[1]: line.split("\t")[2] for line in table.splitlines()}
    numbers = {line.split("\t")[1]: int(line.split("\t")[0]) for line in table.splitlines()}
    assert set(classes.values()) == {"harmless", "unkeyed", "answered", "observed", "some-requests", "unstorable"}
    try:
        symbols = open("/proc/kallsyms").read()
    except OSError as e:
        pytest.skip(f"/proc/kallsyms cannot be read here ({e})")
    names = set(re.findall(r" [TtWw] __x64_sys_(\w+)$", symbols, re.M)) - {n for n in re.findall(r"__x64_sys_(\w+)\.cold", symbols)}
    if not names:
        pytest.skip("/proc/kallsyms names no __x64_sys_ entry points here")
    # Entry points of x86-64 calls named otherwise in the table (arch/x86/entry/syscalls/syscall_64.tbl).
    renamed = {"newstat": "stat", "newfstat": "fstat", "newlstat": "lstat", "newuname": "uname",
               "sendfile64": "sendfile", "umount": "umount2", "ni_syscall": "read"}
    # Entry points that only 32-bit programs reach (their x86-64 twins have entries of their own):
    # the i386 ABI's calls are reported as another ABI's, whatever they are.
    thirty_two_bit = {"stat", "fstat", "lstat", "uname", "sendfile", "set_thread_area", "get_thread_area", "uselib",
                      "llseek", "mmap_pgoff", "nice", "old_getrlimit", "old_readdir", "oldumount", "olduname",
                      "recv", "send", "sgetmask", "ssetmask", "signal", "sigpending", "sigprocmask", "sigsuspend",
                      "socketcall", "stime", "stime32", "statfs64", "fstatfs64", "waitpid", "sync_file_range2",
                      "fadvise64_64", "gethostname", "ipc", "old_msgctl", "old_semctl", "old_shmctl", "vm86", "vm86old",
                      "pciconfig_iobase", "pciconfig_read", "pciconfig_write", "rtas", "s390_ipc", "s390_pci_mmio_read",
                      "s390_pci_mmio_write", "spu_create", "spu_run", "subpage_prot"}
    thirty_two_bit |= {n for n in names if n.endswith(("16", "_time32", "32")) or n.startswith("ia32_")}
    unknown = sorted(n for n in names if renamed.get(n, n) not in classes and n not in thirty_two_bit)
    assert unknown == [], f"system calls of this kernel that pp4-observe's table does not class: {unknown}"
    header = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"
    if os.path.exists(header):
        for name, nr in re.findall(r"#define __NR_(\w+) (\d+)", open(header).read()):
            assert numbers.get(name) == int(nr), f"{name}: the table says {numbers.get(name)}, {header} {nr}"


def test_the_cpu_set_is_answered_the_same_everywhere(tmp_path):
    """A tool that sizes its work by the CPUs it may use (nproc, -j0, LLVM's thread pools) is told
    one CPU by the observer, whatever the machine and whatever `configure --cpus` chose: nothing
    about this machine's CPUs reaches an object through it, and there is nothing to key."""
    if observe.unavailable():
        pytest.skip(observe.unavailable())
    out = tmp_path / "out"
    for cpus in (None, (0,), tuple(sorted(os.sched_getaffinity(0)))):
        ran = run(["/bin/sh", "-c", "nproc; python3 -c 'import os; print(sorted(os.sched_getaffinity(0)))'"],
                  {"PATH": "/usr/bin:/bin"}, Limits(cpus=cpus), tmp_path / "runs", None, compile=False, stdout=out)
        assert ran.returncode == 0 and out.read_text().split("\n")[:2] == ["1", "[0]"], out.read_text()
        assert ran.trace.unstorable == ()


def test_unstorable_calls_name_the_call_and_the_program(tmp_path):
    """A socket of any family and direction (a UDP question and its answer without connect), an
    extended attribute read through the *at calls of Linux 6.13, the machine's name, and a call the
    table does not know: each is reported once with the program that made it; a compile with any
    is never stored, and its reason names both."""
    program = observed_program(tmp_path, "asks",
                               "#define _GNU_SOURCE\n#include <netinet/in.h>\n#include <string.h>\n"
                               "#include <sys/socket.h>\n#include <sys/syscall.h>\n#include <sys/utsname.h>\n"
                               "#include <unistd.h>\n"
                               "int main(int argc, char **argv) {\n"
                               "  if (argv[1][0] == 'u') { int s = socket(AF_INET, SOCK_DGRAM, 0);\n"
                               "    struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons(9),\n"
                               "                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};\n"
                               "    char b[8]; sendto(s, \"q\", 1, 0, (struct sockaddr *)&in, sizeof in);\n"
                               "    recvfrom(s, b, sizeof b, MSG_DONTWAIT, 0, 0); }\n"
                               "  if (argv[1][0] == 'n') { struct utsname u; uname(&u); }\n"
                               "  if (argv[1][0] == 'x') syscall(1000, 0);\n"
                               "  return 0; }\n")
    for how, call in (("u", "sendto"), ("n", "uname"), ("x", "syscall-1000")):
        ran = run([str(program), how], {"PATH": "/usr/bin:/bin"}, Limits(), tmp_path / "runs", None, compile=False)
        assert ran.trace.unstorable and ran.trace.unstorable[0].call == call, (how, ran.trace.unstorable)
        assert all(u.program == str(program) for u in ran.trace.unstorable)
        pairs, why = observations.from_run(ran, set(), pathstates.States(FileHasher()))
        assert pairs == [] and f"system call {call} ({program})" in why


def test_extended_attributes_are_observed_with_their_values(tmp_path):
    """An attribute read by path, by descriptor, without following a link, or through getxattrat
    (Linux 6.13) is an observation of its value; the list of names too. A value that changes
    changes the state."""
    probe = tmp_path / "probe"
    probe.write_text("same bytes\n")
    try:
        os.setxattr(probe, "user.pp4", b"one")
    except OSError as e:
        pytest.skip(f"this file system keeps no user extended attributes ({e})")
    program = observed_program(tmp_path, "attrs",
                               "#define _GNU_SOURCE\n#include <fcntl.h>\n#include <stdint.h>\n#include <sys/syscall.h>\n"
                               "#include <sys/xattr.h>\n#include <unistd.h>\n"
                               "struct xattr_args { uint64_t value; uint32_t size; uint32_t flags; };\n"
                               "int main(int argc, char **argv) { char v[64], names[256];\n"
                               "  getxattr(argv[1], \"user.pp4\", v, sizeof v);\n"
                               "  int fd = open(argv[1], O_RDONLY); fgetxattr(fd, \"user.other\", v, sizeof v);\n"
                               "  listxattr(argv[1], names, sizeof names);\n"
                               "  struct xattr_args a = {(uint64_t)(uintptr_t)v, sizeof v, 0};\n"
                               "  syscall(464, AT_FDCWD, argv[1], 0, \"user.third\", &a, sizeof a);\n"
                               "  return 0; }\n")
    time.sleep(0.1)  # the program is new: a file made within a compile's clock tick reads as changed during it
    ran = run([str(program), str(probe)], {"PATH": "/usr/bin:/bin"}, Limits(), tmp_path / "runs", None, compile=False)
    assert ran.trace.unstorable == () and ran.trace.opaque == ()
    assert set(ran.trace.xattrs) >= {(str(probe), True, "user.pp4"), (str(probe), True, "user.other"),
                                     (str(probe), True, None)}
    pairs, why = observations.from_run(ran, set(), pathstates.States(FileHasher()))
    assert why is None
    states = dict(pairs)
    mine = [st for p, st in pairs if p == str(probe) and st.startswith("xattr:user.pp4=")]
    assert mine == [f"xattr:user.pp4={hashlib.sha256(b'one').hexdigest()}"]
    assert any(p == str(probe) and st == "xattr:user.other=-" for p, st in pairs)
    assert any(p == str(probe) and st == "xattr:user.third=-" for p, st in pairs)
    os.setxattr(probe, "user.pp4", b"two")
    assert pathstates.States(FileHasher()).now(str(probe), mine[0]) != mine[0]
    assert states  # the file's own read is observed too


def test_a_file_reached_through_proc_is_not_trusted():
    """/proc/self/exe, /dev/urandom and the like name nothing of the project and are left out; a
    path that goes on past a process's folder link reaches a real file it does not name."""
    through = ["/proc/self/cwd/a.h", "/proc/thread-self/root/usr/include/b.h", "/proc/42/task/43/cwd/c.h",
               "/dev/fd/7/d.h", "/dev/fd/../cwd/e.h", "//proc//self/cwd/f.h", "/proc/self/fd/3/g.h"]
    benign = ["/proc/self/exe", "/dev/urandom", "/proc/sys/vm/overcommit_memory", "/proc/self/cwd", "/proc/self/fd/3",
              "/dev/null"]
    # a tmpfs anyone keeps files in, and the CPUs this machine has: seen (and keyed) like any file
    ordinary = ["/dev/shm/cfg/x.h", "/sys/devices/system/cpu/online"]
    log = "".join(f"7\topenat\t0\t\t{p}\n" for p in through + benign + ordinary)
    t = observe.parse(log)
    assert set(t.through_proc) == set(through)
    assert t.reads == {(p, True): "ok" for p in ordinary} and t.opaque == ()


def test_a_file_under_proc_sys_or_dev_is_neutral_only_if_real_compiles_read_it():
    """What nvcc, gcc, the linker and gcc's LTO driver read there is left out; reading what any
    other file there holds (the mounts, the load, a device) describes the machine or the run, and
    is reported; a stat of one only says it exists."""
    neutral = ["/proc/self/exe", "/proc/4242/exe", "/proc/sys/vm/overcommit_memory", "/proc/filesystems",
               "/sys/fs/selinux", "/dev/urandom", "/dev/null", "/dev/stdin", "/dev/nvidiactl",
               "/dev/nvidia-caps/nvidia-cap1", "/proc/driver/nvidia/params", "/proc/self/fd", "/proc/self/fd/4"]
    describing = ["/proc/self/mountinfo", "/proc/loadavg", "/proc/uptime", "/proc/self/status", "/proc/mounts",
                  "/sys/fs/cgroup/cpu.max", "/sys/class/net/eth0/address", "/dev/sda", "/dev/tty", "/proc"]
    log = "".join(f"7\topenat\t0\t\t{p}\n" for p in neutral + describing)
    log += "7\tnewfstatat\t0\t\t/proc/loadavg\n7\treadlink\t0\tn\t/proc/self/exe\n"
    t = observe.parse(log)
    assert list(t.machine) == describing and t.reads == {} and t.opaque == ()


def test_a_process_that_sets_up_io_uring_is_not_trusted(tmp_path):
    """io_uring carries out opens and stats without a system call the filter sees: its set-up is
    reported, so the observation is never trusted."""
    program = observed_program(tmp_path, "ring",
                               "#include <string.h>\n#include <sys/syscall.h>\n#include <unistd.h>\n"
                               "int main(void) { char params[120]; memset(params, 0, sizeof params);\n"
                               "  syscall(SYS_io_uring_setup, 1, params); return 0; }\n")
    ran = run([str(program)], {"PATH": "/usr/bin:/bin"}, Limits(), tmp_path / "runs", None, compile=False)
    assert ran.trace is not None and [u.call for u in ran.trace.unstorable] == ["io_uring_setup"], ran.trace


def test_a_process_that_remaps_paths_without_mount_is_not_trusted(tmp_path):
    """The mount API's other calls (a copy of a tree attached over a folder, in a user namespace of
    the compile's own) and entering another process's namespaces change what a path names without
    mount(2): each is reported, whether it worked or not, so the observation is never trusted."""
    program = observed_program(tmp_path, "remap",
                               "#define _GNU_SOURCE\n#include <fcntl.h>\n"
                               "#include <sys/syscall.h>\n#include <unistd.h>\n"
                               "int main(int argc, char **argv) {\n"
                               "  if (argv[1][0] == 't') syscall(SYS_open_tree, AT_FDCWD, argv[2], 1);\n"
                               "  if (argv[1][0] == 'm') syscall(SYS_move_mount, -1, \"\", AT_FDCWD, argv[2], 4);\n"
                               "  if (argv[1][0] == 'f') syscall(SYS_fsopen, \"tmpfs\", 0);\n"
                               "  if (argv[1][0] == 's') syscall(SYS_setns, -1, 0);\n"
                               "  return 0; }\n")
    for how, call in (("t", "open_tree"), ("m", "move_mount"), ("f", "fsopen"), ("s", "setns")):
        ran = run([str(program), how, str(tmp_path)], {"PATH": "/usr/bin:/bin"}, Limits(),
                  tmp_path / "runs", None, compile=False)
        assert ran.trace is not None and [u.call for u in ran.trace.unstorable] == [call], (call, ran.trace)
        assert ran.trace.unstorable[0].program == str(program)
    ran = run([str(program), "-", str(tmp_path)], {"PATH": "/usr/bin:/bin"}, Limits(), tmp_path / "runs",
              None, compile=False)
    assert ran.trace is not None and ran.trace.opaque == () and ran.trace.unstorable == ()


def test_an_open_resolved_in_another_root_is_not_trusted(tmp_path):
    """openat2 with RESOLVE_IN_ROOT opens "/inner.h" under its descriptor's folder, not /inner.h;
    every RESOLVE_ bit changes what an open finds, so such an open makes the observation opaque.
    A plain openat2 is a read like any other."""
    program = observed_program(tmp_path, "inroot",
                               "#define _GNU_SOURCE\n#include <fcntl.h>\n"
                               "#include <linux/openat2.h>\n#include <stdio.h>\n"
                               "#include <sys/syscall.h>\n#include <unistd.h>\n"
                               "int main(int argc, char **argv) {\n"
                               "  struct open_how how = {.flags = O_RDONLY,\n"
                               "                         .resolve = argv[1][0] == 'r' ? RESOLVE_IN_ROOT : 0};\n"
                               "  int dir = open(argv[2], O_RDONLY | O_DIRECTORY);\n"
                               "  int fd = syscall(SYS_openat2, dir, argv[3], &how, sizeof how);\n"
                               "  char text[64] = {0}; if (fd >= 0) read(fd, text, sizeof text - 1);\n"
                               "  fputs(text, stdout); return fd < 0; }\n")
    inner = tmp_path / "root"
    inner.mkdir()
    (inner / "inner.h").write_text("int from_the_inner_root;\n")
    env = {"PATH": "/usr/bin:/bin"}
    # The oracle: what the program printed is the file under the descriptor's folder.
    printed = tmp_path / "printed"
    ran = run([str(program), "r", str(inner), "/inner.h"], env, Limits(), tmp_path / "runs", None,
              compile=False, stdout=printed)
    assert ran.returncode == 0 and "from_the_inner_root" in printed.read_text(), ran
    assert ran.trace is not None and any("\topenat2\t" in line for line in ran.trace.opaque), ran.trace
    ran = run([str(program), "-", str(inner), "inner.h"], env, Limits(), tmp_path / "runs", None,
              compile=False, stdout=printed)
    assert ran.returncode == 0 and ran.trace is not None and ran.trace.opaque == ()
    assert ran.trace.reads[(str(inner / "inner.h"), True)] == "ok"


def test_sockets_and_folder_opens_are_seen_for_what_they_are(tmp_path):
    """A program that connects to a server (TCP, or a Unix socket that is there) is never trusted:
    another process answered it. A Unix socket with nothing at its path is an absence (glibc's user
    lookups try nscd's socket first); opening a folder to list it (O_DIRECTORY, which glibc's
    __O_TMPFILE also holds) is a read, O_TMPFILE a write."""
    import socket as sockets

    program = observed_program(tmp_path, "talk",
                               "#define _GNU_SOURCE\n#include <fcntl.h>\n#include <netinet/in.h>\n#include <string.h>\n"
                               "#include <sys/socket.h>\n#include <sys/un.h>\n#include <unistd.h>\n"
                               "int main(int argc, char **argv) {\n"
                               "  struct sockaddr_un un = {.sun_family = AF_UNIX};\n"
                               "  strcpy(un.sun_path, argv[1]);\n"
                               "  connect(socket(AF_UNIX, SOCK_STREAM, 0), (struct sockaddr *)&un, sizeof un);\n"
                               "  if (argc > 3) { struct sockaddr_in in = {.sin_family = AF_INET,\n"
                               "                  .sin_port = htons(9),\n"
                               "                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};\n"
                               "    connect(socket(AF_INET, SOCK_STREAM, 0), (struct sockaddr *)&in, sizeof in); }\n"
                               "  close(open(argv[2], O_RDONLY | O_DIRECTORY));\n"
                               "  close(open(argv[2], O_TMPFILE | O_RDWR, 0600));\n"
                               "  return 0; }\n")
    env = {"PATH": "/usr/bin:/bin"}
    folder = tmp_path / "folder"
    folder.mkdir()
    ran = run([str(program), str(tmp_path / "none.sock"), str(folder)], env, Limits(), tmp_path / "runs",
              None, compile=False)
    t = ran.trace
    assert t.unstorable == () and t.opaque == ()
    assert t.reads[(str(tmp_path / "none.sock"), True)] == "ENOENT" and t.reads[(str(folder), True)] == "ok"
    assert str(folder) in t.writes  # the O_TMPFILE open
    ran = run([str(program), str(tmp_path / "none.sock"), str(folder), "tcp"], env, Limits(),
              tmp_path / "runs", None, compile=False)
    assert [(u.call, u.detail) for u in ran.trace.unstorable] == [("connect", "address family 2")]
    pairs, why = observations.from_run(ran, set(), pathstates.States(FileHasher()))
    assert pairs == [] and "system call connect" in why and "a socket reaches another process" in why
    server = sockets.socket(sockets.AF_UNIX)
    server.bind(str(tmp_path / "there.sock"))
    server.listen(1)
    try:
        ran = run([str(program), str(tmp_path / "there.sock"), str(folder)], env, Limits(), tmp_path / "runs",
                  None, compile=False)
    finally:
        server.close()
    assert [(u.call, u.detail) for u in ran.trace.unstorable] == [("connect", str(tmp_path / "there.sock"))]


def test_twins_are_keyed_wherever_they_are(tmp_path):
    """Files of the same bytes that one compile read are keyed on whether their times agree, in the
    project and in torch alike (gcc folds once-only twins of one second; pip gives every file its
    unpack time); an empty file holds no directive and is left out."""
    from pp4.reuse import twins

    project, torch_dir = tmp_path / "src", tmp_path / "torch"
    for folder in (project / "a", project / "b", torch_dir / "c10", torch_dir / "csrc"):
        folder.mkdir(parents=True)
    once = "#pragma once\nstruct _object;\n"
    for path in (project / "a" / "x.h", project / "b" / "x.h", torch_dir / "c10" / "stub.h", torch_dir / "csrc" / "stub.h"):
        path.write_text(once if "src" in str(path.parent.parent.name) else "\ufeff#pragma once\nstruct _other;\n")
        os.utime(path, (1_000_000, 1_000_000))
    (project / "a" / "empty.h").write_text("")
    (project / "b" / "empty.h").write_text("")
    os.utime(torch_dir / "csrc" / "stub.h", (2_000_000, 2_000_000))
    root = Root.from_mounts([["/pp4/src", str(project)], ["/pp4/torch", str(torch_dir)]])

    class Ran:  # what from_run's helpers read of a finished run
        def __init__(self):
            self.root = root

        def real(self, path):
            return root.real(path)

    states = pathstates.States(FileHasher())
    pairs = {(p, "f"): states.state(root.real(p)) for p in
             ("/pp4/src/a/x.h", "/pp4/src/b/x.h", "/pp4/torch/c10/stub.h", "/pp4/torch/csrc/stub.h",
              "/pp4/src/a/empty.h", "/pp4/src/b/empty.h")}
    twins.observe(Ran(), pairs, pathstates.is_file)
    found = {k[0]: v for k, v in pairs.items() if k[1] == twins.PREFIX}
    assert found == {"/pp4/src/a/x.h": twins.PREFIX + "/pp4/src/b/x.h|0,0",
                     "/pp4/torch/c10/stub.h": twins.PREFIX + "/pp4/torch/csrc/stub.h|0,1"}
    recorded = found["/pp4/src/a/x.h"]
    assert states.now(str(project / "a" / "x.h"), recorded, root.real) == recorded
    os.utime(project / "b" / "x.h", (1_000_100, 1_000_100))
    assert pathstates.States(FileHasher()).now(str(project / "a" / "x.h"), recorded, root.real) == \
        twins.PREFIX + "/pp4/src/b/x.h|0,1"


def on_tmpfs() -> Path:
    """A new folder on a tmpfs, which lists a folder's entries newest first: how a test puts the
    same names in another kernel order."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    return Path(tempfile.mkdtemp(dir=shm, prefix="pp4-test-"))


def test_a_pch_folder_is_keyed_in_the_order_gcc_tries_it():
    """gcc takes the first valid precompiled header of a `x.h.gch/` folder in the order the kernel
    lists it: a listed folder's state follows that order, so what was compiled with one order holds
    under no other. The oracle is gcc's own choice."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++")
    work = on_tmpfs()
    try:
        (work / "u.cpp").write_text('#include "x.h"\nextern "C" const char pp4_tag[] = "TAG[" TAGV "]";\n')
        for tag in ("one", "two"):  # both valid for u.cpp: built from x.h's text at two times
            (work / "x.h").write_text(f'#define TAGV "{tag}"\n')
            subprocess.run([gxx, "-x", "c++-header", "x.h", "-o", f"{tag}.gch"], cwd=work, check=True)
        (work / "x.h").write_text('#define TAGV "text"\n')

        def arranged(order):
            folder = work / "x.h.gch"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            for tag in order:
                shutil.copy(work / f"{tag}.gch", folder / f"{tag}.gch")
            subprocess.run([gxx, "-c", "u.cpp", "-o", "u.o"], cwd=work, check=True)
            chose = re.search(rb"TAG\[(\w+)\]", (work / "u.o").read_bytes()).group(1).decode()
            return chose, pathstates.States(FileHasher()).listing(str(folder))

        first, state_a = arranged(["one", "two"])
        listed_a = os.listdir(work / "x.h.gch")
        second, state_b = arranged(["two", "one"])
        if os.listdir(work / "x.h.gch") == listed_a:
            pytest.skip("/dev/shm does not list a folder's entries in the order they were made")
        assert {first, second} == {"one", "two"}, "gcc's choice follows the kernel's order"
        assert state_a != state_b and state_a.startswith(pathstates.IN_ORDER)
        assert arranged(["one", "two"])[1] == state_a
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_time_macros_are_found_in_the_bytes_once_and_kept_with_the_hash(tmp_path):
    from pp4.reuse import timemacros

    assert timemacros.scan(b"#define W __TIME\\\nSTAMP__\n") == "__TIMESTAMP__", "a backslash-newline inside"
    assert timemacros.scan(b"#define W __TI??/ \r\nME__ __DATE__\n") == "__DATE__,__TIME__", "a trigraph, CR LF"
    assert timemacros.scan(b"// __TIMESTAMP__ in a comment\n") == "__TIMESTAMP__"
    assert timemacros.scan(b"\x7fELF...__TIMESTAMP__") == "", "a program's strings are not preprocessed"
    assert timemacros.scan(b"__TIME __DATE _TIMESTAMP__") == ""
    header = tmp_path / "t.h"
    header.write_bytes(b"x" * (3 << 20) + b"\n__TIMES\\\nTAMP__\n")  # past the hasher's chunk
    cache = tmp_path / "hashes.json"
    hasher = FileHasher(cache)
    hasher.STAMP_SLACK_S = -60.0  # keep what was just written (its ctime is now)
    sha = hasher.sha256(str(header))
    assert hasher.time_macros(sha) == "__TIMESTAMP__"
    assert hasher.time_macros("0" * 64) is None, "never hashed: not cleared"
    hasher.save()
    doc = json.loads(cache.read_text())
    assert doc["time_macros"] == {sha: "__TIMESTAMP__"}
    doc["time_macros"][sha] = "__DATE__"  # what a later process answers comes from here, not the file
    cache.write_text(json.dumps(doc))
    later = FileHasher(cache)
    assert later.sha256(str(header), os.stat(header)) == sha
    assert later.time_macros(sha) == "__DATE__"
    doc["format"] = 1  # a cache written before files were scanned clears nothing
    cache.write_text(json.dumps(doc))
    older = FileHasher(cache)
    assert older.time_macros(sha) is None
    assert older.sha256(str(header), os.stat(header)) == sha and older.time_macros(sha) == "__TIMESTAMP__"
