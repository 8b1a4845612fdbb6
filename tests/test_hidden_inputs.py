"""Hidden inputs: whatever a compile reads, runs or looks for, a restored object is the object a
compile gives now.

Each case is a tiny spec project. Folder A builds it and fills a store; one hidden input changes;
folder B (a fresh build folder, the same store) builds it; folder C builds it with `--no-reuse`.
B's objects must be C's, byte for byte (every compile runs in the fixed root, so two real compiles
of the same thing are the same bytes), and each object's tag string (`TAG[...]`, which the source
makes from what the preprocessor or assembler saw) must be what the change implies: an oracle that
owes nothing to pp4. The classes are those an outside test found restored stale (docs/reuse.md),
with more cases of each.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import REPO
from test_build import ninja_bin, run

pytestmark = pytest.mark.slow

TAG = re.compile(rb"TAG\[([^\]\x00]*)\]")
HAS_PROBE = '#if __has_include("probe.h")\n#define P "yes"\n#else\n#define P "no"\n#endif\n'


class Case:
    def __init__(self, base: Path, sources: dict[str, str | bytes], spec: str, checkout: str = "src"):
        self.base = base
        self.src = base / checkout
        self.store = base / "store"
        self.n = 0
        self.write(sources)
        (self.src / "ext.toml").write_text(spec.replace("@SRC@", str(self.src)))

    def write(self, files: dict[str, str | bytes], under: Path | None = None) -> None:
        for rel, text in files.items():
            p = (under or self.src) / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(text, bytes):
                p.write_bytes(text)
            else:
                p.write_text(text.replace("@SRC@", str(self.src)).replace("@BASE@", str(self.base)))

    def build(self, reuse: bool = True, work_files: dict[str, str] | None = None, src: Path | None = None,
              env: dict | None = None, wrap: tuple[str, ...] = ()):
        """configure and ninja in a new folder; {object name: (status, tag, bytes)} and ninja's output."""
        self.n += 1
        work = self.base / f"work-{self.src.name}-{self.n}"
        work.mkdir()
        if work_files:
            self.write(work_files, work)
        run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", str((src or self.src) / "ext.toml"),
             "--store", str(self.store)] + ([] if reuse else ["--no-reuse"]), work, env)
        made = run([*wrap, ninja_bin()], work, env)
        return objects(work), made.stdout + made.stderr

    def check(self, want: str | None = None, work_files: dict[str, str] | None = None, src: Path | None = None,
              wrap: tuple[str, ...] = ()):
        """B against C after a change: the same bytes, and the tag the oracle expects. wrap: a
        command ninja runs under in both (another host name, say)."""
        got, out = self.build(work_files=work_files, src=src, wrap=wrap)
        real, _ = self.build(reuse=False, work_files=work_files, src=src, wrap=wrap)
        for name, (status, tag, data) in got.items():
            assert real[name][0] == "compiled"
            assert data == real[name][2], f"{name} ({status}) is not what a compile gives now; tags {tag} vs {real[name][1]}\n{out}"
            if want is not None:
                assert tag == want, f"{name}: {tag}, expected {want}"
        return got


def objects(work: Path) -> dict[str, tuple[str, str | None, bytes]]:
    doc = json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))
    out = {}
    for o in doc["objects"]:
        data = (work / o["output"]).read_bytes()
        m = TAG.search(data)
        out[Path(o["output"]).name] = (o["status"], m.group(1).decode() if m else None, data)
    return out


def observations_of(work: Path, prefix: str) -> set[tuple[str, str]]:
    """The (path, state) observations of a build's sets whose state starts with prefix, read from the
    set packs in its state folder (each set checked against its name: pp4/store/packs.py)."""
    from pp4.store import packs

    found = set()
    for path in (work / "build" / ".pp4" / "setpacks").glob("*/*"):
        for pairs in packs.checked_pairs(path.read_bytes()).values():
            found |= {tuple(p) for p in pairs if str(p[1]).startswith(prefix)}
    return found


def spec(flags: list[str] = (), include_dirs: list[str] = (), sources=("u.cpp",), extra: str = "") -> str:
    return (f'name = "hidden"\nkind = "cpp"\nsources = {json.dumps(list(sources))}\n'
            f"cxx_flags = {json.dumps(['-O1', *flags])}\ninclude_dirs = {json.dumps(list(include_dirs))}\n{extra}")


def tagged(expr: str = "P", head: str = HAS_PROBE) -> str:
    return head + f'extern "C" const char pp4_tag[] = "TAG[" {expr} "]";\n'


def tagging_assembler(base: Path, finds_tag: str) -> Path:
    """A -B folder whose `as` (a Python script) assembles, beside what it is given, the TAG that the
    Python lines `finds_tag` put in `tag`: how a compiler helper brings in an input no header shows."""
    tools = base / "tools"
    tools.mkdir()
    (tools / "as").write_text(f"""#!{sys.executable} -B
import os, sys, tempfile
{finds_tag}
fd, extra = tempfile.mkstemp(suffix=".s")  # in the compile's own temporary folder
os.write(fd, ('.section .rodata\\n.ascii "TAG[' + tag + ']"\\n').encode())
os.execvp("as", ["as", *sys.argv[1:], extra])
""")
    (tools / "as").chmod(0o755)
    return tools


def first_build(case: Case, want: str) -> None:
    got, _ = case.build()
    assert {s for s, _, _ in got.values()} == {"compiled"}
    assert {t for _, t, _ in got.values()} == {want}
    again, _ = case.build()
    assert {s for s, _, _ in again.values()} == {"reused"}, "a fresh build folder restores the unchanged project"


@pytest.fixture
def base(tmp_path, toolchain):
    return tmp_path


# ---------------------------------------------------------------------------------------------
# files read that no dependency file names


def test_a_data_file_the_assembler_pulls_in(base):
    data = base / "src" / "data.bin"
    case = Case(base, {"u.cpp": f'asm(".section .rodata\\n.incbin \\"{data}\\"\\n.previous");\nint u() {{ return 1; }}\n',
                       "data.bin": b"TAG[one]"}, spec())
    first_build(case, "one")
    data.write_bytes(b"TAG[two]")
    assert case.check("two")["u.cpp.o"][0] == "compiled"


@pytest.mark.parametrize("how", ["response_file", "specs_file", "response_file_in_response_file"])
def test_flags_read_from_a_file(base, how):
    flags = {"response_file": ["@@SRC@/flags.rsp"], "specs_file": ["-specs=@SRC@/my.specs"],
             "response_file_in_response_file": ["@@SRC@/outer.rsp"]}[how]
    files = {"u.cpp": tagged("VAL"), "flags.rsp": '-DVAL="\\"one\\""\n', "outer.rsp": "@@SRC@/flags.rsp\n",
             "my.specs": '*cpp:\n+ -DVAL="one"\n'}
    case = Case(base, files, spec([f.replace("@SRC@", str(base / "src")) for f in flags]))
    first_build(case, "one")
    if how == "specs_file":
        case.write({"my.specs": '*cpp:\n+ -DVAL="two"\n'})
    else:
        case.write({"flags.rsp": '-DVAL="\\"two\\""\n'})
    case.check("two")


@pytest.mark.parametrize("how", ["-B", "--include-directory=", "-iprefix", "-Wp,-I", "--sysroot=", "-idirafter"])
def test_every_spelling_of_a_search_folder(base, how):
    folder = base / "extra"
    folder.mkdir()
    where = folder
    flags = {"-B": [f"-B{folder}/"], "--include-directory=": [f"--include-directory={folder}"],
             "-iprefix": ["-iprefix", f"{base}/", "-iwithprefix", "extra"], "-Wp,-I": [f"-Wp,-I{folder}"],
             "--sysroot=": [f"--sysroot={folder}"], "-idirafter": ["-idirafter", str(folder)]}[how]
    if how == "-B":
        where = folder / "include"
    if how == "--sysroot=":
        where = folder / "usr" / "include"
    head = HAS_PROBE.replace('"probe.h"', "<probe.h>")
    case = Case(base, {"u.cpp": tagged(head=head)}, spec(flags))
    first_build(case, "no")
    where.mkdir(parents=True, exist_ok=True)
    (where / "probe.h").write_text("// appeared\n")
    case.check("yes")


def test_a_program_that_stops_being_executable(base):
    """gcc runs the first `as` of its -B folders that it may execute: one made not executable is
    passed over for the next, with the same bytes."""
    tools = base / "tools"
    tools.mkdir()
    wrapper = tools / "as"
    wrapper.write_text('#!/bin/sh\nexec as --defsym pp4_wrapped=1 "$@"\n')
    wrapper.chmod(0o755)
    case = Case(base, {"u.cpp": tagged('"one"', head="")}, spec([f"-B{tools}/"]))
    first_build(case, "one")
    wrapper.chmod(0o644)
    assert case.check("one")["u.cpp.o"][0] == "compiled"


def test_a_header_in_dev_shm(base):
    """/dev/shm is a tmpfs where anyone keeps files, though it sits under /dev."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        pytest.skip("no writable /dev/shm here")
    folder = Path(tempfile.mkdtemp(prefix="pp4-test-", dir=shm))
    try:
        (folder / "cfg.h").write_text('#define VAL "one"\n')
        case = Case(base, {"u.cpp": tagged("VAL", head=f'#include "{folder}/cfg.h"\n')}, spec())
        first_build(case, "one")
        (folder / "cfg.h").write_text('#define VAL "two"\n')
        case.check("two")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("how", ["plain", "byte_order_mark", "outside_the_project"])
def test_two_once_only_headers_of_the_same_bytes(base, how):
    """gcc's `#pragma once` takes a header for one it already included when their bytes and their
    modification times (in seconds) agree: the second copy's time decides whether it is included.
    Keyed wherever the twins are (here: beside the source, or in an include folder outside the
    project), however the directive is written (a byte-order mark before it)."""
    header = ("\ufeff" if how == "byte_order_mark" else "") + "#pragma once\n1,\n"
    source = 'extern "C" const int seen[] = {\n#include "a/x.h"\n#include <x.h>\n};\n' + tagged('"one"', head="")
    outside = base / "vendor"
    second = outside / "x.h" if how == "outside_the_project" else None
    files = {"u.cpp": source, "a/x.h": header}
    if second is None:
        files["b/x.h"] = header
    case = Case(base, files, spec(include_dirs=[str(outside) if second else "b"]))
    if second is not None:
        outside.mkdir()
        second.write_text(header)
    second = second or case.src / "b" / "x.h"
    same = time.time() - 1000
    for path in (case.src / "a" / "x.h", second):
        os.utime(path, (same, same))
    first_build(case, "one")
    os.utime(second, (same + 100, same + 100))  # the same bytes, another second
    assert case.check("one")["u.cpp.o"][0] == "compiled"


@pytest.mark.parametrize("how", ["continued_line", "digraph", "space_in_name", "name_from_a_define", "pasted_name"])
def test_header_names_no_scanner_reads(base, how):
    name = "probe file.h" if how == "space_in_name" else "probe.h"
    head = {
        "continued_line": '#if __has_include(\\\n"probe.h")\n#define P "yes"\n#else\n#define P "no"\n#endif\n',
        "digraph": '%:if __has_include("probe.h")\n%:define P "yes"\n%:else\n%:define P "no"\n%:endif\n',
        "space_in_name": '#if __has_include("probe file.h")\n#define P "yes"\n#else\n#define P "no"\n#endif\n',
        "name_from_a_define": '#if __has_include(HDR)\n#define P "yes"\n#else\n#define P "no"\n#endif\n',
        "pasted_name": '#define STR(x) #x\n#define XSTR(x) STR(x)\n#define NAME(a, b) a##b.h\n'
                       '#if __has_include(XSTR(NAME(pro, be)))\n#define P "yes"\n#else\n#define P "no"\n#endif\n',
    }[how]
    flags = ['-DHDR="probe.h"'] if how == "name_from_a_define" else []
    case = Case(base, {"u.cpp": tagged(head=head)}, spec(flags, include_dirs=["inc"]))
    (case.src / "inc").mkdir()
    first_build(case, "no")
    (case.src / "inc" / name).write_text("// appeared\n")
    case.check("yes")


def test_a_forced_include_found_through_the_working_folder(base):
    case = Case(base, {"u.cpp": tagged("VAL", head="")}, spec(["-include", "forced.h"]))
    got, _ = case.build(work_files={"forced.h": '#define VAL "one"\n'})
    assert {t for _, t, _ in got.values()} == {"one"}
    case.check("two", work_files={"forced.h": '#define VAL "two"\n'})


@pytest.mark.parametrize("prefix", ["/proc/self/cwd", "/proc/thread-self/cwd", "/dev/fd/../cwd"])
def test_a_header_named_through_proc(base, prefix):
    """A real file behind a path under /proc (which names no file of its own): such a compile is
    never stored, so the changed header is compiled."""
    case = Case(base, {"u.cpp": tagged("VAL", head=f'#include "{prefix}/forced.h"\n')}, spec())
    got, out = case.build(work_files={"forced.h": '#define VAL "one"\n'})
    assert {t for _, t, _ in got.values()} == {"one"}
    assert re.search(r"1 not stored: \S+/u\.cpp\.o: it read /\S+/forced\.h\S*, a file reached through /proc", out), out
    assert case.check("two", work_files={"forced.h": '#define VAL "two"\n'})["u.cpp.o"][0] == "compiled"


STAMPED_HEADER = 'extern "C" const char pp4_tag[] = "TAG[" __TIMESTAMP__ "]";\n'


@pytest.mark.parametrize("how", ["define", "pasted", "date_without_epoch", "isystem", "system_header", "quiet", "json"])
def test_time_macros_however_spelled_are_never_stored(base, how):
    """__TIMESTAMP__ is the modification time of the file it expands in. Wherever it is spelled and
    whatever hides gcc's -Wdate-time warning (a system header, -w, JSON diagnostics), the unit is
    never stored: the bytes the compile read name it (pp4/reuse/timemacros.py)."""
    head = {"pasted": "#define CAT(a, b) a##b\n#define WHEN CAT(__TIME, STAMP__)\n",
            "date_without_epoch": "#define WHEN __DATE__\n"}.get(how, "")
    flags = {"define": ["-DWHEN=__TIMESTAMP__"], "isystem": ["-isystem", "@SRC@/sys"], "quiet": ["-w"],
             "json": ["-fdiagnostics-format=json"]}.get(how, [])
    sources = {"u.cpp": tagged("__TIMESTAMP__" if how in ("quiet", "json") else "WHEN", head=head)}
    stamped = "u.cpp"
    if how == "isystem":  # expanded in the header, which -isystem makes a system header
        sources = {"u.cpp": "#include <stamp.h>\n", "sys/stamp.h": STAMPED_HEADER}
        stamped = "sys/stamp.h"
    elif how == "system_header":
        sources = {"u.cpp": '#include "stamp.h"\n', "stamp.h": "#pragma GCC system_header\n" + STAMPED_HEADER}
        stamped = "stamp.h"
    case = Case(base, sources, spec(flags))
    if how == "date_without_epoch":
        # pp4 fixes SOURCE_DATE_EPOCH (0 unless set): __DATE__ is then the same in every compile,
        # and such a unit is stored like any other. Only the file's own time is never stored.
        got, _ = case.build()
        assert {s for s, _, _ in got.values()} == {"compiled"}
        again, _ = case.build()
        assert {s for s, _, _ in again.values()} == {"reused"}
        return
    got, out = case.build()
    status, tag, _ = got["u.cpp.o"]
    assert status == "compiled"
    # The build's last line says so, and why: the next build folder compiles it again.
    assert re.search(r"\(1 object: 0 reused, 1 compiled, 1 not stored: \S+/u\.cpp\.o: .*__TIMESTAMP__", out), out
    source = case.src / stamped
    old = source.stat().st_mtime - 86400 * 400
    os.utime(source, (old, old))  # the same bytes, another modification time
    now = case.check()
    assert now["u.cpp.o"][0] == "compiled", "a unit whose object holds a file's time is compiled every time"
    assert now["u.cpp.o"][1] != tag


def test_a_pch_folder_in_another_order(toolchain):
    """gcc takes the first valid precompiled header of `x.h.gch/` in the kernel's order (tmpfs lists
    the newest first). A compile that reads one is never stored (a .gch's identifier table names
    __TIMESTAMP__), and its folder's listing is keyed in that order: the same two files in another
    order give what gcc gives now."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    base = Path(tempfile.mkdtemp(dir=shm, prefix="pp4-test-"))
    try:
        case = Case(base, {"u.cpp": tagged("TAGV", head='#include "x.h"\n')}, spec(["-Winvalid-pch"]))
        for tag in ("one", "two"):  # both valid for u.cpp (its flags): x.h's text at two times
            (case.src / "x.h").write_text(f'#define TAGV "{tag}"\n')
            subprocess.run(["g++", "-O1", "-fPIC", "-std=c++20", "-x", "c++-header", "x.h",
                            "-o", str(base / f"{tag}.gch")], cwd=case.src, check=True)
        (case.src / "x.h").write_text('#define TAGV "text"\n')

        def arrange(order):
            shutil.rmtree(case.src / "x.h.gch", ignore_errors=True)
            (case.src / "x.h.gch").mkdir()
            for tag in order:
                shutil.copy(base / f"{tag}.gch", case.src / "x.h.gch" / f"{tag}.gch")

        arrange(["one", "two"])
        got, out = case.build()
        assert got["u.cpp.o"][1] == "two", f"tmpfs lists the newest first, and gcc takes the first valid\n{out}"
        assert re.search(r"1 not stored: \S+/u\.cpp\.o: it could expand __TIMESTAMP__, named by \S+\.gch", out), out
        arrange(["two", "one"])
        assert case.check("one")["u.cpp.o"][0] == "compiled"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_native_cpu_flag_is_keyed_on_what_the_compiler_makes_of_this_cpu(base):
    """gcc reads the CPU for -march=native with an instruction, not a file: the observer cannot see
    it, so the object is keyed on what the compiler's driver makes of the CPU here (its `-###`
    spells out -march=<this CPU> and the cache sizes): a store shared with a machine whose CPU reads
    otherwise never hands this object over there."""
    case = Case(base, {"u.cpp": tagged('"x"', head="")}, spec(["-march=native"]))
    first_build(case, "x")  # stored, and restored in a fresh folder: the reading holds here
    work = base / f"work-src-{case.n}"
    (compiler, recorded), = observations_of(work, "native:")
    said = subprocess.run([compiler, "-###", "-E", "-x", "c", os.devnull, "-march=native"], capture_output=True,
                          env={"PATH": os.defpath, "LC_ALL": "C"})
    (cc1,) = [ln for ln in said.stderr.splitlines() if b"/cc1" in ln]
    assert b"-march=" in cc1 and b"-march=native" not in cc1  # the CPU spelled out
    reading = hashlib.sha256(said.stdout + said.stderr + str(said.returncode).encode()).hexdigest()
    assert recorded == f"native:-march=native:{reading}"


def test_nvccs_native_gpu_architecture_is_keyed_on_what_nvcc_makes_of_this_machine(base):
    """nvcc's -arch=native asks the driver for the GPUs (and falls back to a default architecture
    where there is none): no file shows it, so the object is keyed on the architectures nvcc's dry
    run hands its passes here, and a store shared with a machine whose GPUs read otherwise never
    hands this object over there."""
    text = spec(sources=["u.cu"]).replace('kind = "cpp"\n', "").replace("cxx_flags", "cuda_flags")
    case = Case(base, {"u.cu": tagged('"x"', head="") + "__global__ void k(int *p) { *p = 1; }\n"}, text)
    # A spec's cuda_flags may not choose architectures; nvcc's own variable still can, and
    # configure folds it into every CUDA command.
    env = dict(os.environ, NVCC_APPEND_FLAGS="-arch=native")
    assert [g[0] for g in case.build(env=env)[0].values()] == ["compiled"]
    assert [g[0] for g in case.build(env=env)[0].values()] == ["reused"]  # the reading holds here
    work = base / f"work-src-{case.n}"
    (nvcc, recorded), = observations_of(work, "native-gpu:")
    real = json.loads((work / "build" / "actions.json").read_text())["actions"][0]["argv"][0]
    said = subprocess.run([real, "-arch=native", "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                          capture_output=True, env={"PATH": os.defpath, "LC_ALL": "C"})
    archs = sorted(set(re.findall(rb"(?:-arch[= ]|--gpu-name[= ]|arch=|code=)((?:compute|sm|lto)_\w+)",
                                  said.stdout + said.stderr)))
    assert any(a.startswith(b"sm_") for a in archs), said.stderr
    reading = hashlib.sha256(b" ".join(archs) + b" rc " + str(said.returncode).encode()).hexdigest()
    assert recorded == f"native-gpu:-arch=native:{reading}"


def test_mmd_in_the_flags_still_sees_system_headers(base):
    sysinc = base / "sysinc"
    sysinc.mkdir()
    header = sysinc / "sys_h.h"
    header.write_text('#define VAL "one"\n')
    case = Case(base, {"u.cpp": tagged("VAL", head="#include <sys_h.h>\n")}, spec(["-MMD", "-isystem", str(sysinc)]))
    first_build(case, "one")
    st = header.stat()
    header.write_text('#define VAL "two"\n')
    os.utime(header, ns=(st.st_atime_ns, st.st_mtime_ns))  # edited, with its old mtime
    case.check("two")


def test_a_header_replaced_during_the_compile_by_an_older_copy(base):
    """gcc's -wrapper runs a script around cc1plus: after cc1plus has read hdr.h, the script puts
    another content there with an older mtime. Stored under what is there afterwards, a fresh
    folder would restore an object made from what is no longer there."""
    header = base / "src" / "hdr.h"
    script = base / "swap.sh"
    script.write_text(f'#!/bin/sh\n"$@"; rc=$?\ncase "$1" in *cc1plus) printf \'#define VAL "two"\\n\' > {header}; '
                      f"touch -d 2001-01-01 {header};; esac\nexit $rc\n")
    script.chmod(0o755)
    case = Case(base, {"u.cpp": tagged("VAL", head='#include "hdr.h"\n'), "hdr.h": '#define VAL "one"\n'},
                spec(["-wrapper", str(script)]))
    got, _ = case.build()
    assert got["u.cpp.o"][1] == "one"
    case.check("two")


@pytest.mark.parametrize("spelling", ["-D{}", "-Wp,-D{}", "-Xpreprocessor", "response-file"])
def test_a_define_naming_the_checkout_is_keyed_as_written(base, spelling):
    """Two checkouts of one project, each naming its own folder in a macro's value, however the
    value reaches the preprocessor (-D, -Wp,-D, -Xpreprocessor -D, a response file): the object
    holds the checkout's real folder as written (it is what the module reads at run time, outside
    the root), and one checkout's object is never the other's."""
    def flags(folder: Path) -> list[str]:
        value = f'HERE="{folder}"'
        if spelling == "-Xpreprocessor":
            return ["-Xpreprocessor", f"-D{value}"]
        if spelling == "response-file":
            return [f"@{folder}/defines.rsp"]
        return [spelling.format(value)]

    files = {"u.cpp": tagged("HERE", head="")}
    for name in ("one", "two"):
        (base / name).mkdir()
        (base / name / "defines.rsp").write_text(f'-DHERE=\'"{base / name}"\'\n')
    one = Case(base, files, spec(flags(base / "one")), checkout="one")
    first_build(one, str(base / "one"))
    two = Case(base, files, spec(flags(base / "two")), checkout="two")
    got = two.check(str(base / "two"))
    assert got["u.cpp.o"][0] == "compiled"


@pytest.mark.parametrize("flags", [[], ["-g"]])
def test_the_same_project_in_two_checkouts_shares_objects(base, flags):
    """What the fixed root is for: another folder, the same object, restored. With debug
    information too: it names the source root relative to itself and the root's other folders by
    their fixed paths (tests/test_debuginfo.py shares one between checkouts laid out otherwise)."""
    files = {"u.cpp": tagged(head='#include "inc/common.h"\n' + HAS_PROBE), "inc/common.h": "// common\n"}
    one = Case(base / "a", files, spec(flags), checkout="src")
    first_build(one, "no")
    two = Case(base / "b", files, spec(flags), checkout="src")
    two.store = one.store
    got = two.check("no")
    assert got["u.cpp.o"][0] == "reused", "a checkout at another path restores the same object"


# ---------------------------------------------------------------------------------------------
# machines that cannot observe or make the root


def test_without_the_observer_compiles_work_and_nothing_new_is_stored(base):
    case = Case(base, {"u.cpp": tagged(), "v.cpp": tagged().replace("pp4_tag", "pp4_tag_v")}, spec(sources=["u.cpp", "v.cpp"]))
    off = dict(os.environ, PP4_NO_OBSERVER="1")
    got, out = case.build(env=off)
    assert {s for s, _, _ in got.values()} == {"compiled"}
    assert out.count("compiles are not observed (PP4_NO_OBSERVER is set)") == 1, out  # said once, in one line
    again, _ = case.build(env=off)
    assert {s for s, _, _ in again.values()} == {"compiled"}, "nothing was stored"
    first_build(case, "no")  # observed again: stored and restored as usual


def test_without_the_root_compiles_are_observed_and_keyed_on_this_folder(base):
    case = Case(base, {"u.cpp": tagged(), "v.cpp": tagged().replace("pp4_tag", "pp4_tag_v")}, spec(sources=["u.cpp", "v.cpp"]))
    off = dict(os.environ, PP4_NO_ROOT="1")
    got, out = case.build(env=off)
    assert out.count("not in the fixed root (/pp4): PP4_NO_ROOT is set") == 1, out
    again, _ = case.build(env=off)
    assert {s for s, _, _ in again.values()} == {"reused"}
    with_root, _ = case.build()
    assert {s for s, _, _ in with_root.values()} == {"compiled"}, "keys in the root are other keys"


def test_without_the_root_a_debug_object_is_keyed_on_its_folder(base):
    """Without the root a -g object names the folder it was compiled in (DW_AT_comp_dir): a second
    build folder compiles its own, which names that folder, as a real compile there does."""
    case = Case(base, {"u.cpp": tagged()}, spec(["-g"]))
    off = dict(os.environ, PP4_NO_ROOT="1")
    first, _ = case.build(env=off)
    second, _ = case.build(env=off)
    assert first["u.cpp.o"][0] == second["u.cpp.o"][0] == "compiled"
    assert str(base / f"work-src-{case.n}").encode() in second["u.cpp.o"][2]
    assert ["@cwd", f"at:{base / f'work-src-{case.n}'}"] in [list(p) for p in observations_of(base / f"work-src-{case.n}", "at:")]


def test_a_header_above_the_projects_root_is_compiled_outside_the_root(base):
    """`#include "../x.h"` above the spec's folder: the root shows that folder alone, so the compile
    there does not find it; pp4 sees that this machine has it, compiles the unit outside the root
    with one notice naming the file and the fix (root = ".."), and the object is a real compile's."""
    case = Case(base, {"u.cpp": tagged("VAL", head='#include "../outside.h"\n')}, spec())
    (base / "outside.h").write_text('#define VAL "one"\n')
    got, out = case.build()
    assert got["u.cpp.o"][:2] == ("compiled", "one")
    assert f"looked for {base / 'outside.h'}" in out and 'root = ".."' in out, out
    work = base / f"work-src-{case.n}"
    (work / "build" / "hidden" / "obj" / "u.cpp.o").unlink()
    again = run([ninja_bin()], work)
    assert objects(work)["u.cpp.o"][0] == "reused", again.stdout  # kept under its outside-the-root key
    (case.src / "ext.toml").write_text(spec(extra='root = ".."\n'))
    got, out = case.build()
    assert "looked for" not in out and got["u.cpp.o"][1] == "one"


def test_an_include_folder_that_links_above_the_checkout(base):
    """A project whose include folder is a symbolic link to ../vendor (above the checkout): the
    root shows the checkout alone, so the link leads nowhere there; the unit is compiled outside
    the root (one notice) and is what a compile gives, and a changed vendor header is seen."""
    case = Case(base, {"u.cpp": tagged("VAL", head='#include "h.h"\n')}, spec(include_dirs=["include"]))
    (base / "vendor").mkdir()
    (base / "vendor" / "h.h").write_text('#define VAL "one"\n')
    (case.src / "include").symlink_to("../vendor")
    got, out = case.build()
    assert got["u.cpp.o"][:2] == ("compiled", "one") and "Compiled outside the root instead" in out, out
    (base / "vendor" / "h.h").write_text('#define VAL "two"\n')
    case.check("two")


# ---------------------------------------------------------------------------------------------
# more of our own


def test_a_retargeted_header_link(base):
    case = Case(base, {"u.cpp": tagged("VAL", head='#include "inc/hdr.h"\n'), "inc/one.h": '#define VAL "one"\n',
                       "inc/two.h": '#define VAL "two"\n'}, spec())
    (case.src / "inc" / "hdr.h").symlink_to("one.h")
    first_build(case, "one")
    (case.src / "inc" / "hdr.h").unlink()
    (case.src / "inc" / "hdr.h").symlink_to("two.h")
    case.check("two")


def test_include_next_gains_a_header_in_the_middle(base):
    case = Case(base, {"u.cpp": tagged("VAL", head="#include <chain.h>\n"),
                       "a/chain.h": "#include_next <chain.h>\n", "c/chain.h": '#define VAL "last"\n'},
                spec(include_dirs=["a", "b", "c"]))
    (case.src / "b").mkdir()
    first_build(case, "last")
    (case.src / "b" / "chain.h").write_text('#define VAL "middle"\n')
    case.check("middle")


def test_a_header_beside_the_source_shadows_an_include_folder(base):
    case = Case(base, {"src/u.cpp": tagged("VAL", head='#include "cfg.h"\n'), "inc/cfg.h": '#define VAL "inc"\n'},
                spec(include_dirs=["inc"], sources=["src/u.cpp"]))
    first_build(case, "inc")
    case.write({"src/cfg.h": '#define VAL "beside"\n'})
    case.check("beside")


def same_folder_again(case: Case, work: Path, want: str) -> str:
    """ninja again in the build folder a change was made beside: the object is rebuilt, holds what
    the change implies, and is what a real compile now gives (a --no-reuse build elsewhere)."""
    out = run([ninja_bin()], work)
    got = objects(work)
    real, _ = case.build(reuse=False)
    assert got["u.cpp.o"][1] == want, out.stdout
    assert got["u.cpp.o"][2] == real["u.cpp.o"][2]
    return out.stdout


def test_a_header_that_appears_earlier_in_the_search_path_in_the_same_build_folder(base):
    """The header appears in a folder searched before the one it was found in: no file ninja knows
    of changed, but the folder did, and the check before ninja decides finds the object's absence
    observation false, removes it, and this very run rebuilds it. `ninja certify` first says so."""
    case = Case(base, {"u.cpp": tagged("VAL", head="#include <cfg.h>\n"), "b/cfg.h": '#define VAL "b"\n'},
                spec(include_dirs=["a", "b"]))
    (case.src / "a").mkdir()
    first_build(case, "b")
    work = base / f"work-src-{case.n}"
    assert "no work to do" in run([ninja_bin()], work).stdout
    case.write({"a/cfg.h": '#define VAL "a"\n'})
    audit = run([ninja_bin(), "certify"], work, check=False)
    assert audit.returncode != 0 and "a/cfg.h: absent when compiled" in audit.stdout + audit.stderr
    assert (work / "build" / "hidden" / "obj" / "u.cpp.o").exists(), "an audit removes nothing"
    out = same_folder_again(case, work, "a")
    assert "no longer match what made them" in out
    assert "no work to do" in run([ninja_bin()], work).stdout
    assert run([ninja_bin(), "certify"], work).returncode == 0


def test_a_checkout_link_pointed_elsewhere_in_the_same_build_folder(base):
    """An include folder that is a link, pointed at another folder (ln -sfn): the link's own state
    changed, not any header's time; the same build folder rebuilds the object."""
    case = Case(base, {"u.cpp": tagged("VAL", head='#include "cfg.h"\n'), "one/cfg.h": '#define VAL "one"\n',
                       "two/cfg.h": '#define VAL "two"\n'}, spec(include_dirs=["inc"]))
    for target in ("one", "two"):
        os.utime(case.src / target / "cfg.h", (1_000_000, 1_000_000))  # old times: ninja's mtimes see nothing
    (case.src / "inc").symlink_to("one")
    first_build(case, "one")
    work = base / f"work-src-{case.n}"
    subprocess.run(["ln", "-sfn", "two", str(case.src / "inc")], check=True)
    same_folder_again(case, work, "two")


def test_a_library_that_appears_in_an_earlier_folder_relinks_the_module(base):
    """-L first -L second, the library in second: one that appears in first is what a link gives
    now. The link recorded that it looked in first and found nothing; the check before ninja
    decides relinks the module, and the certificate held that absence."""
    first, second = base / "first", base / "second"
    for folder, value in ((first, None), (second, 2)):
        folder.mkdir()
        if value:
            (base / "dep.c").write_text(f"int pp4_dep(void) {{ return {value}; }}\n")
            subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(folder / "libpp4dep.so"), str(base / "dep.c")], check=True)
    case = Case(base, {"u.cpp": 'extern "C" int pp4_dep(void);\nint u() { return pp4_dep(); }\n'},
                spec(extra=f'libraries = ["pp4dep"]\nlibrary_dirs = ["{first}", "{second}"]\n'))
    case.build()
    work = base / f"work-{case.src.name}-{case.n}"
    doc = json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))
    (module,) = doc["modules"]
    assert [first_lib := str(first / "libpp4dep.so"), "-"] in module["link_inputs"], "the absence is certified"
    (base / "dep.c").write_text("int pp4_dep(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", first_lib, str(base / "dep.c")], check=True)
    out = run([ninja_bin()], work).stdout
    assert "LINK" in out, f"the module was not linked again:\n{out}"
    mod = next((work / "build").rglob("*.so"))
    linked = subprocess.run(["readelf", "-d", str(mod)], capture_output=True, text=True).stdout
    assert "libpp4dep.so" in linked
    assert run([ninja_bin(), "certify"], work).returncode == 0


def test_a_coverage_build_writes_its_counts_where_a_real_build_does(base):
    """A unit instrumented for coverage (-fprofile-arcs, seen in what cc1plus was started with)
    writes its counts at run time to the folder it was compiled in: pp4 compiles it outside the
    root (one notice), so the object names this machine's build folder, not /pp4."""
    case = Case(base, {"u.cpp": "int u(int x) { return x > 0 ? 1 : 2; }\n"},
                spec(["-fprofile-arcs"], extra='libraries = ["gcov"]\n'))
    got, out = case.build()
    assert "instrumented for coverage or profiling" in out, out
    work = base / f"work-src-{case.n}"
    data = got["u.cpp.o"][2]
    assert b"/pp4/" not in data and str(work).encode() in data


def test_native_in_a_response_file_is_keyed_on_this_cpu(base):
    """-march=native inside a response file: the command's text never shows it, but the driver's
    children got it in COLLECT_GCC_OPTIONS, so the object is keyed on what the driver makes of this
    CPU, and the observation is the driver's own dry run here."""
    case = Case(base, {"u.cpp": tagged('"x"', head=""), "flags.rsp": "-O2 -march=native\n"},
                spec([f"@{base / 'src' / 'flags.rsp'}"]))
    first_build(case, "x")
    (compiler, recorded), = observations_of(base / f"work-src-{case.n}", "native:")
    assert recorded.startswith("native:-march=native:")
    said = subprocess.run([compiler, "-###", "-E", "-x", "c", os.devnull, "-march=native"], capture_output=True,
                          env={"PATH": os.defpath, "LC_ALL": "C"})
    assert recorded.endswith(hashlib.sha256(said.stdout + said.stderr + str(said.returncode).encode()).hexdigest())


def test_a_library_a_link_resolved_is_rebuilt_and_the_module_relinked(base):
    lib = base / "lib"
    lib.mkdir()

    def make_lib(value: int) -> None:
        (base / "dep.c").write_text(f"int pp4_dep(void) {{ return {value}; }}\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib / "libpp4dep.so"), str(base / "dep.c")], check=True)

    make_lib(1)
    case = Case(base, {"u.cpp": 'extern "C" int pp4_dep(void);\nint u() { return pp4_dep(); }\n'},
                spec(extra=f'libraries = ["pp4dep"]\nlibrary_dirs = ["{lib}"]\n'))
    got, _ = case.build()
    work = case.base / f"work-{case.src.name}-{case.n}"
    assert "no work to do" in run([ninja_bin()], work).stdout
    doc = json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))
    (module,) = doc["modules"]
    listed = dict(module["link_inputs"])
    digest = hashlib.sha256((lib / "libpp4dep.so").read_bytes()).hexdigest()
    # its bytes, and that the linking user may run it (a library's mode, as the linker left it)
    assert listed[str(lib / "libpp4dep.so")] == digest + ("+x" if os.access(lib / "libpp4dep.so", os.X_OK) else "")
    time.sleep(0.01)
    make_lib(2)
    audit = run([ninja_bin(), "certify"], work, check=False)
    assert audit.returncode != 0 and f"{lib / 'libpp4dep.so'}: sha256" in audit.stdout + audit.stderr, \
        "the audit did not name the library the module was linked with"
    out = run([ninja_bin()], work).stdout
    assert "LINK" in out, f"the module was not linked again after its library changed:\n{out}"
    assert run([ninja_bin(), "certify"], work).returncode == 0


def test_a_compile_that_asks_another_process_through_a_socket(base):
    """A compiler helper (an `as` wrapper in a -B folder) asks a server over a Unix socket what to
    assemble, as a compiler cache's client asks its server: the answer is an input no file shows, so
    such a compile is never stored; a socket path with nothing there is an absence like any other."""
    import socketserver
    import threading

    answer = ["one"]

    class Tag(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.sendall(answer[0].encode())

    sock = base / "tag.sock"
    server = socketserver.UnixStreamServer(str(sock), Tag)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tools = tagging_assembler(base, f"""import socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect({str(sock)!r})
    tag = s.recv(64).decode()
except OSError:
    tag = "no server"
""")
    case = Case(base, {"u.cpp": "int u() { return 1; }\n"}, spec([f"-B{tools}/"]))
    try:
        got, _ = case.build()
        assert got["u.cpp.o"][:2] == ("compiled", "one")
        event = next((base / "work-src-1" / "build" / ".pp4" / "events").glob("*.json")).read_text()
        assert "it made the system call connect" in event and "a socket reaches another process" in event
        answer[0] = "two"
        assert case.check("two")["u.cpp.o"][0] == "compiled"
    finally:
        server.shutdown()
        server.server_close()
    sock.unlink()
    # Nothing at the socket's path: the connect fails, the helper says so, and that is stored.
    got, _ = case.build()
    assert got["u.cpp.o"][:2] == ("compiled", "no server")
    assert case.check("no server")["u.cpp.o"][0] == "reused"


def test_a_compile_that_asks_the_host_name(base):
    """An assembler wrapper that puts the machine's name into the object (`uname -n`): no path
    shows it, so such a compile is never stored; on a machine of another name (a UTS namespace
    here) the object is that machine's."""
    if subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --uts is refused here (it needs root or user namespaces)")
    tools = base / "tools"
    tools.mkdir()
    (tools / "as").write_text('#!/bin/sh\nextra=$(mktemp --suffix=.s)\n'
                              'printf \'.section .rodata\\n.ascii "TAG[%s]"\\n\' "$(uname -n)" > "$extra"\n'
                              'exec as "$@" "$extra"\n')
    (tools / "as").chmod(0o755)
    case = Case(base, {"u.cpp": "int u() { return 1; }\n"}, spec([f"-B{tools}/"]))
    got, _ = case.build()
    assert got["u.cpp.o"][:2] == ("compiled", os.uname().nodename)
    event = next((base / "work-src-1" / "build" / ".pp4" / "events").glob("*.json")).read_text()
    assert "it made the system call uname" in event and "the machine's name" in event
    other = ("unshare", "--uts", "sh", "-c", 'hostname pp4-elsewhere && exec "$@"', "sh")
    assert case.check("pp4-elsewhere", wrap=other)["u.cpp.o"][0] == "compiled"


def test_a_compile_that_reads_shared_memory_another_process_left(base):
    """An assembler wrapper that puts what another process left in System V shared memory into the
    object: no path shows it (shmget takes a number), so such a compile is never stored, and when
    the memory says something else, the object says it too."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    key = 0x50500000 + os.getpid() % 0x10000
    shmid = libc.shmget(key, 64, 0o1000 | 0o600)  # IPC_CREAT
    assert shmid >= 0, os.strerror(ctypes.get_errno())
    shared = libc.shmat(shmid, None, 0)
    ctypes.memmove(shared, b"one\0", 4)
    tools = tagging_assembler(base, f"""import ctypes
libc = ctypes.CDLL(None)
libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget({key}, 64, 0)
tag = ctypes.string_at(libc.shmat(shmid, None, 0)).decode() if shmid >= 0 else "none"
""")
    case = Case(base, {"u.cpp": "int u() { return 1; }\n"}, spec([f"-B{tools}/"]))
    try:
        got, _ = case.build()
        assert got["u.cpp.o"][:2] == ("compiled", "one")
        event = next((base / "work-src-1" / "build" / ".pp4" / "events").glob("*.json")).read_text()
        assert "it made the system call shmget" in event and "System V or POSIX IPC" in event
        ctypes.memmove(shared, b"two\0", 4)
        assert case.check("two")["u.cpp.o"][0] == "compiled"
    finally:
        libc.shmdt(ctypes.c_void_p(shared))
        libc.shmctl(shmid, 0, None)  # IPC_RMID


@pytest.mark.parametrize("call", ["getxattr", "getxattrat"])
def test_a_compile_that_reads_an_extended_attribute(base, call):
    """An assembler wrapper that puts a file's extended attribute into the object, read by getxattr
    or by Linux 6.13's getxattrat: the attribute's value is observed (the file's content and
    presence stay the same when it changes), so the compile is stored, a fresh folder restores
    it while the value holds, and a new value is compiled."""
    probe = base / "xattr-probe"
    probe.write_text("")
    try:
        os.setxattr(probe, "user.pp4", b"x")
    except OSError as e:
        pytest.skip(f"this file system keeps no user extended attributes ({e})")
    tagged_file = base / "tagged"
    tagged_file.write_text("the same bytes throughout\n")
    os.setxattr(tagged_file, "user.pp4tag", b"one")
    if call == "getxattr":
        reads = f'tag = os.getxattr({str(tagged_file)!r}, "user.pp4tag").decode()'
    else:
        reads = (f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nbuf = ctypes.create_string_buffer(64)\n"
                 f"class Args(ctypes.Structure):\n    _fields_ = [('value', ctypes.c_uint64), ('size', ctypes.c_uint32), "
                 f"('flags', ctypes.c_uint32)]\nargs = Args(ctypes.addressof(buf), 64, 0)\n"
                 f"n = libc.syscall(464, -100, {str(tagged_file).encode()!r}, 0, b'user.pp4tag', ctypes.byref(args), 16)\n"
                 f"tag = buf.raw[:n].decode() if n > 0 else 'unread'")
    tools = tagging_assembler(base, reads)
    case = Case(base, {"u.cpp": "int u() { return 1; }\n"}, spec([f"-B{tools}/"]))
    first_build(case, "one")
    assert {p for p, _ in observations_of(base / "work-src-1", "xattr:user.pp4tag=")} == {str(tagged_file)}
    os.setxattr(tagged_file, "user.pp4tag", b"two")
    assert case.check("two")["u.cpp.o"][0] == "compiled"
    os.setxattr(tagged_file, "user.pp4tag", b"one")
    assert case.check("one")["u.cpp.o"][0] == "reused"


def test_a_helper_that_asks_over_udp_without_connecting(base):
    """A helper that sends a question with sendto and reads the answer with recvfrom, never calling
    connect: the send to an address is reported, so such a compile is never stored."""
    import socket
    import threading

    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    answer = ["one"]

    def serve():
        while True:
            try:
                _, peer = server.recvfrom(64)
            except OSError:
                return
            server.sendto(answer[0].encode(), peer)

    threading.Thread(target=serve, daemon=True).start()
    tools = tagging_assembler(base, f"""import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.sendto(b"tag?", ("127.0.0.1", {port}))
tag = s.recvfrom(64)[0].decode()
""")
    case = Case(base, {"u.cpp": "int u() { return 1; }\n"}, spec([f"-B{tools}/"]))
    try:
        got, _ = case.build()
        assert got["u.cpp.o"][:2] == ("compiled", "one")
        event = next((base / "work-src-1" / "build" / ".pp4" / "events").glob("*.json")).read_text()
        assert "it made the system call sendto" in event, event
        answer[0] = "two"
        assert case.check("two")["u.cpp.o"][0] == "compiled"
    finally:
        server.close()


def test_a_helper_that_sizes_its_work_by_the_cpus_it_may_use(base):
    """A helper that writes the CPUs it may use (nproc) into the object: every compile is told one
    CPU, whatever the machine and `configure --cpus`, so builds under other CPU sets restore the
    object, and it is what a compile under either gives."""
    tools = tagging_assembler(base, "tag = str(len(os.sched_getaffinity(0)))")
    case = Case(base, {"u.cpp": "int u() { return 1; }\n"}, spec([f"-B{tools}/"]))
    got, _ = case.build()
    assert got["u.cpp.o"][:2] == ("compiled", "1")
    cpus = sorted(os.sched_getaffinity(0))
    for chosen in ([cpus[0]], cpus):
        work = base / f"cpus-{len(chosen)}-{case.n}"
        work.mkdir()
        run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", str(case.src / "ext.toml"),
             "--store", str(case.store), "--cpus", ",".join(map(str, chosen))], work)
        run([ninja_bin()], work)
        (status, tag, data), = objects(work).values()
        assert (status, tag, data) == ("reused", "1", got["u.cpp.o"][2])


def test_a_header_that_is_a_named_pipe_another_process_feeds(base):
    """A header that is a named pipe: its bytes are whatever another process writes into it now,
    which no file's content shows. Such a compile is never stored; each build compiles what the
    pipe gives."""
    import threading

    case = Case(base, {"u.cpp": tagged("V", head='#include "feed.h"\n')}, spec())
    fifo = case.src / "feed.h"
    os.mkfifo(fifo)
    value, stop = ["one"], threading.Event()

    def feed():
        while not stop.is_set():
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until a compile opens it
            except OSError:
                time.sleep(0.01)
                continue
            os.set_blocking(fd, True)
            try:
                with os.fdopen(fd, "w") as pipe:
                    pipe.write(f'#define V "{value[0]}"\n')
            except BrokenPipeError:
                pass  # a reader that opened and closed it without reading: feed the next one

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        got, _ = case.build()
        assert got["u.cpp.o"][:2] == ("compiled", "one")
        event = next((base / "work-src-1" / "build" / ".pp4" / "events").glob("*.json")).read_text()
        assert "a named pipe, socket or device" in event, event
        value[0] = "two"
        assert case.check("two")["u.cpp.o"][0] == "compiled"
    finally:
        stop.set()
        feeder.join(5)


@pytest.mark.parametrize("machine_file,same_each_run", [("/proc/cpuinfo", True), ("/proc/sys/kernel/osrelease", True),
                                                        ("/proc/self/cgroup", True), ("/proc/self/mountinfo", False)])
def test_a_compile_that_reads_what_the_machine_is(base, machine_file, same_each_run):
    """An assembler wrapper that puts what /proc says of the machine or the run (its CPU, its
    kernel, its control group, the mounts of its root, whose ids differ from run to run) into the
    object: a compile is not keyed on them, so such a compile is never stored, and the next build
    compiles its own."""
    tools = tagging_assembler(base, f"with open({machine_file!r}, 'rb') as f:\n"
                                    "    tag = f.read(8).decode('latin-1').replace('\\n', '').replace('\"', '')")
    case = Case(base, {"u.cpp": "int u() { return 1; }\n"}, spec([f"-B{tools}/"]))
    got, out = case.build()
    assert got["u.cpp.o"][0] == "compiled" and got["u.cpp.o"][1]
    event = next((base / "work-src-1" / "build" / ".pp4" / "events").glob("*.json")).read_text()
    assert f"it read {machine_file}, which describes this machine or this run" in event
    assert f"1 of them not stored (first, build/hidden/obj/u.cpp.o: it read {machine_file}" in out, out
    if same_each_run:  # then a real compile now gives these very bytes
        assert case.check(got["u.cpp.o"][1])["u.cpp.o"][0] == "compiled"
    else:
        assert case.build()[0]["u.cpp.o"][0] == "compiled"


# ---------------------------------------------------------------------------------------------
# nvcc


def test_nvcc_options_file(base):
    stringify = "#define S(x) #x\n#define XS(x) S(x)\n"
    case = Case(base, {"u.cu": tagged("XS(VAL)", head=stringify), "opts.txt": "-DVAL=one\n"},
                spec([], sources=["u.cu"]).replace('kind = "cpp"\n', "").replace("cxx_flags", "cuda_flags")
                .replace("]\ninclude_dirs", f', "--options-file", "{base / "src" / "opts.txt"}"]\ninclude_dirs'))
    first_build(case, "one")
    case.write({"opts.txt": "-DVAL=two\n"})
    case.check("two")


def test_a_cuda_file_name_under_a_folder_with_a_space(base):
    """__FILE__ in the fixed root is the source relative to its root (u.cu): the same in both
    checkouts, and restored."""
    files = {"u.cu": 'extern "C" const char pp4_tag[] = "TAG[" __FILE__ "]";\n'
                     "namespace { __global__ void k(int *p) { *p = 1; } }\nvoid launch(int *p) { k<<<1, 1>>>(p); }\n"}
    text = spec(sources=["u.cu"]).replace('kind = "cpp"\n', "")
    one = Case(base, files, text, checkout="with space")
    first_build(one, "u.cu")
    two = Case(base, files, text, checkout="other place")
    got = two.check("u.cu")
    assert got["u.cu.o"][0] == "reused", "an anonymous namespace no longer binds a CUDA object to its folder"


def test_a_restore_says_what_the_compiler_said(base):
    """A unit whose compile warns: a fresh folder that restores its object prints the same warning,
    naming the file in that build's own folders, as a compile there would."""
    case = Case(base, {"u.cpp": '#warning "pp4 replays this"\nint u() { return 1; }\n'}, spec())
    got, out = case.build()
    assert got["u.cpp.o"][0] == "compiled" and "pp4 replays this" in out
    again, out = case.build()
    assert again["u.cpp.o"][0] == "reused"
    assert f"{case.src / 'u.cpp'}:1:2: warning: #warning \"pp4 replays this\"" in out, out


def test_device_line_information_names_the_real_source_and_is_never_stored(base):
    """nvcc -lineinfo: cicc writes each source's path, modification time and size into the device
    code's line table (PTX's .file directives). Seen in what cicc was started with: the unit is
    compiled outside the root (its object names this machine's source, as cuda-gdb and Nsight look
    for it) and never stored (no key covers a source's time)."""
    text = spec(["-lineinfo"], sources=["u.cu"]).replace('kind = "cpp"\n', "").replace("cxx_flags", "cuda_flags")
    case = Case(base, {"u.cu": "__global__ void k(int *p) { *p = 1; }\n"}, text)
    got, out = case.build()
    assert "device code carries line information" in out, out
    assert str(case.src / "u.cu").encode() in got["u.cu.o"][2] and b"/pp4/src" not in got["u.cu.o"][2]
    event = next((base / "work-src-1" / "build" / ".pp4" / "events").glob("*.json")).read_text()
    assert "modification times" in event
    again, _ = case.build()
    assert again["u.cu.o"][0] == "compiled"
