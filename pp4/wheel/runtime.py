"""The loader a pp4 wheel installs as <package>/_pp4_loader.py: it checks the module, then imports it.

It is copied into the wheel as it is, so it uses the standard library and torch alone: an
inference host installs the wheel without pp4. The package's __init__.py (INIT) calls load(), which

1. reads the build record the wheel carries and checks that the certificate beside it is the one
   the record names (the sha256 of its uncompressed JSON);
2. checks that the module's bytes have the sha256 that both the record and the certificate give;
3. checks that the running torch is the build's (version, CUDA version and git revision): a
   module compiled against one torch's headers may crash inside another's libraries;
4. only then loads the module, as the submodule ``<package>.<module>``; __init__.py makes its
   functions the package's own, so ``import <module>`` works as for the module built in place.

Importing initialises no CUDA context (torch does not at import, nor does a pp4-built module).
A failed check raises ImportError with one line that says what differs and what to do.
"""

import gzip
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys

RECORD = "pp4-build-record.json"
CERTIFICATE = "pp4-certificate.json.gz"
LOADER = "_pp4_loader.py"
INIT = """\
# Written by pp4 (pp4/wheel/runtime.py): check this module against the certificate beside it, then import it.
from ._pp4_loader import load as _load

_module, pp4_record = _load(__path__[0], __name__)
globals().update({_k: _v for _k, _v in vars(_module).items() if not _k.startswith("__")})
"""


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _refuse(package, problem):
    return ImportError(f"{package}: {problem}")


def check(folder, package):
    """The wheel's record after every check, for the package installed in folder."""
    try:
        with open(os.path.join(folder, RECORD)) as f:
            record = json.load(f)
        with open(os.path.join(folder, CERTIFICATE), "rb") as f:
            raw = gzip.decompress(f.read())
    except (OSError, ValueError, EOFError) as e:
        raise _refuse(package, f"its pp4 record or certificate is missing or damaged ({e}): reinstall the wheel") from None
    try:
        wheel = record["wheel"]
        if hashlib.sha256(raw).hexdigest() != record["certificate"]["sha256"]:
            raise _refuse(package, f"{CERTIFICATE} is not the certificate its build record names: reinstall the wheel")
        certified = {m["module"]: m["sha256"] for m in json.loads(raw)["modules"]}
        expected = certified.get(wheel["module"])
        named = {m["module"]: m["sha256"] for m in record["modules"]}.get(wheel["module"])
        built = wheel["torch"]
    except (KeyError, TypeError, ValueError) as e:
        raise _refuse(package, f"its pp4 record or certificate is damaged (no {e}): reinstall the wheel") from None
    if expected is None or expected != named:
        raise _refuse(package, f"its certificate and build record disagree on {wheel['module']}: reinstall the wheel")
    path = os.path.join(folder, wheel["file"])
    try:
        actual = _sha256(path)
    except OSError as e:
        raise _refuse(package, f"cannot read {path} ({e}): reinstall the wheel") from None
    if actual != expected:
        raise _refuse(package, f"{path} has sha256 {actual}, but its certificate says {expected}: the module was "
                               "changed after the wheel was built; reinstall the wheel and do not load this file")
    import torch  # the module needs torch's libraries loaded first

    running = {"version": torch.__version__, "cuda": torch.version.cuda,
               "git_version": getattr(torch.version, "git_version", None)}
    if running != built:
        raise _refuse(package, f"built for torch {built['version']} (CUDA {built['cuda']}, git {built['git_version']}), "
                               f"but this process runs torch {running['version']} (CUDA {running['cuda']}, git "
                               f"{running['git_version']}): install the torch it was built for "
                               f"({wheel['torch_requirement']}), or rebuild the wheel against this one")
    return record


def load(folder, package):
    record = check(folder, package)
    wheel = record["wheel"]
    name = f"{package}.{wheel['module']}"
    path = os.path.join(folder, wheel["file"])
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module, record
