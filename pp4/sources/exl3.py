"""exllamav3's extension built by pp4: pinned upstream sources, upstream's own selection and flags.

Two variants of one source tree (docs/exl3.md):

    stock  module exllamav3_ext       target exl3       the sources as released
    facc   module exllamav3_ext_facc  target exl3-facc  pp4/sources/patches/exl3-facc.patch applied to a copy:
                                                        the fp16-accumulating MMA kernels accumulate in fp32

Sources come from the release that pp4/locks/exllamav3.toml pins (fetched with pip into pp4's
hash-checked wheel cache, and only the extension's folder unpacked), or from a user's checkout
(configure --exl3-source PATH), whose git commit and content hash go into the build record.

Layout of a sources folder made here (dest_dir):

    dest_dir/stock/exllamav3_ext/...        the pinned release's extension sources
    dest_dir/stock/.pp4-sources.json        stamp, written last: the unpack is complete
    dest_dir/facc/exllamav3_ext/...         the patched copy
    dest_dir/facc/.pp4-sources.json         its stamp

Every file is written only when its content differs, so a second run sets no new mtime and ninja
rebuilds nothing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import zipfile
from pathlib import Path

import attrs

from pp4 import paths
from pp4.files import locked, sha256_file, write_if_changed
from pp4.paths import SOURCE_SUFFIXES
from pp4.sources.extensions import PACKAGE_DIR, Extension
from pp4.sources.unidiff import apply_patch_to_files, shown
from pp4.toolchain.locks import WheelPin, checked_pins, read_lock
from pp4.toolchain.wheelcache import WheelError, ensure_wheels

LOCK_PATH = paths.LOCK_DIR / "exllamav3.toml"
PATCH_DIR = PACKAGE_DIR / "patches"
FACC_PATCH = PATCH_DIR / "exl3-facc.patch"
EXT_DIR_NAME = "exllamav3_ext"  # the extension's folder, upstream and in every tree made here
STAMP_NAME = ".pp4-sources.json"

# Upstream's flags for a CUDA build on Linux (exllamav3/util/cuda_flags.py cuda_cflags(), and
# exllamav3/ext.py): nvcc gets these, then --compress-mode=size where nvcc has it; C++ gets -Ofast.
# No -D defines and no extra ld flags; the extension's own folder is the one include directory.
CUDA_FLAGS = ("-O3", "--use_fast_math", "-Xcudafe", "--diag_suppress=177", "-Xcudafe", "--diag_suppress=20012")
COMPRESS_FLAG = "--compress-mode=size"
CXX_FLAGS = ("-Ofast",)
LD_FLAGS: tuple[str, ...] = ()
INCLUDE_DIRS = (".",)

# pybind11 keys the registry of C++ types (its "internals") by PYBIND11_INTERNALS_ID, which ends in
# PYBIND11_PLATFORM_ABI_ID = PYBIND11_COMPILER_TYPE PYBIND11_STDLIB PYBIND11_BUILD_ABI PYBIND11_BUILD_TYPE
# (pybind11/conduit/pybind11_platform_abi_id.h in torch's headers). PYBIND11_STDLIB is "" unless
# defined and only appends, so defining it gives a module internals of its own and keeps the real
# compiler and ABI checks. The facc variant defines it: its types (the same C++ types as stock's)
# then register in a registry of their own, and both modules import into one process.
PYBIND11_INTERNALS_MACRO = "PYBIND11_STDLIB"


class Exl3Error(Exception):
    """exllamav3's sources cannot be had, or a patch does not apply."""


@attrs.frozen
class Variant:
    name: str
    module: str
    target: str
    patch: Path | None  # applied to a copy of the sources
    internals_tag: str | None  # value of PYBIND11_INTERNALS_MACRO, None: pybind11's default internals

    @property
    def defines(self) -> tuple[str, ...]:
        if self.internals_tag is None:
            return ()
        return (f'-D{PYBIND11_INTERNALS_MACRO}="{self.internals_tag}"',)


VARIANTS = {
    "stock": Variant("stock", module="exllamav3_ext", target="exl3", patch=None, internals_tag=None),
    "facc": Variant("facc", module="exllamav3_ext_facc", target="exl3-facc", patch=FACC_PATCH,
                    internals_tag="_pp4_exl3_facc"),
}


# ------------------------------------------------------------------------------------------------
# the pin


@attrs.frozen
class SourceLock:
    """pp4/locks/exllamav3.toml: one pinned artifact. `wheels` is what pp4.wheelcache.ensure_wheels takes."""

    project: str
    version: str
    source_dir: str  # folder inside the artifact, e.g. "exllamav3/exllamav3_ext"
    wheels: tuple[WheelPin, ...]
    path: Path
    sha256: str  # of the lock file's bytes

    @property
    def wheel(self) -> WheelPin:
        return self.wheels[0]


def load_lock(path: Path = LOCK_PATH) -> SourceLock:
    what, example = "source lock", "pp4/locks/exllamav3.toml"
    doc, sha256 = read_lock(path, what, Exl3Error)
    wheels = checked_pins(doc, path, what, example, Exl3Error)
    try:
        lock = SourceLock(project=str(doc["project"]), version=str(doc["version"]),
                          source_dir=str(doc["source_dir"]).strip("/"), wheels=wheels, path=path, sha256=sha256)
    except (KeyError, TypeError) as e:
        raise Exl3Error(f"{what} {path} lacks the field {e}: see {example} for the format") from None
    if len(wheels) != 1:
        raise Exl3Error(f"{what} {path} must pin exactly one artifact, it pins {len(wheels)}")
    return lock


# ------------------------------------------------------------------------------------------------
# writing a tree: only what differs, the stamp last


def _tree_files(root: Path) -> dict[str, Path]:
    """relative posix path -> path, for every regular file (or link to one) below root."""
    found = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            p = Path(dirpath, name)
            found[p.relative_to(root).as_posix()] = p
    return found


def _file_state(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _stamp_holds(root: Path, stamp: Path, inputs: dict) -> bool:
    """The tree below root is exactly what a completed sync left, for these inputs (by stat)."""
    try:
        doc = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    if doc.get("inputs") != inputs:
        return False
    recorded = doc.get("files", {})
    present = _tree_files(root)
    if set(present) != set(recorded):
        return False
    try:
        return all(_file_state(present[rel]) == state for rel, state in recorded.items())
    except OSError:
        return False


def _sync_tree(root: Path, files: dict[str, bytes], stamp: Path, inputs: dict) -> int:
    """Make root hold exactly `files`; returns how many files were written or removed.

    Before anything is changed the stamp goes, and it comes back last, so an interrupted sync is
    never taken as complete. Files whose bytes are already right are not touched (same inode, same
    mtime); when nothing differs, nothing is written, the stamp included.
    """
    present = _tree_files(root) if root.is_dir() else {}
    extra = sorted(rel for rel in present if rel not in files)
    stale = [rel for rel in sorted(files) if rel not in present or not _holds(present[rel], files[rel])]
    if extra or stale:
        stamp.unlink(missing_ok=True)
        root.mkdir(parents=True, exist_ok=True)
        for rel in stale:
            write_if_changed(root / rel, files[rel])
        for rel in extra:
            present[rel].unlink()
        for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
            if not filenames and not os.listdir(dirpath) and Path(dirpath) != root:
                os.rmdir(dirpath)
    state = {rel: _file_state(root / rel) for rel in sorted(files)}
    write_if_changed(stamp, json.dumps({"inputs": inputs, "files": state}, indent=1, sort_keys=True) + "\n")
    return len(extra) + len(stale)


def _holds(path: Path, data: bytes) -> bool:
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False


# ------------------------------------------------------------------------------------------------
# sources: the pinned release, or a user's checkout


def _wheel_members(wheel: Path, source_dir: str) -> dict[str, bytes]:
    prefix = source_dir.rstrip("/") + "/"
    out: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir() or not info.filename.startswith(prefix):
                continue
            rel = info.filename[len(prefix):]
            if rel.startswith("/") or ".." in rel.split("/"):
                raise Exl3Error(f"{wheel}: unsafe member name {info.filename!r}")
            out[rel] = zf.read(info)
    if not out:
        raise Exl3Error(f"{wheel} holds nothing under {prefix}: not the artifact the lock describes")
    return out


def fetch_sources(cache_root: Path | None, dest_dir: Path, wheel_dir: Path | None = None,
                  lock: SourceLock | None = None) -> Path:
    """The pinned release's extension sources, unpacked below dest_dir; returns their folder.

    The wheel comes from pp4's wheel cache, where it is admitted only after its sha256 matches the
    lock (pip download --require-hashes, or wheel_dir / $PP4_WHEELHOUSE without an index); it is
    hashed again before it is unpacked. Returns dest_dir/stock/exllamav3_ext.
    """
    lock = lock or load_lock()
    cache_root = cache_root or paths.cache_dir()
    tree = dest_dir / "stock"
    root = tree / EXT_DIR_NAME
    stamp = tree / STAMP_NAME
    inputs = {"project": lock.project, "version": lock.version, "artifact": lock.wheel.filename,
              "sha256": lock.wheel.sha256, "source_dir": lock.source_dir}
    if _stamp_holds(root, stamp, inputs):
        return root
    with locked(tree):  # one writer per sources folder: two configures at once would interleave
        if _stamp_holds(root, stamp, inputs):
            return root
        try:
            wheel = ensure_wheels(lock, paths.wheel_cache_dir(cache_root), paths.tmp_dir(cache_root), wheel_dir)[lock.wheel.name]
        except WheelError as e:
            raise Exl3Error(f"exllamav3 {lock.version} sources: {e}") from None
        actual = sha256_file(wheel)
        if actual != lock.wheel.sha256:
            raise Exl3Error(
                f"{wheel} (the cached {lock.wheel.filename}) has sha256 {actual}, but {lock.path.name} pins "
                f"{lock.wheel.sha256}: the cache entry is corrupt. Delete it and run again."
            )
        _sync_tree(root, _wheel_members(wheel, lock.source_dir), stamp, inputs)
    return root


def checkout_sources(path: Path) -> Path:
    """The extension's folder in a user's exllamav3 checkout (--exl3-source PATH).

    PATH may be the repository (exllamav3/exllamav3_ext inside it), the package folder, or the
    extension's folder itself.
    """
    path = path.expanduser().absolute()
    for candidate in (path / "exllamav3" / EXT_DIR_NAME, path / EXT_DIR_NAME, path):
        if (candidate / "bindings.cpp").is_file():
            return candidate
    raise Exl3Error(
        f"--exl3-source {path}: no exllamav3 extension sources there (looked for exllamav3/{EXT_DIR_NAME}/bindings.cpp, "
        f"{EXT_DIR_NAME}/bindings.cpp and bindings.cpp). Pass the root of an exllamav3 checkout."
    )


def sources_sha256(root: Path) -> str:
    """Content hash of an extension's sources: every C/C++/CUDA file below root (pp4.certify.pin's suffixes).

    The sha256 of `sha256sum`-style lines ("<sha256>  <relative path>\\n") sorted by path, so that
    `cd ROOT && find . -type f ... | sed 's|^./||' | LC_ALL=C sort | xargs sha256sum | sha256sum` agrees.
    """
    lines = []
    for rel, p in sorted(_tree_files(root).items()):
        if p.suffix in SOURCE_SUFFIXES:
            lines.append(f"{sha256_file(p)}  {rel}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _git(path: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _checkout_version(ext_root: Path) -> str | None:
    version_py = ext_root.parent / "version.py"
    try:
        m = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", version_py.read_text())
    except OSError:
        return None
    return m.group(1) if m else None


def source_provenance(source_root: Path) -> dict:
    """What the stock sources are, for the build record: the pin of a fetched tree, else the git state."""
    source_root = source_root.absolute()
    prov: dict = {"exllamav3_sources": str(source_root), "sources_sha256": sources_sha256(source_root)}
    stamp = source_root.parent / STAMP_NAME
    try:
        inputs = json.loads(stamp.read_text())["inputs"]
    except (OSError, ValueError, KeyError):
        inputs = None
    if inputs and source_root.name == EXT_DIR_NAME and source_root.parent.name == "stock":
        prov.update(exllamav3=inputs["version"], origin="pinned", artifact=inputs["artifact"],
                    artifact_sha256=inputs["sha256"])
        return prov
    prov.update(exllamav3=_checkout_version(source_root), origin="checkout")
    top = _git(source_root, "rev-parse", "--show-toplevel")
    commit = _git(source_root, "rev-parse", "HEAD")
    if top is None or commit is None:
        prov.update(git_commit=None, git_dirty=None)
    else:
        status = _git(source_root, "status", "--porcelain")
        prov.update(git_root=top.strip(), git_commit=commit.strip(),
                    git_dirty=None if status is None else bool(status.strip()))
    return prov


# ------------------------------------------------------------------------------------------------
# translation units and flags (upstream: exllamav3/util/cuda_flags.py extension_sources, cuda_cflags)


def _is_hipify_output(filename: str) -> bool:
    return "_hip." in filename or filename.endswith(".hip") or filename.startswith("hip_")


def select_sources(root: Path) -> tuple[str, ...]:
    """The translation units of a CUDA build, as upstream picks them: every .c/.cpp/.cu below the
    extension's folder, less rocm/ and hipify's outputs, sorted. Paths relative to root."""
    found = []
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            rel = Path(dirpath, name).relative_to(root).as_posix()
            if not name.endswith((".c", ".cpp", ".cu")) or _is_hipify_output(name):
                continue
            if rel.startswith("rocm/"):
                continue
            found.append(rel)
    return tuple(sorted(found))


@functools.lru_cache(maxsize=None)
def nvcc_has_compress_mode(nvcc: str) -> bool:
    """Upstream's test: nvcc --help mentions --compress-mode (CUDA 12.8 and later)."""
    try:
        out = subprocess.run([nvcc, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "--compress-mode" in out


def cuda_flags(nvcc: Path | None = None) -> tuple[str, ...]:
    """nvcc flags of upstream's CUDA build. Without an nvcc to ask, compression is assumed (pp4's
    pinned CUDA 13.0 has it)."""
    compress = nvcc is None or nvcc_has_compress_mode(str(nvcc))
    return CUDA_FLAGS + ((COMPRESS_FLAG,) if compress else ())


# ------------------------------------------------------------------------------------------------
# the facc variant: a patched copy


def facc_sources(source_root: Path, work_dir: Path, patch: Path = FACC_PATCH) -> Path:
    """A copy of the stock sources with the patch applied: work_dir/facc/exllamav3_ext.

    The patch is applied in memory to the stock bytes and the result synced into the copy, so a
    re-run writes nothing, and a source edit or patch change is carried over on the next run.
    """
    files = {rel: p.read_bytes() for rel, p in _tree_files(source_root).items()}
    patched = apply_patch_to_files(patch, {f"{EXT_DIR_NAME}/{rel}": data for rel, data in files.items()})
    prefix = EXT_DIR_NAME + "/"
    if any(not rel.startswith(prefix) for rel in patched):
        bad = sorted(rel for rel in patched if not rel.startswith(prefix))
        raise Exl3Error(f"{shown(patch)}: touches {bad[0]}, outside {EXT_DIR_NAME}/")
    tree = work_dir / "facc"
    root = tree / EXT_DIR_NAME
    inputs = {"patch": shown(patch), "patch_sha256": sha256_file(patch),
              "source_sha256": sources_sha256(source_root)}
    with locked(tree):  # one writer per sources folder: two configures at once would interleave
        _sync_tree(root, {rel[len(prefix):]: data for rel, data in patched.items()}, tree / STAMP_NAME, inputs)
    return root


def exl3_extension(variant: str, source_root: Path, work_dir: Path | None = None, nvcc: Path | None = None,
                   provenance: dict | None = None) -> Extension:
    """The Extension record of one variant.

    source_root: the stock extension sources (fetch_sources() or checkout_sources()).
    work_dir: where the facc variant's patched copy goes (work_dir/facc/); needed for facc only.
    nvcc: asked whether it has --compress-mode, as upstream does; None assumes it has.
    provenance: of the stock sources; default source_provenance(source_root).
    """
    try:
        v = VARIANTS[variant]
    except KeyError:
        raise Exl3Error(f"unknown exllamav3 variant {variant!r}: one of {', '.join(VARIANTS)}") from None
    source_root = source_root.absolute()
    prov = dict(provenance if provenance is not None else source_provenance(source_root))
    prov["variant"] = v.name
    spec_files = [Path(__file__).resolve(), LOCK_PATH]
    root = source_root
    if v.patch is not None:
        if work_dir is None:
            raise Exl3Error(f"the {v.name} variant needs a work_dir for its patched copy of the sources")
        root = facc_sources(source_root, work_dir.absolute(), v.patch)
        prov.update(patch=shown(v.patch), patch_sha256=sha256_file(v.patch),
                    patched_sources_sha256=sources_sha256(root))
        spec_files.append(v.patch)
    if v.internals_tag is not None:
        prov["pybind11_internals"] = f"{PYBIND11_INTERNALS_MACRO}={v.internals_tag}"
    sources = select_sources(root)
    if not sources:
        raise Exl3Error(f"{root}: no translation units (.cpp/.cu) found")
    # A file added to or removed from the tree changes the source list: its folders' mtimes say so.
    spec_files += sorted({(root / s).parent for s in sources})
    return Extension(
        target=v.target,
        module=v.module,
        root=root,
        sources=sources,
        include_dirs=INCLUDE_DIRS,
        cxx_flags=CXX_FLAGS + v.defines,
        cuda_flags=cuda_flags(nvcc) + v.defines,
        ld_flags=LD_FLAGS,
        spec_files=tuple(spec_files),
        provenance=prov,
    )
