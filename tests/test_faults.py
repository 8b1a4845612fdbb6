"""Faults and bad input (issue 7), against the real store and real compiles of the small fixture.

Every fault test ends the same way: the build completes (or stops with a clear error), the audit
passes, `python -m pp4.store verify` is clean, and no object in the build differs from a fresh compile
of the same unit by a single byte (compiles in the fixed root are the same bytes every time,
docs/reuse.md): that is the "no wrong object" check. docs/faults.md lists
every case with its result.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from test_build import FIXTURE, ninja_bin, run

from pp4.certify import audit
from pp4.execution.root import Root
from pp4.reuse import actionkey, pathstates
from pp4.store import manifests
from pp4.store.local import Store
from pp4.toolchain import compilerenv

pytestmark = pytest.mark.slow

UNITS = ("ops.cpp.o", "scale.cu.o", "shift.cu.o")
ALL_REUSED = {u: "reused" for u in UNITS}
ALL_COMPILED = {u: "compiled" for u in UNITS}
PY = sys.executable


# --------------------------------------------------------------------------------------- helpers


def env_with(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def configure(work: Path, spec: Path, *extra: str, check=True):
    work.mkdir(parents=True, exist_ok=True)
    return run([PY, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", str(spec), *extra], work, env_with(), check)


def ninja(work: Path, *args: str, check=True):
    return run([ninja_bin(), *args], work, env_with(), check)


def certificate(work: Path, builddir: str = "build") -> dict:
    return json.loads(gzip.decompress((work / builddir / "certificate.json.gz").read_bytes()))


def statuses(work: Path, builddir: str = "build") -> dict[str, str]:
    return {Path(o["output"]).name: o["status"] for o in certificate(work, builddir)["objects"]}


def verify(store: Path, repair: bool = True):
    return run([PY, "-m", "pp4.store", "--store", str(store), "verify", *([] if repair else ["--no-repair"])],
               REPO, env_with(), check=False)


def assert_verify_clean(store: Path) -> None:
    v = verify(store)
    assert v.returncode == 0 and "no damage found" in v.stdout, v.stdout + v.stderr


def certify(work: Path) -> str:
    out = ninja(work, "certify").stdout
    assert "audit passed" in out, out
    return out


def objects_of(work: Path, builddir: str = "build") -> dict[str, Path]:
    return {p.name: p for p in (work / builddir / "pp4_fixture" / "obj" / "src").glob("*.o")}


def assert_no_wrong_object(work: Path, reference: dict[str, bytes], builddir: str = "build") -> None:
    """Each object equals a fresh compile of its unit byte for byte, and every observation the
    certificate records for it holds now."""
    objs = objects_of(work, builddir)
    assert set(objs) == set(UNITS)
    for name, path in objs.items():
        diff = audit.differing_bytes(reference[name], path.read_bytes())
        assert diff == [], f"WRONG OBJECT {path}: differs from a fresh compile at bytes {diff}"
    cert = certificate(work, builddir)
    states = pathstates.States(actionkey.FileHasher())
    for o in cert["objects"]:
        for p, state in object_observations(cert, o):
            assert states.now(p, state) == state, (p, state)


def object_observations(doc: dict, obj: dict) -> list[tuple[str, str]]:
    """Every observation a certificate records for one object, as (path on this machine, state)."""
    mapping = Root.from_mounts(obj["mounts"]) if obj.get("mounts") else None
    out = []
    for sid in obj.get("input_sets", []):
        for path, state in doc["input_sets"][sid]:
            real = mapping.real(path) if mapping is not None else path
            if real is not None:
                out.append((real, state))
    return out


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def processes_in(work: Path) -> list[tuple[int, list[str]]]:
    """(pid, argv) of every process whose working directory is work: ninja's folder, or the fixed
    root's /pp4/work of one of its compiles (seen from outside under the compile's scratch folder,
    <work>/build/tmp/pp4-runs/run-.../root/pp4/work)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cwd = os.readlink(d / "cwd")
            if cwd == str(work) or (cwd.startswith(f"{work}/") and cwd.endswith("/pp4/work")):
                argv = (d / "cmdline").read_bytes().split(b"\0")
                found.append((int(d.name), [a.decode(errors="replace") for a in argv if a]))
    return found


def can_mount_tmpfs() -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    probe = Path(f"/tmp/pp4-mount-probe-{os.getpid()}")
    probe.mkdir(exist_ok=True)
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)], capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", str(probe)], check=True)
        return ok
    finally:
        probe.rmdir()


needs_tmpfs = pytest.mark.skipif(
    not can_mount_tmpfs(),
    reason="needs root to mount a small tmpfs (a whole build inside `unshare -Urm` is not attempted here)")


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


# --------------------------------------------------------------------------------------- fixtures


class Seed:
    """One clean build with a fresh store: the reference objects and a populated store to copy."""

    def __init__(self, base: Path):
        self.base = base
        self.src = base / "src"
        shutil.copytree(FIXTURE, self.src)
        self.spec = self.src / "ext.toml"
        self.store = base / "seed-store"
        self.work = base / "seed-work"
        configure(self.work, self.spec, "--store", str(self.store))
        ninja(self.work)
        assert statuses(self.work) == ALL_COMPILED
        self.reference = {n: p.read_bytes() for n, p in objects_of(self.work).items()}
        self.keys = {Path(o["output"]).name: (o["action_key"], o["object_sha256"]) for o in certificate(self.work)["objects"]}
        self.n = 0

    def store_copy(self, dest: Path) -> Path:
        shutil.copytree(self.store, dest, symlinks=True)
        return dest

    def new_work(self) -> Path:
        self.n += 1
        return self.base / f"work{self.n}"


@pytest.fixture(scope="module")
def seed(tmp_path_factory, toolchain) -> Seed:
    return Seed(tmp_path_factory.mktemp("faults"))


# =============================================================================== 1. faults
# ------------------------------------------------------------------- SIGKILL of a compile


@pytest.mark.parametrize("victim", ["compiler", "wrapper-group"])
def test_sigkill_of_a_compile_mid_build(seed, tmp_path, victim):
    work, store = tmp_path / "work", tmp_path / "store"
    configure(work, seed.spec, "--store", str(store))
    proc = subprocess.Popen([ninja_bin()], cwd=work, env=env_with(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        if victim == "compiler":  # the compiler proper (cc1plus, cicc, ptxas) under nvcc or g++
            def kill_a_compiler():
                for pid, argv in processes_in(work):
                    if argv and Path(argv[0]).name in ("cc1plus", "cicc", "ptxas", "cudafe++"):
                        try:
                            os.kill(pid, signal.SIGKILL)
                            return pid
                        except ProcessLookupError:  # it ended between the listing and the kill
                            continue
                return None
            wait_for(kill_a_compiler, 120, "a compiler process to kill")
        else:  # the edge's wrapper (or its client) with its shell: ninja gives each job its own
            # group; a compile server's worker that runs the edge, and its compiler, end with the client
            def pick():
                return next((pid for pid, argv in processes_in(work)
                             if ("pp4.reuse" in argv or any(a.endswith("pp4/reuse/client.py") for a in argv))
                             and "--prepass" not in argv and "--" in argv
                             and any(Path(a).name in ("nvcc", "c++", "g++") for a in argv)), None)
            pid = wait_for(pick, 120, "a reuse wrapper running a compile")
            pgid = os.getpgid(pid)
            assert pgid != proc.pid, "the wrapper shares ninja's process group"
            os.killpg(pgid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0 and "ninja: build stopped: subcommand failed." in out, out
    again = ninja(work)
    assert "FAILED" not in again.stdout
    certify(work)
    assert_no_wrong_object(work, seed.reference)
    assert_verify_clean(store)


# ------------------------------------------------------------------- SIGKILL while storing

STORE_STEPS = ["object-tmp-written", "object-placed", "record-tmp-written", "record-placed"]


@pytest.mark.parametrize("step", STORE_STEPS)
def test_sigkill_of_the_wrapper_while_storing(seed, tmp_path, step):
    work, store = tmp_path / "work", tmp_path / "store"
    configure(work, seed.spec, "--store", str(store))
    action = next(a for a in json.loads((work / "build" / "actions.json").read_text())["actions"]
                  if a["output"].endswith("shift.cu.o"))
    marker = tmp_path / "paused"
    proc = subprocess.Popen([PY, "-m", "pp4.reuse", "build/pp4.json", *compilerenv.env_args(action["env"]),
                             "--", *action["argv"]], cwd=work,
                            env=env_with(PP4_STORE_TEST_PAUSE=step, PP4_STORE_TEST_PAUSE_MARKER=str(marker)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: marker.exists() or proc.poll() is not None, 120, f"the store to pause at {step}")
        assert marker.exists(), proc.communicate()[0]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # What the kill left: verify finds nothing damaged (each step is one atomic rename or link);
    # interrupted puts leave at most an unreferenced object or staging files, which gc removes.
    report = verify(store, repair=False)
    assert report.returncode == 0 and "no damage found" in report.stdout, report.stdout
    stored = Store(store)
    key = None
    if step == "record-placed":
        (key,) = [p.stem for p in (store / "actions").rglob("*.json")]
        assert stored.lookup(key) is not None  # complete, valid: and its object is the real compile's
    else:
        assert not list((store / "actions").rglob("*.json"))
    if step == "object-placed":
        assert "1 unreferenced objects" in report.stdout
    assert not list((store / "manifests").rglob("*.json")), "the manifest is written only after the put"
    ninja(work)
    certify(work)
    assert_no_wrong_object(work, seed.reference)
    assert_verify_clean(store)
    gc = run([PY, "-m", "pp4.store", "--store", str(store), "gc"], REPO, env_with())
    assert "gc " in gc.stdout
    assert_verify_clean(store)
    # A fresh build directory against the store that survived the kill reuses only sound entries.
    work2 = tmp_path / "work2"
    configure(work2, seed.spec, "--store", str(store))
    ninja(work2)
    assert statuses(work2) == ALL_REUSED
    certify(work2)
    assert_no_wrong_object(work2, seed.reference)


# ------------------------------------------------------------------- concurrent builds


@pytest.mark.parametrize("n", [2, 4])
def test_concurrent_builds_share_one_store(seed, tmp_path, n):
    store = tmp_path / "store"
    works = [tmp_path / f"work{i}" for i in range(n)]
    for w in works:
        configure(w, seed.spec, "--store", str(store))
    procs = [subprocess.Popen([ninja_bin()], cwd=w, env=env_with(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for w in works]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
    for w in works:
        certify(w)
        assert_no_wrong_object(w, seed.reference)
    assert_verify_clean(store)
    # The units that never name the module were shared through the store's per-action lock.
    reused = sum(s == "reused" for w in works for s in statuses(w).values())
    assert reused >= 1


# ------------------------------------------------------------------- full filesystem


@needs_tmpfs
def test_store_on_a_full_filesystem(seed, tmp_path):
    with tmpfs(tmp_path / "small", "112k") as mnt:
        store = mnt / "store"
        work = tmp_path / "work"
        configure(work, seed.spec, "--store", str(store))
        out = ninja(work).stdout
        # ops.cpp.o (330 KiB: 85 KB compressed, with a 32 KB set pack) cannot fit even alone, where the
        # two small units (about 40 KB each, in disk pages) can: compiled, not stored, and the user is
        # told why and what to do.
        assert "pp4.reuse: warning: disk full while writing " in out and " in the pp4 store at " in out, out
        assert ("Free space on that filesystem, shrink the store with `python -m pp4.store gc --max-bytes 5G`, "
                "or use another store: re-run configure with --store DIR (or, without --store, set PP4_STORE_DIR) "
                "on a filesystem with room. "
                "(the object was built; it is just not stored)") in out
        assert statuses(work) == ALL_COMPILED
        ops = next(o for o in certificate(work)["objects"] if o["output"].endswith("ops.cpp.o"))
        assert ops["action_key"] is None and "disk full" in ops["not_stored"]
        assert not list((store / "tmp").iterdir()), "no staging file left behind"
        assert_verify_clean(store)
        certify(work)
        assert_no_wrong_object(work, seed.reference)
        # Next build from the same full store: what fit is reused, the rest compiles again.
        work2 = tmp_path / "work2"
        configure(work2, seed.spec, "--store", str(store))
        ninja(work2)
        assert statuses(work2)["ops.cpp.o"] == "compiled"
        certify(work2)
        assert_no_wrong_object(work2, seed.reference)
        assert_verify_clean(store)


# ------------------------------------------------------------------- flipped bytes


def _flip(path: Path, offset: int | None = None) -> None:
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def _manifest_of(store: Path, action_key: str) -> Path:
    return next(p for p in (store / "manifests").rglob("*.json")
                if action_key in json.dumps(manifests.decode(p.read_bytes())))


@pytest.mark.parametrize("where", ["object", "record", "manifest-byte", "manifest-other-action"])
def test_flipped_bytes_are_never_used(seed, tmp_path, where):
    store = seed.store_copy(tmp_path / "store")
    scale_key, scale_sha = seed.keys["scale.cu.o"]
    shift_key, _ = seed.keys["shift.cu.o"]
    if where == "object":
        _flip(Store(store).object_path(scale_sha))
    elif where == "record":
        _flip(Store(store).record_path(scale_key))
    elif where == "manifest-byte":
        _flip(_manifest_of(store, scale_key))  # the file is a zstd frame: it no longer reads as one
    else:  # still a valid manifest, but the entry now names another unit's (intact) action
        m = _manifest_of(store, scale_key)
        doc = json.loads(json.dumps(manifests.decode(m.read_bytes())).replace(scale_key, shift_key))
        m.write_bytes(manifests.encode(doc))
    report = verify(store, repair=False)
    if where == "object":
        assert report.returncode == 1
        assert "DAMAGE object-hash-mismatch" in report.stdout and "DAMAGE record-object-corrupt" in report.stdout
    elif where == "record":
        assert report.returncode == 1 and "DAMAGE record-invalid" in report.stdout
    else:  # the manifest's checksum no longer matches: verify reports it, every lookup ignores it
        assert report.returncode == 1, report.stdout
        assert "DAMAGE manifest-invalid" in report.stdout and "[left in place]" in report.stdout
    work = tmp_path / "work"
    configure(work, seed.spec, "--store", str(store))
    ninja(work)
    assert statuses(work) == {"ops.cpp.o": "reused", "scale.cu.o": "compiled", "shift.cu.o": "reused"}
    certify(work)
    assert_no_wrong_object(work, seed.reference)
    verify(store)  # repairs whatever the build did not already remove
    assert_verify_clean(store)


# ------------------------------------------------------------------- truncated certificate


def test_truncated_certificate(seed, tmp_path):
    work = tmp_path / "work"
    configure(work, seed.spec, "--store", str(seed.store_copy(tmp_path / "store")))
    ninja(work)
    cert = work / "build" / "certificate.json.gz"
    data = cert.read_bytes()
    cert.write_bytes(data[: len(data) // 2])
    fix = "rebuild it with `ninja` (delete it first, so that ninja writes it again)"
    proc = run([PY, "-m", "pp4.certify.audit", "build/certificate.json.gz"], work, env_with(), check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("pp4.certify.audit: error: build/certificate.json.gz is damaged (")
    assert proc.stderr.rstrip().endswith(fix)
    proc = ninja(work, "certify", check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "pp4.certify.audit: error: build/certificate.json.gz is damaged (" in said
    assert fix in said
    cert.unlink()  # the fix, as the message says
    ninja(work)
    certify(work)
    assert_no_wrong_object(work, seed.reference)


# ------------------------------------------------------------------- read-only store


@needs_tmpfs
@pytest.mark.parametrize("content", ["empty", "populated"])
def test_read_only_store(seed, tmp_path, content):
    with tmpfs(tmp_path / "ro", "4m") as mnt:
        store = mnt / "store"
        if content == "populated":
            seed.store_copy(store)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        work = tmp_path / "work"
        configure(work, seed.spec, "--store", str(store))
        out = ninja(work).stdout
        if content == "empty":
            assert (f"pp4.reuse: warning: the pp4 store directory {store} is not writable (Read-only file system: "
                    f"{store}) while creating the store layout. Fix its permissions, or use another store: re-run "
                    "configure with --store DIR (or, without --store, set PP4_STORE_DIR) that you can write. (building without reuse: every object is compiled, none stored)") in out, out
            assert statuses(work) == ALL_COMPILED
            assert all("is not writable" in o["not_stored"] for o in certificate(work)["objects"])
        else:  # lookups need no write: everything is reused
            assert statuses(work) == ALL_REUSED
        certify(work)
        assert_no_wrong_object(work, seed.reference)
        v = verify(store, repair=False)
        assert (v.returncode == 0 and "no store at" in v.stdout) if content == "empty" else "no damage found" in v.stdout


# ------------------------------------------------------------------- damaged toolchain prefix


def test_toolchain_prefix_with_a_file_removed(seed, tmp_path, lock, wheelhouse):
    from pp4.toolchain import provision as tc

    cache = tmp_path / "cache"
    prefix = tc.provision(lock, cache, wheelhouse).toolchain.prefix
    os.chmod(prefix / "bin", 0o755)
    (prefix / "bin" / "ptxas").unlink()
    env = env_with(PP4_CACHE_DIR=str(cache))
    check = run([PY, "-m", "pp4.toolchain", "check"], REPO, env, check=False)
    assert check.returncode == 1
    assert f"{prefix}/bin/ptxas: missing" in check.stderr or "bin/ptxas: missing" in check.stderr, check.stderr
    assert f"{prefix}: 1 problem(s)" in check.stdout
    # configure provisions, which repairs exactly the missing file, then builds with it
    work = tmp_path / "work"
    out = run([PY, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", str(seed.spec), "--cache-dir", str(cache),
               "--wheel-dir", str(wheelhouse), "--store", str(seed.store_copy(tmp_path / "store"))], work.parent, env)
    assert f"configure: provisioned {prefix} (1 files written)" in out.stdout, out.stdout
    assert run([PY, "-m", "pp4.toolchain", "check", "--deep"], REPO, env).stdout.strip() == f"{prefix}: OK"


# =============================================================================== 2. bad input


def _configure_error(work: Path, *args: str, env=None) -> str:
    work.mkdir(parents=True, exist_ok=True)
    proc = run([PY, str(REPO / "configure.py"), *args], work, env or env_with(), check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert not (work / "build.ninja").exists()
    return proc.stderr.strip()


def test_unknown_arch(seed, tmp_path):
    err = _configure_error(tmp_path, "--arch", "4.2", "--ext-spec", str(seed.spec))
    assert err.startswith("configure.py: error: --arch 4.2: this nvcc cannot compile for sm_42; it supports ")
    assert "9.0" in err.split("it supports ")[1]


def _fake_torch(tmp_path: Path, cuda: str | None) -> dict:
    """A torch package whose version.py says torch.version.cuda = cuda, first on the path."""
    pkg = tmp_path / "faketorch" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text(f"__version__ = '2.13.0+fake'\ncuda = {cuda!r}\n")
    return env_with(PYTHONPATH=f"{pkg.parent}:{REPO}")


def test_cpu_only_torch(seed, tmp_path):
    err = _configure_error(tmp_path / "w", "--ext-spec", str(seed.spec), env=_fake_torch(tmp_path, None))
    assert err.startswith("configure.py: error: ") and "torch.version.cuda is None): it is a CPU-only build" in err, err


def test_torch_cuda_release_without_a_lock(seed, tmp_path):
    err = _configure_error(tmp_path / "w", "--ext-spec", str(seed.spec), env=_fake_torch(tmp_path, "12.6"))
    assert ("configure.py: error: torch was built for CUDA 12.6, and pp4 has no toolchain lock for it: "
            "supported releases are 13.0") in err, err
    assert "Install a torch built for one of those, add a lock file cuda-12.6.toml, " \
           "or pass --cuda-home with a CUDA 12.6 toolkit." in err


def _spec_with(folder: Path, sources: list[str], name: str = "pp4_fixture") -> Path:
    shutil.copytree(FIXTURE, folder)
    spec = folder / "ext.toml"
    spec.write_text(f'name = "{name}"\nsources = {json.dumps(sources)}\ninclude_dirs = ["include"]\n')
    return spec


def test_missing_source_file(tmp_path, toolchain):
    spec = _spec_with(tmp_path / "src", ["src/ops.cpp", "src/missing.cu"])
    err = _configure_error(tmp_path / "w", "--arch", "9.0", "--ext-spec", str(spec))
    assert err == f"configure.py: error: extension pp4_fixture ({spec}): source {tmp_path}/src/src/missing.cu does not exist"


def test_unreadable_source_file(tmp_path, toolchain):
    """As root every file is readable; a directory where the source file should be is what stays unreadable."""
    spec = _spec_with(tmp_path / "src", ["src/ops.cpp", "src/dir.cu"])
    (tmp_path / "src" / "src" / "dir.cu").mkdir()
    err = _configure_error(tmp_path / "w", "--arch", "9.0", "--ext-spec", str(spec))
    assert err == (f"configure.py: error: extension pp4_fixture ({spec}): source {tmp_path}/src/src/dir.cu is a directory, "
                   "not a file; list the source files themselves")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_source_file_without_read_permission(tmp_path, toolchain):
    spec = _spec_with(tmp_path / "src", ["src/ops.cpp", "src/scale.cu"])
    os.chmod(tmp_path / "src" / "src" / "scale.cu", 0)
    err = _configure_error(tmp_path / "w", "--arch", "9.0", "--ext-spec", str(spec))
    assert err == (f"configure.py: error: extension pp4_fixture ({spec}): source {tmp_path}/src/src/scale.cu is not readable "
                   "(check its permissions)")


def test_two_extensions_with_one_module_name(tmp_path, toolchain):
    a = _spec_with(tmp_path / "a", ["src/ops.cpp"])
    b = _spec_with(tmp_path / "b", ["src/ops.cpp"])
    err = _configure_error(tmp_path / "w", "--arch", "9.0", "--ext-spec", str(a), "--ext-spec", str(b))
    assert err == (f"configure.py: error: extensions pp4_fixture ({a}) and pp4_fixture ({b}) both build the module "
                   "'pp4_fixture': two modules of one name cannot be imported into one process. "
                   "Give one of them another name.")


def test_patch_that_does_not_apply(tmp_path):
    """The pinned patch against changed sources: test_exl3.py::test_a_broken_hunk_gives_the_exact_error.
    Here a patch whose context is not in the file at all."""
    from pp4.sources import unidiff

    patch = tmp_path / "bad.patch"
    patch.write_text("--- a/f.txt\n+++ b/f.txt\n@@ -1,3 +1,3 @@\n one\n-TWO\n+2\n three\n")
    with pytest.raises(unidiff.PatchError) as e:
        unidiff.apply_patch_to_files(patch, {"f.txt": b"one\ntwo\nthree\n"})
    assert str(e.value) == f"{patch}: hunk 1 of f.txt (at line 1) does not apply: the source changed; update the patch"


def _call(work: Path, builddir: str) -> list:
    code = ("import sys, json; sys.path.insert(0, %r); from pp4.certify.loader import load_target; "
            "m = load_target('pp4_fixture', %r); print(json.dumps([m.scale(6), m.shift(6), m.shift_constant]))") % (str(REPO), builddir)
    return json.loads(run([PY, "-c", code], work).stdout.strip().splitlines()[-1])


def test_source_path_with_spaces_builds_and_imports(tmp_path, toolchain):
    """Spaces in the source, build and store folders; a `$` in the build and store folders too."""
    src = tmp_path / "my dir with spaces"
    shutil.copytree(FIXTURE, src)
    work = tmp_path / "work $x y"
    configure(work, src / "ext.toml", "--store", str(tmp_path / "store $s"))
    ninja(work)
    assert statuses(work) == ALL_COMPILED
    certify(work)
    assert _call(work, "build") == [42, 9, 3]
    deps = ninja(work, "-t", "deps", "build/pp4_fixture/obj/src/scale.cu.o").stdout
    assert f"{src}/include/fixture/scale.cuh" in deps
    assert "ninja: no work to do." in ninja(work).stdout


def test_source_path_with_dollar_is_refused(tmp_path, toolchain):
    """nvcc hands file paths to its sub-tools through a shell, which expands `$dir` (tried: the
    compile fails with `cc1plus: fatal error: .../my  with spaces/src/shift.cu: No such file`)."""
    src = tmp_path / "my $dir with spaces"
    shutil.copytree(FIXTURE, src)
    err = _configure_error(tmp_path / "w", "--arch", "9.0", "--ext-spec", str(src / "ext.toml"))
    assert err == (f"configure.py: error: extension pp4_fixture: the path {src}/src/scale.cu contains a `$`, which "
                   "nvcc expands as a shell variable when it runs its sub-tools (the compile would fail on a file "
                   "that does not exist); move or rename the folder to a path without `$`")
    err = _configure_error(tmp_path / "w2", "--arch", "9.0", "--ext-spec", str(FIXTURE / "ext.toml"), "--builddir", "b$x")
    assert err == ("configure.py: error: --builddir b$x: a `$` in the build directory's name is expanded by nvcc "
                   "as a shell variable; choose a name without `$`")


def test_build_directory_with_non_ascii_characters(seed, tmp_path):
    work = tmp_path / "work"
    configure(work, seed.spec, "--builddir", "build-ünï", "--store", str(tmp_path / "store"))
    ninja(work)
    assert statuses(work, "build-ünï") == ALL_COMPILED
    certify(work)
    assert _call(work, "build-ünï") == [42, 9, 3]
    assert_no_wrong_object(work, seed.reference, "build-ünï")
