"""exllamav3's extension: pinned sources, upstream's selection and flags, the facc patch, pybind internals."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, content_snapshot

from pp4 import paths
from pp4.plan import modules as plan
from pp4.plan.torchflags import torch_build_flags
from pp4.sources import exl3, extensions, unidiff

ARCH = ["9.0"]
# Light real units (2-core machine, sm_90, full flags: about 2.5 s, 7 s and 15-20 s each): a C++ unit,
# a CUDA unit the patch leaves alone, and one the patch changes (the fused decode MoE GEMV
# instantiates exl3_moe_coop_kernel.cuh with exl3_gemv_kernel.cuh's MMA helpers).
LIGHT_UNITS = ["hadamard.cpp", "quant/comp_units/exl3_gemv_int8_inst_coop_k8.cu",
               "quant/comp_units/exl3_moe_coop_inst_k1.cu"]
PATCHED_UNIT = "quant/comp_units/exl3_moe_coop_inst_k1.cu"
F16_ACC_MMA = "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16"
F32_ACC_MMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"


@pytest.fixture(scope="session")
def source_lock():
    return exl3.load_lock()


@pytest.fixture(scope="session")
def sources_dir(shared_cache, tmp_path_factory) -> Path:
    """The pinned sources unpacked once for the session (and the facc copy beside them)."""
    dest = tmp_path_factory.mktemp("exl3-sources")
    exl3.fetch_sources(shared_cache, dest)
    return dest


@pytest.fixture(scope="session")
def stock_root(sources_dir) -> Path:
    return sources_dir / "stock" / exl3.EXT_DIR_NAME


@pytest.fixture(scope="session")
def cached_wheel(shared_cache, source_lock, stock_root) -> Path:
    return paths.wheel_cache_dir(shared_cache) / f"{source_lock.wheel.sha256}.whl"


def _copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --------------------------------------------------------------------------- the pin and the fetch


def test_lock_pins_the_release(source_lock):
    assert source_lock.version == "1.6.5"
    assert source_lock.wheel.filename == "exllamav3-1.6.5-py3-none-any.whl"  # platform-independent
    assert source_lock.wheel.sha256 == "550c0d04c755f249840e5c1edc26b0e80c7342c33b5d99ad17479abb407e8ded"
    assert source_lock.source_dir == "exllamav3/exllamav3_ext"


def test_corrupted_wheel_is_refused_with_the_message(tmp_path, source_lock, cached_wheel):
    house = tmp_path / "house"
    house.mkdir()
    data = bytearray(cached_wheel.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (house / source_lock.wheel.filename).write_bytes(bytes(data))
    bad_sha = hashlib.sha256(bytes(data)).hexdigest()
    cache_root = tmp_path / "cache"
    with pytest.raises(exl3.Exl3Error) as e:
        exl3.fetch_sources(cache_root, tmp_path / "dest", wheel_dir=house)
    assert str(e.value) == (
        f"exllamav3 1.6.5 sources: exllamav3-1.6.5-py3-none-any.whl from {house} has sha256 {bad_sha}, but the "
        f"lock pins {source_lock.wheel.sha256}. The file is corrupt or not the pinned release: delete it (or fix "
        "the wheel directory) and provision again; pp4 installs no other bytes."
    )
    assert not list(paths.wheel_cache_dir(cache_root).glob("*.whl")), "a corrupt wheel entered the cache"
    assert not (tmp_path / "dest" / "stock" / exl3.EXT_DIR_NAME).exists()


def test_corrupted_cache_entry_is_refused(tmp_path, source_lock, cached_wheel):
    cache_root = tmp_path / "cache"
    entry = paths.wheel_cache_dir(cache_root) / cached_wheel.name
    entry.parent.mkdir(parents=True)
    data = bytearray(cached_wheel.read_bytes())
    data[100] ^= 0xFF
    entry.write_bytes(bytes(data))
    with pytest.raises(exl3.Exl3Error, match=r"the cache entry is corrupt\. Delete it and run again\."):
        exl3.fetch_sources(cache_root, tmp_path / "dest")
    assert not (tmp_path / "dest" / "stock" / exl3.STAMP_NAME).is_file()


def test_wheel_directory_works_without_an_index(tmp_path, source_lock, cached_wheel, stock_root):
    house = tmp_path / "house"
    house.mkdir()
    shutil.copyfile(cached_wheel, house / source_lock.wheel.filename)
    root = exl3.fetch_sources(tmp_path / "cache", tmp_path / "dest", wheel_dir=house)
    assert (paths.wheel_cache_dir(tmp_path / "cache") / cached_wheel.name).is_file()
    assert exl3.sources_sha256(root) == exl3.sources_sha256(stock_root)


def test_only_the_extension_sources_are_unpacked(stock_root, cached_wheel):
    with zipfile.ZipFile(cached_wheel) as zf:
        wanted = {n[len("exllamav3/exllamav3_ext/"):] for n in zf.namelist()
                  if n.startswith("exllamav3/exllamav3_ext/") and not n.endswith("/")}
    got = {p.relative_to(stock_root).as_posix() for p in stock_root.rglob("*") if p.is_file()}
    assert got == wanted
    assert {p.name for p in stock_root.parent.iterdir()} == {exl3.EXT_DIR_NAME, exl3.STAMP_NAME, ".lock"}


def test_unpack_is_idempotent(tmp_path, shared_cache):
    dest = tmp_path / "dest"
    root = exl3.fetch_sources(shared_cache, dest)
    before = content_snapshot(dest)
    assert exl3.fetch_sources(shared_cache, dest) == root
    assert content_snapshot(dest) == before  # the stamp's fast path
    # The full path (no stamp) also writes only what differs: every source keeps its inode and mtime.
    stamp = "stock/" + exl3.STAMP_NAME
    (dest / stamp).unlink()
    exl3.fetch_sources(shared_cache, dest)
    after = content_snapshot(dest)
    assert {k: v for k, v in after.items() if k != stamp} == {k: v for k, v in before.items() if k != stamp}
    assert after[stamp][4] == before[stamp][4]  # the same record, written again


def test_interrupted_unpack_is_not_taken_as_complete(tmp_path, shared_cache, monkeypatch):
    dest = tmp_path / "dest"
    tree = dest / "stock"
    calls = []
    real = exl3.write_if_changed

    def dies_midway(path, content):
        calls.append(path)
        if len(calls) == 100:
            raise KeyboardInterrupt("interrupted")
        return real(path, content)

    monkeypatch.setattr(exl3, "write_if_changed", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        exl3.fetch_sources(shared_cache, dest)
    assert not (tree / exl3.STAMP_NAME).is_file()
    monkeypatch.setattr(exl3, "write_if_changed", real)
    root = exl3.fetch_sources(shared_cache, dest)
    assert (tree / exl3.STAMP_NAME).is_file()
    assert len(exl3.select_sources(root)) == 194

    # Damage after completion (an edited file, a stray unit): the stamp no longer holds, the next run repairs.
    before = content_snapshot(root)
    (root / "add.cu").write_text("// edited\n")
    (root / "stray.cu").write_text("int stray;\n")
    exl3.fetch_sources(shared_cache, dest)
    after = content_snapshot(root)
    assert set(after) == set(before)
    assert after["add.cu"][4] == before["add.cu"][4]
    untouched = {k: v for k, v in after.items() if k != "add.cu"}
    assert untouched == {k: v for k, v in before.items() if k != "add.cu"}


# --------------------------------------------------------------------------- selection and flags


def _upstream_cuda_flags_module(cached_wheel: Path, tmp_path: Path):
    """exllamav3/util/cuda_flags.py from the pinned wheel (standard library only, loadable by path)."""
    with zipfile.ZipFile(cached_wheel) as zf:
        (tmp_path / "cuda_flags.py").write_bytes(zf.read("exllamav3/util/cuda_flags.py"))
        ext_py = zf.read("exllamav3/ext.py").decode()
    spec = importlib.util.spec_from_file_location("exl3_upstream_cuda_flags", tmp_path / "cuda_flags.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, ext_py


def test_source_list_has_the_expected_counts(stock_root):
    sources = exl3.select_sources(stock_root)
    assert len(sources) == 194
    assert sum(s.endswith(".cu") for s in sources) == 169
    assert sum(s.endswith(".cpp") for s in sources) == 25
    assert not any(s.startswith("rocm/") for s in sources)
    assert "bindings.cpp" in sources and "cpu/moe_mul1.cpp" in sources and "hgemm_f16acc.cu" in sources


def test_selection_and_flags_are_upstreams(stock_root, cached_wheel, tmp_path, toolchain, monkeypatch):
    upstream, ext_py = _upstream_cuda_flags_module(cached_wheel, tmp_path)
    ours = exl3.select_sources(stock_root)
    theirs = [os.path.relpath(p, stock_root) for p in upstream.extension_sources(str(stock_root), hip=False)]
    assert list(ours) == theirs
    for var in ("PYTORCH_NVCC", "EXLLAMA_EXT_COMPRESS", "EXLLAMA_EXT_LINEINFO"):
        monkeypatch.delenv(var, raising=False)
    assert list(exl3.cuda_flags(toolchain.nvcc)) == upstream.cuda_cflags(cuda_home=str(toolchain.prefix))
    assert "--compress-mode=size" in exl3.cuda_flags(toolchain.nvcc)  # nvcc 13 has it
    # ext.py (the JIT build): -Ofast for C++ on Linux, the sources folder as the include path, no ld flags.
    assert 'extra_cflags += ["-Ofast"]' in ext_py
    assert "extra_include_paths = [sources_dir]" in ext_py
    assert exl3.CXX_FLAGS == ("-Ofast",) and exl3.INCLUDE_DIRS == (".",) and exl3.LD_FLAGS == ()


def test_extension_records(stock_root, sources_dir, toolchain):
    stock = exl3.exl3_extension("stock", stock_root, nvcc=toolchain.nvcc)
    facc = exl3.exl3_extension("facc", stock_root, work_dir=sources_dir, nvcc=toolchain.nvcc)
    assert (stock.target, stock.module, stock.root) == ("exl3", "exllamav3_ext", stock_root)
    assert (facc.target, facc.module, facc.root) == ("exl3-facc", "exllamav3_ext_facc",
                                                     sources_dir / "facc" / exl3.EXT_DIR_NAME)
    assert stock.sources == facc.sources and len(stock.sources) == 194
    assert stock.include_dirs == facc.include_dirs == (".",)
    define = '-DPYBIND11_STDLIB="_pp4_exl3_facc"'
    # Exactly one define more, in both compilers' flags, and nothing else differs.
    assert list(facc.cxx_flags) == [*stock.cxx_flags, define]
    assert list(facc.cuda_flags) == [*stock.cuda_flags, define]
    assert stock.cuda_flags == ("-O3", "--use_fast_math", "-Xcudafe", "--diag_suppress=177",
                                "-Xcudafe", "--diag_suppress=20012", "--compress-mode=size")
    assert stock.ld_flags == facc.ld_flags == ()
    extensions.validate([extensions.from_spec(extensions.BUILTIN_SPECS["p2p"])[0], stock, facc])
    assert stock.provenance["exllamav3"] == "1.6.5" and stock.provenance["origin"] == "pinned"
    assert facc.provenance["patch"] == "pp4/sources/patches/exl3-facc.patch"
    assert facc.provenance["pybind11_internals"] == "PYBIND11_STDLIB=_pp4_exl3_facc"
    assert exl3.FACC_PATCH in facc.spec_files and exl3.LOCK_PATH in stock.spec_files
    with pytest.raises(exl3.Exl3Error, match="needs a work_dir"):
        exl3.exl3_extension("facc", stock_root)
    with pytest.raises(exl3.Exl3Error, match="unknown exllamav3 variant 'fp64'"):
        exl3.exl3_extension("fp64", stock_root)


# --------------------------------------------------------------------------- the facc patch


def test_facc_patch_applies_to_the_pinned_sources(stock_root, tmp_path):
    stock_key = exl3.sources_sha256(stock_root)
    root = exl3.facc_sources(stock_root, tmp_path)
    assert root == tmp_path / "facc" / exl3.EXT_DIR_NAME and (tmp_path / "facc" / exl3.STAMP_NAME).is_file()
    assert exl3.sources_sha256(stock_root) == stock_key, "the stock sources were changed"
    files = content_snapshot(root)
    assert files.keys() == content_snapshot(stock_root).keys()
    changed = {rel for rel in files if (root / rel).read_bytes() != (stock_root / rel).read_bytes()}
    assert changed == {"hgemm_f16acc.cu", "turing/fa75.cu", "quant/exl3_gemm_inner.cuh",
                       "quant/exl3_gemv_kernel.cuh", "quant/exl3_moe_coop_kernel.cuh"}
    # No fp16-accumulator MMA is used any more: the helpers are only defined, never called.
    text = {rel: (root / rel).read_text() for rel in ("quant/exl3_gemv_kernel.cuh", "quant/exl3_moe_coop_kernel.cuh",
                                                       "quant/exl3_gemm_inner.cuh", "hgemm_f16acc.cu", "turing/fa75.cu")}
    assert "FragC_h ch" not in text["quant/exl3_gemv_kernel.cuh"] + text["quant/exl3_moe_coop_kernel.cuh"]
    assert "mma_ab_h(a01" not in text["quant/exl3_gemv_kernel.cuh"] + text["quant/exl3_moe_coop_kernel.cuh"]
    assert "#define EXL3_GEMM_H_ACC 1" not in text["quant/exl3_gemm_inner.cuh"]
    # (hgemm_f16acc.cu's rate probe still times the fp16-accumulator MMA; it sums no results)
    assert "mma_f16(hacc" not in text["hgemm_f16acc.cu"] and "mma_f16(h, " not in text["hgemm_f16acc.cu"]
    assert "mma1688h(t" not in text["turing/fa75.cu"]
    if shutil.which("patch"):  # the system's patch agrees byte for byte
        copy = _copy_tree(stock_root, tmp_path / "sys" / exl3.EXT_DIR_NAME)
        subprocess.run(["patch", "-s", "-p1", "-i", str(exl3.FACC_PATCH)], cwd=copy.parent, check=True)
        assert content_snapshot(copy).keys() == content_snapshot(root).keys()
        assert all((copy / r).read_bytes() == (root / r).read_bytes() for r in content_snapshot(root))


def test_the_default_configuration_survives_a_deleted_build_folder(tmp_path, toolchain, cached_wheel):
    """The README's configure (every target; the facc sources are made inside the build folder):
    after `rm -rf build`, ninja runs configure again, which makes them anew, instead of stopping at
    "missing and no known rule to make it"."""
    import sys

    from test_specs_build import ninja_bin, run

    # The pinned wheel comes from the shared cache (cached_wheel), as on a second configure.
    run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--store", str(tmp_path / "store")],
        tmp_path)
    facc = tmp_path / "build" / "exl3-src" / "facc" / exl3.EXT_DIR_NAME
    assert facc.is_dir()
    shutil.rmtree(tmp_path / "build")
    again = run([ninja_bin(), "build.ninja"], tmp_path, check=False)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "CONFIGURE" in again.stdout and facc.is_dir()
    # (not `ninja -n`: a dry run always says it would run configure, docs/configure.md)
    assert "CONFIGURE" not in run([ninja_bin(), "build.ninja"], tmp_path).stdout


def test_reapplying_the_patch_touches_nothing(stock_root, tmp_path):
    exl3.facc_sources(stock_root, tmp_path)
    before = content_snapshot(tmp_path)
    exl3.facc_sources(stock_root, tmp_path)
    exl3.exl3_extension("facc", stock_root, work_dir=tmp_path)
    assert content_snapshot(tmp_path) == before
    # What facc_sources applies: the patch to the stock files, in memory; it changes the five files.
    files = {f"{exl3.EXT_DIR_NAME}/{r}": (stock_root / r).read_bytes() for r in content_snapshot(stock_root)}
    patched = unidiff.apply_patch_to_files(exl3.FACC_PATCH, files)
    assert sorted(p for p in patched if patched[p] != files[p]) == [
        "exllamav3_ext/hgemm_f16acc.cu", "exllamav3_ext/quant/exl3_gemm_inner.cuh",
        "exllamav3_ext/quant/exl3_gemv_kernel.cuh", "exllamav3_ext/quant/exl3_moe_coop_kernel.cuh",
        "exllamav3_ext/turing/fa75.cu"]


def test_a_broken_hunk_gives_the_exact_error(stock_root, tmp_path):
    fps = {fp.path: fp for fp in unidiff.parse_patch(exl3.FACC_PATCH)}
    hunk = fps["exllamav3_ext/quant/exl3_gemv_kernel.cuh"].hunks[2]
    assert (hunk.index, hunk.old_start) == (3, 402)
    expected = ("pp4/sources/patches/exl3-facc.patch: hunk 3 of exllamav3_ext/quant/exl3_gemv_kernel.cuh (at line 402) "
                "does not apply: the source changed; update the patch")
    changed = _copy_tree(stock_root, tmp_path / "changed" / exl3.EXT_DIR_NAME)
    f = changed / "quant/exl3_gemv_kernel.cuh"
    text = f.read_text()
    assert text.count("exl3_gemv_ns::mma_ab_h(a01, a23, f0, ch[t][0]);") == 1
    f.write_text(text.replace("exl3_gemv_ns::mma_ab_h(a01, a23, f0, ch[t][0]);",
                              "exl3_gemv_ns::mma_ab_h(a01, a23, f0, ch[t][0]);  // upstream moved on"))
    with pytest.raises(unidiff.PatchError) as e:
        exl3.facc_sources(changed, tmp_path / "work")
    assert str(e.value) == expected
    assert not (tmp_path / "work" / "facc" / exl3.STAMP_NAME).is_file()
    files = {f"{exl3.EXT_DIR_NAME}/{r}": (changed / r).read_bytes() for r in content_snapshot(changed)}
    with pytest.raises(unidiff.PatchError) as e:
        unidiff.apply_patch_to_files(exl3.FACC_PATCH, files)
    assert str(e.value) == expected


def test_patch_offsets_are_allowed_fuzz_is_not(tmp_path):
    text = "".join(f"line {i}\n" for i in range(1, 21))
    patch = tmp_path / "p.patch"
    patch.write_text("--- a/f.txt\n+++ b/f.txt\n@@ -9,3 +9,3 @@\n line 9\n-line 10\n+LINE 10\n line 11\n")
    moved = "extra\nextra\n" + text  # the hunk now sits two lines lower
    assert unidiff.apply_patch_to_files(patch, {"f.txt": moved.encode()}) == {
        "f.txt": moved.replace("line 10\n", "LINE 10\n").encode()}
    fuzzed = moved.replace("line 11\n", "line eleven\n")
    with pytest.raises(unidiff.PatchError, match=rf"^{patch}: hunk 1 of f.txt \(at line 9\) does not apply"):
        unidiff.apply_patch_to_files(patch, {"f.txt": fuzzed.encode()})
    patch.write_text("--- a/f.txt\n+++ b/f.txt\n@@ -9,3 +9,3 @@\n line 9\n-line 10\n")
    with pytest.raises(unidiff.PatchError, match="hunk 1 of f.txt ends early"):
        unidiff.parse_patch(patch)


# --------------------------------------------------------------------------- a user's checkout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_checkout_provenance(stock_root, tmp_path):
    repo = tmp_path / "exllamav3-checkout"
    _copy_tree(stock_root, repo / "exllamav3" / exl3.EXT_DIR_NAME)
    (repo / "exllamav3" / "version.py").write_text('__version__ = "1.6.5"\n')
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()

    root = exl3.checkout_sources(repo)
    assert root == repo / "exllamav3" / exl3.EXT_DIR_NAME
    assert exl3.checkout_sources(root) == root
    prov = exl3.source_provenance(root)
    assert prov["origin"] == "checkout" and prov["exllamav3"] == "1.6.5"
    assert prov["git_commit"] == head and prov["git_dirty"] is False
    assert prov["sources_sha256"] == exl3.sources_sha256(stock_root)
    ext = exl3.exl3_extension("stock", root)
    assert ext.root == root and ext.provenance["git_commit"] == head  # built in place, no copy

    (root / "add.cu").write_text((root / "add.cu").read_text() + "// local change\n")
    prov = exl3.source_provenance(root)
    assert prov["git_dirty"] is True and prov["sources_sha256"] != exl3.sources_sha256(stock_root)

    plain = _copy_tree(stock_root, tmp_path / "plain" / exl3.EXT_DIR_NAME)
    prov = exl3.source_provenance(plain)
    assert prov["git_commit"] is None and prov["origin"] == "checkout"
    with pytest.raises(exl3.Exl3Error, match="no exllamav3 extension sources there"):
        exl3.checkout_sources(tmp_path)


# --------------------------------------------------------------------------- pybind11 internals


def _plan(ext, toolchain, tmp_path):
    return plan.module_plan(ext, torch_build_flags(), toolchain, ARCH, tmp_path / "build", tmp_path)


def _internals_id(compiler: list[str], flags: tuple[str, ...], tmp_path: Path, suffix: str) -> str:
    """PYBIND11_INTERNALS_ID as the given compiler and flags expand it."""
    src = tmp_path / f"internals{suffix}"
    src.write_text("#include <pybind11/detail/internals.h>\nPP4_INTERNALS_ID PYBIND11_INTERNALS_ID\n")
    proc = subprocess.run([*compiler, *flags, "-E", str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The expansion comes from a system header, so it may span lines with line markers between them.
    tail = proc.stdout[proc.stdout.rindex("PP4_INTERNALS_ID"):]
    text = " ".join(ln for ln in tail.splitlines() if not ln.lstrip().startswith("#"))
    return "".join(re.findall(r'"([^"]*)"', text))


def test_facc_has_pybind_internals_of_its_own(stock_root, sources_dir, toolchain, tmp_path):
    """Both compilers, with each module's exact flags, expand the internals key; only facc's is its own."""
    ids = {}
    p2p = extensions.from_spec(extensions.BUILTIN_SPECS["p2p"])[0]
    for ext in (p2p, exl3.exl3_extension("stock", stock_root, nvcc=toolchain.nvcc),
                exl3.exl3_extension("facc", stock_root, work_dir=sources_dir, nvcc=toolchain.nvcc)):
        p = _plan(ext, toolchain, tmp_path)
        cxx = _internals_id(["c++"], p.cxx_flags, tmp_path, ".cpp")
        cuda = _internals_id([str(toolchain.nvcc)], p.cuda_flags, tmp_path, ".cu")  # the quoted define survives nvcc
        assert cxx == cuda, ext.target
        ids[ext.target] = cxx
    assert ids["exl3"] == ids["p2p"]  # pybind11's default key, as in upstream's own build
    assert ids["exl3-facc"] != ids["exl3"]
    assert ids["exl3-facc"] == ids["exl3"].replace("_system", "_system_pp4_exl3_facc")


# --------------------------------------------------------------------------- real compiles


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["stock", "facc"])
@pytest.mark.parametrize("unit", LIGHT_UNITS)
def test_light_units_compile_with_the_full_flags(unit, variant, stock_root, sources_dir, toolchain, tmp_path):
    ext = exl3.exl3_extension(variant, stock_root, work_dir=sources_dir, nvcc=toolchain.nvcc)
    p = _plan(ext, toolchain, tmp_path)
    step = next(s for s in p.steps if s.source == ext.root / unit)
    obj = tmp_path / "unit.o"
    if step.language == "cuda":
        cmd = [str(toolchain.nvcc), *p.cuda_flags]
        if unit == PATCHED_UNIT:  # keep the PTX nvcc makes on the way: it shows the accumulator type
            cmd += ["--keep", "--keep-dir", str(tmp_path)]
    else:
        cmd = ["c++", *p.cxx_flags]
    proc = subprocess.run([*cmd, "-c", str(step.source), "-o", str(obj)], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert obj.stat().st_size > 0
    if unit == PATCHED_UNIT:
        ptx = "".join(p.read_text() for p in tmp_path.glob("*.ptx"))
        assert (F16_ACC_MMA in ptx) == (variant == "stock")
        if variant == "facc":
            assert F32_ACC_MMA in ptx
