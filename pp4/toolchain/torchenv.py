"""Facts about the installed torch that the toolchain and the compile plan depend on.

Reading torch's metadata is cheap; importing torch is not (seconds), so the light facts are read
from files and only the compile plan imports torch itself.
"""

from __future__ import annotations

import base64
import importlib.metadata
import importlib.util
import re
from pathlib import Path

import attrs


class TorchError(Exception):
    """torch is missing or unusable for building CUDA extensions."""


@attrs.frozen
class HeaderFile:
    """One header shipped by one of torch's nvidia-* dependency wheels."""

    dist: str  # "nvidia-cublas==13.1.0.3"
    relpath: str  # path below the wheel root's include/, e.g. "cublas_v2.h"
    source: Path  # where it is installed
    sha256: str | None  # from the wheel's RECORD, None when the RECORD gives none


def torch_package_dir() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise TorchError(
            "torch is not installed in this Python environment "
            f"(searched with {importlib.util.find_spec.__module__}); install a CUDA build of torch first, "
            "e.g. `pip install torch`."
        )
    return Path(list(spec.submodule_search_locations)[0])


def torch_version() -> str:
    return importlib.metadata.version("torch")


def _version_py_field(text: str, name: str) -> tuple[bool, str | None]:
    """(found, value) of one `name = '...'` (or None) line of torch/version.py."""
    m = re.search(rf"^{name}\s*(?::\s*[^=]+)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", text, re.M)
    return (False, None) if not m else (True, m.group(1) or m.group(2) or None)


def torch_version_fields() -> dict[str, str | None]:
    """torch.__version__, torch.version.cuda and torch.version.git_version, read from torch/version.py
    without importing torch (None where the file has none): what a running process reports about the
    torch it loaded."""
    text = (torch_package_dir() / "version.py").read_text()
    return {key: _version_py_field(text, name)[1]
            for key, name in (("version", "__version__"), ("cuda", "cuda"), ("git_version", "git_version"))}


def torch_cuda_version() -> str | None:
    """torch.version.cuda, read from torch/version.py without importing torch."""
    path = torch_package_dir() / "version.py"
    found, value = _version_py_field(path.read_text(), "cuda")
    if not found:
        raise TorchError(f"cannot find the CUDA version in {path}")
    return value


def _record_sha256(hash_field) -> str | None:
    if hash_field is None or hash_field.mode != "sha256":
        return None
    raw = base64.urlsafe_b64decode(hash_field.value + "=" * (-len(hash_field.value) % 4))
    return raw.hex()


def _requirement_name(req: str) -> str:
    return re.split(r"[ ;<>=!~\[(]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _cuda_dependencies(root: str) -> set[str]:
    """Installed nvidia-*/cuda-* distributions reachable from root's requirements.

    torch 2.14 reaches cublas and friends through the cuda-toolkit meta-package's extras, so the
    walk follows requirements transitively; markers are ignored and "installed" is the filter.
    """
    try:
        pending = list(importlib.metadata.requires(root) or [])
    except importlib.metadata.PackageNotFoundError:
        raise TorchError(f"{root} is not installed in this Python environment") from None
    seen: set[str] = set()
    while pending:
        name = _requirement_name(pending.pop())
        if name in seen or not name.startswith(("nvidia-", "cuda-")):
            continue
        try:
            pending.extend(importlib.metadata.requires(name) or [])
        except importlib.metadata.PackageNotFoundError:
            continue  # optional, or for another platform: not installed here
        seen.add(name)
    return seen


def library_headers(wheel_root: str, skip_dists: set[str]) -> list[HeaderFile]:
    """Headers torch's own headers include (cublas_v2.h, cusparse.h, ...), from torch's nvidia-* wheels.

    They are not part of the compiler wheels: torch installs them as its runtime dependencies under
    the same wheel root (nvidia/cu13/include). Dists in skip_dists (those the lock provides) are left out.
    """
    names = sorted(_cuda_dependencies("torch"))
    prefix = wheel_root.strip("/") + "/include/"
    found: dict[str, HeaderFile] = {}
    for name in names:
        if name in skip_dists:
            continue
        dist = importlib.metadata.distribution(name)
        label = None  # the dist's name and version: its metadata parsed once, not once a header
        for f in dist.files or []:
            posix = f.as_posix()
            if not posix.startswith(prefix) or posix.endswith("/"):
                continue
            rel = posix[len(prefix):]
            if rel in found:
                continue
            label = label or f"{dist.metadata['Name'].lower()}=={dist.version}"
            found[rel] = HeaderFile(dist=label, relpath=rel, source=Path(dist.locate_file(f)),
                                    sha256=_record_sha256(f.hash))
    return [found[k] for k in sorted(found)]
