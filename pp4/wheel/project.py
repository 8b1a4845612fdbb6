"""A --setup-py project's own wheel: the one `pip wheel --no-build-isolation .` makes, with pp4's modules.

setuptools decides everything but the modules, in two steps (two ninja edges):

- stage: the project's setup.py runs `bdist_wheel` in a child Python (the build's, in the project's
  folder, in the environment configure read it in) with its `build_ext` command replaced by one
  that compiles nothing and puts an empty file where setuptools asks for each module. So the
  wheel's name, version, tags, dependencies, packages, package data, scripts and entry points are
  the project's own, from the tool that makes them for pip. It needs no module, so ninja runs it
  while the modules compile: the setup.py's run (torch's import, setuptools) is not added to the
  build's wall time. setuptools' scratch folders (egg-info, build, bdist) are temporary: the
  project's folder is not written to. The staged wheel and where each module goes are kept in
  build/wheel-PROJECT.stage/.
- pack: pp4 packs the staged wheel's files again through archive.wheel_bytes (sorted, one
  timestamp, fixed modes), with each module's bytes at its place, checked against the bytes the
  certificate gives; pins torch in METADATA, and adds two files to the .dist-info folder: the
  certificate of the project's modules (certificate.shipped: what was built from what, no history,
  no builder's folders) and the build record. Nothing is added to the project's packages: its own
  code imports its modules.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import tempfile
import zipfile
from pathlib import Path

from pp4.files import write_whole
from pp4.sources import setuppy
from pp4.toolchain import torchenv
from pp4.wheel.archive import Entry, wheel_bytes
from pp4.wheel.contents import Wheel, WheelError, read_plan, shipped_certificate, torch_requirement
from pp4.wheel.runtime import CERTIFICATE, RECORD

# Runs in the child: argv = [setup.py, report.json, modules.json, scratch folder]. Free of pp4
# imports (the child's sys.path is the project's).
_STAGER = r'''
import json, os, runpy, sys, traceback

setup_py, out_path, modules_path, scratch = sys.argv[1:5]
with open(modules_path) as f:
    modules = json.load(f)  # the extension names (a.b._C) the build configured
result = {}

import setuptools
from setuptools.command.build_ext import build_ext


def _pp4_build_ext(project_build_ext):
    """The project's own build_ext (so that its module file names are the project's: torch's
    no_python_abi_suffix, say), marking where it would have put each module with an empty file
    (pp4's module takes its place when the wheel is packed)."""
    if getattr(project_build_ext, "pp4", False):
        return project_build_ext

    class pp4_build_ext(project_build_ext):
        pp4 = True

        def run(self):
            names = [ext.name for ext in self.extensions]
            result["extensions"] = names
            unknown = sorted(set(names) - set(modules))
            if unknown:
                raise SystemExit(f"pp4: setup.py declares {', '.join(unknown)} now, which the build did not "
                                 "configure: run configure (python -m pp4.configure) again")
            placed = result.setdefault("placed", {})
            for ext in self.extensions:
                dest = self.get_ext_fullpath(ext.name)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                open(dest, "wb").close()
                placed[ext.name] = os.path.relpath(dest, self.build_lib).replace(os.sep, "/")

    return pp4_build_ext


def _with_pp4_build_ext(real_setup):
    def setup(*args, **kwargs):
        cmdclass = dict(kwargs.get("cmdclass") or {})
        cmdclass["build_ext"] = _pp4_build_ext(cmdclass.get("build_ext") or build_ext)
        kwargs["cmdclass"] = cmdclass
        return real_setup(*args, **kwargs)
    return setup


setuptools.setup = _with_pp4_build_ext(setuptools.setup)
try:  # setuptools.setup calls it too: each wrapper calls the setup it replaced
    import distutils.core
    distutils.core.setup = _with_pp4_build_ext(distutils.core.setup)
except ImportError:
    pass
try:  # the extensions configure read were declared where torch sees CUDA
    import torch
    torch.cuda.is_available = lambda: True
except ImportError:
    pass

os.makedirs(scratch, exist_ok=True)
sys.argv = [setup_py, "egg_info", "--egg-base", scratch, "build", "--build-base", os.path.join(scratch, "build"),
            "bdist_wheel", "--bdist-dir", os.path.join(scratch, "bdist"), "--dist-dir", os.path.join(scratch, "dist")]
sys.path.insert(0, os.path.dirname(setup_py))
try:
    runpy.run_path(setup_py, run_name="__main__")
except SystemExit as e:
    if e.code not in (None, 0):
        result["error"] = str(e.code)
except BaseException as e:
    result["error"] = "".join(traceback.format_exception_only(type(e), e)).strip()
    result["traceback"] = traceback.format_exc()[-3000:]
dist = os.path.join(scratch, "dist")
result["wheels"] = sorted(os.path.join(dist, n) for n in os.listdir(dist)) if os.path.isdir(dist) else []
with open(out_path + ".tmp", "w") as f:
    json.dump(result, f)
os.replace(out_path + ".tmp", out_path)
'''


def with_torch_pin(metadata: bytes, requirement: str) -> bytes:
    """METADATA with `Requires-Dist: <requirement>` among its headers (before the description)."""
    text = metadata.decode()
    head, sep, body = text.partition("\n\n")
    line = f"Requires-Dist: {requirement}"
    if line not in head.splitlines():
        head = head.rstrip("\n") + "\n" + line
    return (head + (sep or "\n") + body).encode()


STAGED_WHEEL = "staged.whl"
STAGED_RECORD = "staged.json"


def stage(builddir: Path, setup_py: Path, targets: list[str], stage_dir: Path) -> None:
    """Run setup.py's bdist_wheel without modules; keep its wheel and each module's place in stage_dir."""
    plans = [read_plan(builddir, target) for target in targets]
    provenance = plans[0].provenance
    with tempfile.TemporaryDirectory(prefix="pp4-project-wheel-") as tmp:
        scratch = Path(tmp)
        modules_file = scratch / "modules.json"
        modules_file.write_text(json.dumps(targets))  # a setup.py extension's target is its name
        report = setuppy.run_child(_STAGER, setup_py, [str(modules_file), str(scratch / "setuptools")],
                                   Path(plans[0].toolchain_prefix), provenance.get("archs") or [])
        if "error" in report or len(report["wheels"]) != 1:
            problem = report.get("error") or f"it made {len(report['wheels'])} wheels"
            if "bdist_wheel" in problem and "invalid command" in problem:
                problem += (" (this Python's setuptools has no bdist_wheel: `pip install 'setuptools>=70.1'` or "
                            "`pip install wheel` into it, as `pip wheel` would need too)")
            raise WheelError(f"{setup_py} bdist_wheel with pp4's modules failed: {problem}\n"
                             f"{report.get('traceback') or report['stderr'][-3000:]}".rstrip())
        missing = sorted(set(targets) - set(report.get("extensions") or []))
        if missing:
            raise WheelError(f"{setup_py} no longer declares {', '.join(missing)} (configured from it): "
                             "run configure (python -m pp4.configure) again")
        made = Path(report["wheels"][0])
        write_whole(stage_dir / STAGED_WHEEL, made.read_bytes())
        write_whole(stage_dir / STAGED_RECORD, json.dumps(
            {"setup_py": str(setup_py), "targets": targets, "filename": made.name,
             "placed": report.get("placed") or {}}, indent=1, sort_keys=True) + "\n")


def _staged(stage_dir: Path, setup_py: Path, targets: list[str]) -> tuple[str, dict[str, str], dict]:
    """(the staged wheel's name, where each module goes in it, its files) as stage() left them."""
    try:
        record = json.loads((stage_dir / STAGED_RECORD).read_text())
        with zipfile.ZipFile(stage_dir / STAGED_WHEEL) as z:
            files = {i.filename: (z.read(i), bool((i.external_attr >> 16) & 0o111)) for i in z.infolist()
                     if not i.is_dir()}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise WheelError(f"{stage_dir}: no staged wheel of {setup_py} ({e}): run `ninja` with the wheel's target") from None
    if record.get("setup_py") != str(setup_py) or record.get("targets") != targets:
        raise WheelError(f"{stage_dir} holds the wheel of {record.get('setup_py')} ({record.get('targets')}), "
                         f"not of {setup_py} ({targets}): run `ninja` with the wheel's target")
    return record["filename"], record["placed"], files


def build(config_path: Path, actions_path: Path, builddir: Path, setup_py: Path, targets: list[str],
          stage_dir: Path) -> Wheel:
    plans = {target: read_plan(builddir, target) for target in targets}
    raw, doc, record = shipped_certificate(config_path, actions_path, builddir, set(targets))
    filename, where, files = _staged(stage_dir, setup_py, targets)
    dist_info = next(n.split("/")[0] for n in files if n.split("/")[0].endswith(".dist-info"))
    stem = dist_info[:-len(".dist-info")]
    distribution, version = stem.rsplit("-", 1)
    shas = {m["target"]: m["sha256"] for m in doc["modules"]}
    placed = []
    for target in targets:  # a setup.py extension's target is its import path
        path = where.get(target)
        if path not in files:
            raise WheelError(f"{filename} has no place for {target}'s module: run `ninja` with the wheel's target")
        data = Path(plans[target].output_abs).read_bytes()
        if hashlib.sha256(data).hexdigest() != shas[target]:
            raise WheelError(f"{target}'s module {plans[target].output_abs} is not the certificate's: run ninja again")
        files[path] = (data, True)
        placed.append({"target": target, "import": target, "file": path})
    pin = torch_requirement()
    record["certificate"]["file"] = f"{dist_info}/{CERTIFICATE}"
    record["wheel"] = {"project": str(setup_py.parent.name), "distribution": distribution, "version": version,
                       "modules": placed, "torch": torchenv.torch_version_fields(), "torch_requirement": pin}
    # Modules get the mode a linker gives them (0755, as in pip's wheel) whatever the copy's mode was.
    entries = [Entry(name, with_torch_pin(data, pin) if name == f"{dist_info}/METADATA" else data,
                     executable=executable)
               for name, (data, executable) in files.items() if name != f"{dist_info}/RECORD"]
    entries += [Entry(f"{dist_info}/{CERTIFICATE}", gzip.compress(raw, mtime=0)),
                Entry(f"{dist_info}/{RECORD}", (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())]
    return Wheel(target=" ".join(targets), distribution=distribution, version=version, filename=filename,
                 data=wheel_bytes(entries, dist_info))
