"""What goes into one module's wheel, from the build's own records.

A module `exllamav3_ext` built for target `exl3` becomes the distribution `exllamav3-ext`:

    exllamav3_ext/__init__.py              imports the module through the loader, as its own names
    exllamav3_ext/_pp4_loader.py           pp4/wheel/runtime.py, which checks the module and loads it
    exllamav3_ext/exllamav3_ext.cpython-311-x86_64-linux-gnu.so
    exllamav3_ext/pp4-certificate.json.gz  the certificate of this module's objects alone
    exllamav3_ext/pp4-build-record.json    its build record, plus the wheel's facts (torch pins)
    exllamav3_ext-1.6.5+pp4.<key>.dist-info/{METADATA,WHEEL,RECORD}

The certificate is the build's, reduced to what was built from what (certificate.shipped): no
creation time, no word of how an object was obtained, and objects named as the fixed root saw
them. So one build packed twice, two checkouts in other folders, and a cold build against one
restored from the store all give the same bytes.

The version is the sources' release where pp4 knows one (exllamav3's, for EXL3), else 0, with a
hash of what the wheel runs as its local part (version_key: the module's bytes, the torch pin, the
loader): one module packed twice always has one version, a module with other bytes another. The metadata pins torch's distribution version, and the loader checks the running
torch's version, CUDA version and git revision.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import sys
import sysconfig
from pathlib import Path

import attrs

from pp4.build import config as buildconfig
from pp4.build import modules
from pp4.certify import certificate
from pp4.files import canonical_json
from pp4.toolchain import torchenv
from pp4.wheel.archive import Entry, wheel_bytes
from pp4.wheel.runtime import CERTIFICATE, INIT, LOADER, RECORD

RUNTIME = Path(__file__).with_name("runtime.py")
RELEASE = re.compile(r"\d+(\.\d+)*")


class WheelError(Exception):
    pass


@attrs.frozen
class Wheel:
    target: str
    distribution: str  # as pip names it: exllamav3-ext
    version: str
    filename: str  # exllamav3_ext-1.6.5+pp4.0123456789ab-cp311-cp311-linux_x86_64.whl
    data: bytes


def tags() -> str:
    """This interpreter's wheel tag: modules are built for the Python that runs the build."""
    impl = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{impl}-{impl}{sys.abiflags}-{platform}"


def release(provenance: dict) -> str:
    """The sources' release as a PEP 440 public version, or 0 when none is known."""
    for key in ("exllamav3", "version"):
        value = provenance.get(key)
        if isinstance(value, str) and RELEASE.fullmatch(value):
            return value
    return "0"


def read_plan(builddir: Path, target: str) -> modules.PlanRecord:
    """The plan configure wrote for target."""
    try:
        return modules.load_plan(builddir, target)
    except buildconfig.BuildFolderError as e:
        raise WheelError(f"{target} is not configured in {builddir} ({e}): "
                         "run configure (python -m pp4.configure)") from None


def shipped_certificate(config_path: Path, actions_path: Path, builddir: Path, targets: set[str]) -> tuple[bytes, dict, dict]:
    """The certificate of targets' modules as a wheel ships it (its canonical bytes and document) and
    the build record that names it by its sha256."""
    doc = certificate.shipped(certificate.document(config_path, actions_path, builddir, targets))
    raw = certificate.canonical(doc)
    record = certificate.build_record(buildconfig.load(config_path), doc["modules"], builddir / CERTIFICATE,
                                      hashlib.sha256(raw).hexdigest())
    return raw, doc, record


def torch_requirement() -> str:
    """What a wheel's METADATA pins: the distribution version of the torch it was built against."""
    return f"torch=={torchenv.torch_version()}"


def version_key(module_sha256: str, torch_pin: str, loader: bytes) -> str:
    """The local version's 12 hex digits: a hash of what the wheel runs (the module's bytes, the
    torch it requires, the loader that checks it), never of when or how it was packed, nor of the
    certificate, a record of observations that two builds of one module may write differently (issue
    55: one module, packed twice 18 minutes apart, got two versions)."""
    what = canonical_json({"module_sha256": module_sha256, "requires": torch_pin, "init": INIT,
                           "loader_sha256": hashlib.sha256(loader).hexdigest()})
    return hashlib.sha256(what).hexdigest()[:12]


def build(config_path: Path, actions_path: Path, builddir: Path, target: str) -> Wheel:
    plan = read_plan(builddir, target)
    module = Path(plan.output_abs)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if not module.name.endswith(suffix):
        raise WheelError(f"{module.name} is not a module for this Python (suffix {suffix}): run configure "
                         "(python -m pp4.configure) and ninja with the Python the wheel is for")
    raw, doc, record = shipped_certificate(config_path, actions_path, builddir, {target})
    record["certificate"]["file"] = CERTIFICATE
    (entry,) = doc["modules"]
    package = plan.module
    distribution = package.replace("_", "-").lower()
    pin = torch_requirement()
    loader = RUNTIME.read_bytes()
    version = f"{release(plan.provenance or {})}+pp4.{version_key(entry['sha256'], pin, loader)}"
    record["wheel"] = {"target": target, "module": package, "file": module.name, "distribution": distribution,
                       "version": version, "torch": torchenv.torch_version_fields(), "torch_requirement": pin}
    so = module.read_bytes()
    if hashlib.sha256(so).hexdigest() != entry["sha256"]:
        raise WheelError(f"{module} changed while its wheel was made: run ninja again")
    stem = f"{distribution.replace('-', '_')}-{version}"
    dist_info = f"{stem}.dist-info"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    metadata = "\n".join([
        "Metadata-Version: 2.1", f"Name: {distribution}", f"Version: {version}",
        f"Summary: {package} (pp4 target {target}), built by pp4 and checked against its certificate at import",
        f"Requires-Python: =={py}.*", f"Requires-Dist: {pin}", "",
    ])
    tag = tags()
    wheel_file = "\n".join(["Wheel-Version: 1.0", "Generator: pp4", "Root-Is-Purelib: false", f"Tag: {tag}", ""])
    entries = [
        Entry(f"{package}/__init__.py", INIT.encode()),
        Entry(f"{package}/{LOADER}", loader),
        Entry(f"{package}/{module.name}", so, executable=True),
        Entry(f"{package}/{CERTIFICATE}", gzip.compress(raw, mtime=0)),
        Entry(f"{package}/{RECORD}", (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()),
        Entry(f"{dist_info}/METADATA", metadata.encode()),
        Entry(f"{dist_info}/WHEEL", wheel_file.encode()),
        Entry(f"{dist_info}/top_level.txt", f"{package}\n".encode()),
    ]
    return Wheel(target=target, distribution=distribution, version=version, filename=f"{stem}-{tag}.whl",
                 data=wheel_bytes(entries, dist_info))

