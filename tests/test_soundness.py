"""Soundness against hidden inputs: a restored object must be the object a compile gives now.

Each case changes one thing outside the sources (the environment, a folder the include search looks
in, a compiler), builds the probe fixture (tests/fixtures/probe: one CUDA unit without torch, one
pybind11 unit, four -I folders) in a fresh folder against a store that already holds the objects of
the unchanged build, and compares every object with a `--no-reuse` build made under the same
conditions: the tag strings both embed, and their bytes, every one of them (compiles in the fixed
execution root give the same bytes every time). Each case also checks the tags against what the C
preprocessor must make of the change (an oracle that owes nothing to pp4). Cases that change
something a finished build cannot see (ninja's mtimes do not show it) also check that
`ninja certify` names the stale object and that `python -m pp4.certify.audit --invalidate` then makes
`ninja` rebuild exactly it.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import stat
import sys
from pathlib import Path

import attrs
import pytest
from conftest import REPO
from test_build import ninja_bin, run

pytestmark = pytest.mark.slow

FIXTURE = REPO / "tests" / "fixtures" / "probe"
CU, CPP = "tagged.cu.o", "tagged_bind.cpp.o"
TAG = re.compile(rb"PP4TAGS\[[\x20-\x5c\x5e-\x7e]*\]")
BASE_TAGS = "PP4TAGS[angle=OFF quote=OFF foo=OFF chain=inc next=inc link=one date=Jan  1 1970 00:00:00]"


@attrs.frozen
class Build:
    work: Path
    out: str  # configure's and ninja's stdout and stderr
    status: dict  # object file name -> "compiled" | "reused"
    tags: dict  # object file name -> its PP4TAGS[...] string
    data: dict  # object file name -> bytes

    def tag(self, name: str) -> str:
        return self.tags[name]


class Lab:
    """The fixture's sources, one store, and a fresh build folder per build."""

    def __init__(self, base: Path):
        self.base = base
        self.src = base / "src"
        shutil.copytree(FIXTURE, self.src, symlinks=True)
        self.store = base / "store"
        self.n = 0

    def env(self, **changes) -> dict:
        env = dict(os.environ)
        for k, v in changes.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    def build(self, env: dict | None = None, build_env: dict | None = None, reuse: bool = True,
              spec: Path | None = None) -> Build:
        """configure (in env) and ninja (in build_env, else env) in a new folder."""
        self.n += 1
        work = self.base / f"work{self.n}"
        work.mkdir()
        env = env or self.env()
        args = [sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec",
                str(spec or self.src / "ext.toml"), "--store", str(self.store)] + ([] if reuse else ["--no-reuse"])
        conf = run(args, work, env)
        made = run([ninja_bin()], work, build_env or env)
        return read_build(work, conf.stdout + conf.stderr + made.stdout + made.stderr)

    def compare(self, env: dict | None = None, build_env: dict | None = None) -> tuple[Build, Build]:
        """A build against the store and a --no-reuse build under the same conditions; every object
        of the first must be the second's, tags and bytes."""
        got = self.build(env, build_env)
        want = self.build(env, build_env, reuse=False)
        assert set(want.status.values()) == {"compiled"}
        for name in (CU, CPP):
            assert got.tags[name] == want.tags[name], f"{name} ({got.status[name]}) is stale: {got.out}"
            assert got.data[name] == want.data[name], \
                f"{name} ({got.status[name]}) differs from a real compile"
        return got, want


def read_build(work: Path, out: str) -> Build:
    doc = json.loads(gzip.decompress((work / "build" / "certificate.json.gz").read_bytes()))
    status, tags, data = {}, {}, {}
    for o in doc["objects"]:
        name = Path(o["output"]).name
        status[name] = o["status"]
        data[name] = (work / o["output"]).read_bytes()
        found = TAG.findall(data[name])
        tags[name] = found[0].decode() if found else None
    return Build(work, out, status, tags, data)


def certify(work: Path, check=False, env=None):
    return run([ninja_bin(), "certify"], work, env, check=check)


def repair(work: Path, env=None) -> str:
    """The documented repair: --invalidate, then ninja (in env: a variable configure folded that
    differs makes ninja run configure again). Returns ninja's output."""
    proc = run([sys.executable, "-m", "pp4.certify.audit", "--invalidate", "build/certificate.json.gz"], work,
               dict(os.environ, PYTHONPATH=str(REPO)), check=False)
    assert proc.returncode == 1 and "invalidated" in proc.stdout, proc.stdout + proc.stderr
    return run([ninja_bin()], work, env).stdout


@pytest.fixture(scope="module")
def lab(tmp_path_factory, toolchain):
    lab = Lab(tmp_path_factory.mktemp("soundness"))
    first = lab.build()
    assert first.status == {CU: "compiled", CPP: "compiled"}
    assert first.tags == {CU: BASE_TAGS, CPP: BASE_TAGS}
    again = lab.build()
    assert again.status == {CU: "reused", CPP: "reused"}  # a fresh folder restores both
    lab.first = first
    return lab


def _wrapper(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


# ---------------------------------------------------------------------------------------------
# absent-file probes


@pytest.mark.parametrize("variable", ["CPATH", "CPLUS_INCLUDE_PATH"])
def test_include_path_folder_absent_at_first_gains_a_probed_header(lab, variable):
    """The folder does not exist at the first build; then a header the unit probes with
    __has_include(<probe_h.h>) appears there."""
    folder = lab.base / f"{variable}-dir"
    env = lab.env(**{variable: str(folder)})
    before = lab.build(env)
    assert before.tags[CU] == before.tags[CPP] == BASE_TAGS
    assert f"folded {variable}=" in before.out
    folder.mkdir()
    (folder / "probe_h.h").write_text("// now it exists\n")
    try:
        got, _ = lab.compare(env)
        assert got.status == {CU: "compiled", CPP: "compiled"}
        assert "angle=ON" in got.tag(CU) and "angle=ON" in got.tag(CPP)
        # The finished build of before: the audit sees it, and the repair works (in the environment
        # configure folded: without it, ninja would run configure again for the variable's absence).
        proc = certify(before.work, env=env)
        assert proc.returncode == 1 and f"changed since it was built: {folder}" in proc.stderr, proc.stderr
        out = repair(before.work, env)
        assert read_build(before.work, out).tags[CU].startswith("PP4TAGS[angle=ON")
        assert "audit passed" in certify(before.work, check=True, env=env).stdout
    finally:
        shutil.rmtree(folder)


def test_quote_probe_appears_in_an_include_folder(lab):
    """__has_include("probe.h") and probe.h then appears in the third of the extension's -I folders."""
    probe = lab.src / "incC" / "probe.h"
    probe.write_text("// appeared\n")
    try:
        got, _ = lab.compare()
        assert got.status == {CU: "compiled", CPP: "compiled"}
        assert "quote=ON" in got.tag(CU) and "quote=ON" in got.tag(CPP)
        proc = certify(lab.first.work)
        assert proc.returncode == 1 and str(probe) in proc.stderr, proc.stderr
    finally:
        probe.unlink()
    assert "audit passed" in certify(lab.first.work, check=True).stdout


def test_dangling_symlink_that_comes_alive(lab):
    """A link in an -I folder that points nowhere is not found; once its target exists it is."""
    link, target = lab.src / "incC" / "probe_h.h", lab.base / "late-target.h"
    link.symlink_to(target)
    try:
        before = lab.build()
        assert before.status == {CU: "reused", CPP: "reused"} and "angle=OFF" in before.tag(CU)
        target.write_text("// alive\n")
        got, _ = lab.compare()
        assert "angle=ON" in got.tag(CU) and got.status[CU] == "compiled"
    finally:
        link.unlink()
        target.unlink(missing_ok=True)


def test_new_header_shadows_one_in_a_later_folder(lab):
    """<chain.h> is found in inc/, the last -I folder, until incB/ (earlier) gains one."""
    shadow = lab.src / "incB" / "chain.h"
    shadow.write_text('#define PP4_CHAIN "incB"\n')
    try:
        got, _ = lab.compare()
        assert "chain=incB" in got.tag(CU) and "chain=incB" in got.tag(CPP)
    finally:
        shadow.unlink()


def test_include_next_chain_gains_a_header_in_the_middle(lab):
    """incA/next.h #include_next's <next.h>: inc/next.h, until incB/ gains one."""
    middle = lab.src / "incB" / "next.h"
    middle.write_text('#define PP4_NEXT "incB"\n')
    try:
        got, _ = lab.compare()
        assert "next=incB" in got.tag(CU) and "next=incB" in got.tag(CPP)
    finally:
        middle.unlink()


def test_retargeted_header_symlink(lab):
    link = lab.src / "inc" / "link.h"
    link.unlink()
    link.symlink_to("../variants/two.h")
    try:
        got, _ = lab.compare()
        assert "link=two" in got.tag(CU) and "link=two" in got.tag(CPP)
    finally:
        link.unlink()
        link.symlink_to("../variants/one.h")


def settle(work: Path, env: dict | None = None) -> None:
    """ninja once more after a build: nothing has changed, so the check before ninja decides
    (pp4/reuse/recheck.py) finds nothing; an edit that keeps a file's mtime (and its folder's) is
    invisible to ninja's own decisions, but not to that check's identities (pp4/reuse/quickcheck.py)."""
    assert "no longer match" not in run([ninja_bin()], work, env).stdout


def test_header_edited_with_its_old_mtime(lab):
    """An edit ninja's mtimes cannot show (the mtime put back): a fresh folder must not restore the
    old object; in the finished build certify names it, and the next ninja rebuilds exactly it."""
    header = lab.src / "inc" / "chain.h"
    original, st = header.read_bytes(), header.stat()
    settle(lab.first.work)
    header.write_bytes(b'#define PP4_CHAIN "edit"\n')
    os.utime(header, ns=(st.st_atime_ns, st.st_mtime_ns))
    try:
        got, _ = lab.compare()
        assert "chain=edit" in got.tag(CU)
        work = lab.first.work
        proc = certify(work)
        assert proc.returncode == 1 and f"changed since it was built: {header}: sha256" in proc.stderr, proc.stderr
        assert "-m pp4.certify.audit --invalidate" in proc.stderr  # the advice names the repair
        out = run([ninja_bin()], work).stdout  # the check before ninja decides sees the header's identity move
        assert sorted(re.findall(r"(?:CUDA|CXX) \S+/(\S+)$", out, re.M)) == sorted([CPP, CU])
        assert "chain=edit" in read_build(work, out).tags[CU]
    finally:
        header.write_bytes(original)
        os.utime(header, ns=(st.st_atime_ns, st.st_mtime_ns))
    out = repair(lab.first.work)  # back to the old bytes, which ninja cannot see either
    assert read_build(lab.first.work, out).tags[CU] == BASE_TAGS


# ---------------------------------------------------------------------------------------------
# the compilers that run


def test_gcc_wrapper_first_on_path_when_configuring(lab):
    """nvcc runs `gcc` for host code: a wrapper adding -DFOO, first on PATH when configure runs,
    becomes the -ccbin, and its bytes are in the key."""
    wrapper = _wrapper(lab.base / "wrap" / "gcc", 'exec /usr/bin/gcc -DFOO "$@"')
    env = lab.env(PATH=f"{wrapper.parent}:{os.environ['PATH']}")
    try:
        got, _ = lab.compare(env)
        assert got.status[CU] == "compiled" and "foo=ON" in got.tag(CU)
        assert got.status[CPP] == "reused" and "foo=OFF" in got.tag(CPP)
        assert f"host compiler {wrapper}" in got.out
    finally:
        shutil.rmtree(wrapper.parent)


def test_compiler_wrappers_on_path_at_build_time_only_change_nothing(lab):
    """Configured without them, built with gcc, g++ and c++ wrappers first on PATH: the compilers
    are absolute and the compile environment's PATH is fixed, so nothing reaches them."""
    folder = lab.base / "wrap-build"
    for name in ("gcc", "g++", "c++"):
        _wrapper(folder / name, f'exec /usr/bin/{name} -DFOO "$@"')
    try:
        got, _ = lab.compare(lab.env(), lab.env(PATH=f"{folder}:{os.environ['PATH']}"))
        assert got.status == {CU: "reused", CPP: "reused"} and got.tags[CU] == BASE_TAGS
    finally:
        shutil.rmtree(folder)


def test_cxx_wrapper_edited_in_place_keeping_size_and_mtime(lab):
    wrapper = _wrapper(lab.base / "cxxwrap" / "c++", 'exec /usr/bin/c++ -DBAR "$@"')
    env = lab.env(CXX=str(wrapper))
    try:
        before = lab.build(env)
        assert "foo=OFF" in before.tag(CPP)
        settle(before.work, env)
        st = wrapper.stat()
        wrapper.write_text(wrapper.read_text().replace("-DBAR", "-DFOO"))  # same size
        os.utime(wrapper, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime: only its ctime moved
        got, _ = lab.compare(env)
        assert got.status[CPP] == "compiled" and "foo=ON" in got.tag(CPP)
        assert got.status[CU] == "reused"
        work = before.work
        proc = certify(work)
        assert proc.returncode == 1 and f"changed since it was built: {wrapper}: sha256" in proc.stderr, proc.stderr
        out = run([ninja_bin()], work, env).stdout
        assert re.findall(r"(?:CUDA|CXX) \S+/(\S+)$", out, re.M) == [CPP]
        assert "foo=ON" in read_build(work, out).tags[CPP]
    finally:
        shutil.rmtree(wrapper.parent)


# ---------------------------------------------------------------------------------------------
# the environment


def test_includes_variable_is_dropped_with_a_notice(lab):
    """nvcc.profile expands INCLUDES into every host-compiler command: pp4 never passes it on."""
    env = lab.env(INCLUDES="-DFOO")
    got, _ = lab.compare(env)
    assert got.status == {CU: "reused", CPP: "reused"} and got.tags[CU] == BASE_TAGS
    assert "configure: notice: INCLUDES is set and not passed to the compilers" in got.out


def test_ptxas_flags_are_dropped(lab):
    """PTXAS_FLAGS="-O0 -g" would change the device code (a bigger object): never passed on, so the
    restored object is the compile's, byte for byte."""
    env = lab.env(PTXAS_FLAGS="-O0 -g")
    got, want = lab.compare(env)
    assert got.status[CU] == "reused" and len(want.data[CU]) == len(lab.first.data[CU])
    assert "PTXAS_FLAGS is set and not passed to the compilers" in got.out


def test_dropped_variables_reach_no_compiler(lab, tmp_path):
    """gcc would write a second dependency file for DEPENDENCIES_OUTPUT and look for its programs
    under GCC_EXEC_PREFIX: neither reaches it, and the build says so."""
    extra = tmp_path / "extra.d"
    env = lab.env(DEPENDENCIES_OUTPUT=str(extra), GCC_EXEC_PREFIX="/nonexistent/", COMPILER_PATH="/nonexistent")
    got, _ = lab.compare(env)
    assert not extra.exists()
    assert got.status == {CU: "reused", CPP: "reused"}
    for name in ("DEPENDENCIES_OUTPUT", "GCC_EXEC_PREFIX", "COMPILER_PATH"):
        assert f"{name} is set and not passed to the compilers" in got.out


def test_nvcc_append_and_prepend_flags_are_folded_into_the_commands(lab):
    env = lab.env(NVCC_APPEND_FLAGS="-DFOO", NVCC_PREPEND_FLAGS="-DPREPENDED")
    got, _ = lab.compare(env)
    assert got.status == {CU: "compiled", CPP: "reused"}
    assert "foo=ON" in got.tag(CU) and "foo=OFF" in got.tag(CPP)
    assert "configure: folded NVCC_APPEND_FLAGS='-DFOO'" in got.out
    text = (got.work / "build.ninja").read_text()
    assert "-DPREPENDED" in text and "-DFOO" in text
    # The same folder built without them: configure runs again (it folded them), with a line saying
    # why, and the unit is what a compile without them gives.
    made = run([ninja_bin()], got.work, lab.env(NVCC_APPEND_FLAGS=None, NVCC_PREPEND_FLAGS=None))
    assert "pp4: NVCC_APPEND_FLAGS is unset here but was '-DFOO' when configure ran: configure runs" in made.stdout
    assert "CONFIGURE" in made.stdout and "-DFOO" not in (got.work / "build.ninja").read_text()
    assert "foo=OFF" in read_build(got.work, "").tags[CU]


def test_source_date_epoch_is_folded_and_fixed_otherwise(lab):
    env = lab.env(SOURCE_DATE_EPOCH="86400")
    got, _ = lab.compare(env)
    assert got.status == {CU: "compiled", CPP: "compiled"}
    assert "date=Jan  2 1970 00:00:00" in got.tag(CU)
    # Unset, __DATE__ and __TIME__ are those of epoch 0 in every compile: a restore hours later is exact.
    assert lab.build().tags[CU] == BASE_TAGS


def test_timestamp_macro_unit_is_never_stored(lab):
    """__TIMESTAMP__ is the source's mtime, which no key covers: such a unit compiles every time."""
    src = lab.src / "src" / "stamped.cpp"
    src.write_text('extern "C" const char pp4_stamp[] = __TIMESTAMP__;\n')
    spec = lab.src / "ext-stamped.toml"
    spec.write_text((lab.src / "ext.toml").read_text().replace('"src/tagged_bind.cpp"]',
                                                                '"src/tagged_bind.cpp", "src/stamped.cpp"]'))
    try:
        first = lab.build(spec=spec)
        second = lab.build(spec=spec)
        assert first.status["stamped.cpp.o"] == second.status["stamped.cpp.o"] == "compiled"
        assert second.status[CU] == "reused"
        doc = json.loads(gzip.decompress((second.work / "build" / "certificate.json.gz").read_bytes()))
        stamped = next(o for o in doc["objects"] if o["output"].endswith("stamped.cpp.o"))
        assert "__TIMESTAMP__" in stamped["not_stored"]
    finally:
        src.unlink()
        spec.unlink()


def test_damaged_stored_object_is_recompiled_with_a_warning(lab):
    from pp4.store.local import Store

    restored = lab.build()
    assert restored.status[CU] == "reused"
    doc = json.loads(gzip.decompress((restored.work / "build" / "certificate.json.gz").read_bytes()))
    obj = next(o for o in doc["objects"] if o["output"].endswith(CU))
    path = Store(lab.store).object_path(obj["object_sha256"])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    path.write_bytes(bytes(data))
    got, _ = lab.compare()
    assert got.status == {CU: "compiled", CPP: "reused"}
    assert re.search(r"pp4\.reuse: warning: .*(damaged|corrupt).*compiling \S*tagged\.cu\.o instead", got.out, re.I), got.out


ANON_CU = """\
namespace {
__global__ void scale_kernel(float* x, float s) { x[threadIdx.x] *= s; }
}
void scale(float* x, float s) { scale_kernel<<<1, 32>>>(x, s); }
"""
PLAIN_CU = """\
__global__ void shift_kernel(float* x, float s) { x[threadIdx.x] += s; }
void shift(float* x, float s) { shift_kernel<<<1, 32>>>(x, s); }
"""


def test_a_cuda_unit_whose_object_names_an_anonymous_namespace_is_shared_across_folders(tmp_path, toolchain):
    """nvcc names an anonymous namespace after the real path of the source file. In the fixed root
    that path is /pp4/src/... wherever the tree is: moved to a new folder, the unit is restored, and
    is what a compile there gives, byte for byte."""
    def tree(folder: Path) -> Path:
        (folder / "src").mkdir(parents=True)
        (folder / "src" / "anon.cu").write_text(ANON_CU)
        (folder / "src" / "plain.cu").write_text(PLAIN_CU)
        (folder / "ext.toml").write_text('name = "pp4_anon"\nsources = ["src/anon.cu", "src/plain.cu"]\n')
        return folder / "ext.toml"

    def build(spec: Path, work: Path, *extra: str) -> dict[str, tuple[str, bytes]]:
        work.mkdir()
        run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", str(spec),
             "--store", str(tmp_path / "store"), *extra], work)
        run([ninja_bin(), "build/pp4_anon/obj/src/anon.cu.o", "build/pp4_anon/obj/src/plain.cu.o"], work)
        from pp4.build.events import Events

        known = Events(str(work / "build" / ".pp4"))
        out = {}
        for name in ("anon.cu.o", "plain.cu.o"):
            rel = f"build/pp4_anon/obj/src/{name}"
            out[name] = (known.get(rel).status, (work / rel).read_bytes())
        return out

    first = build(tree(tmp_path / "a"), tmp_path / "work-a")
    moved = tree(tmp_path / "b")
    second = build(moved, tmp_path / "work-b")
    real = build(moved, tmp_path / "work-b-real", "--no-reuse")
    assert first["anon.cu.o"][0] == "compiled" and second["anon.cu.o"][0] == "reused"
    assert second["plain.cu.o"][0] == "reused"
    assert b"_GLOBAL__N__" in first["anon.cu.o"][1], "the unit does name an anonymous namespace"
    # The oracle: what the build used is what compiling there gives.
    assert second["anon.cu.o"][1] == real["anon.cu.o"][1]
    assert second["plain.cu.o"][1] == real["plain.cu.o"][1]
