"""The safetensors files of a weights folder: which file holds each tensor, and a fingerprint."""
from __future__ import annotations

import hashlib
import os


def open_folder(directory: str) -> tuple[list[str], dict, str]:
    """(file names, tensor name -> open safe_open handle, sha256 hex of every file's name, header and
    size): the header and size identify a file without reading its gigabytes."""
    from safetensors import safe_open

    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    where, digest = {}, hashlib.sha256()
    for f in files:
        path = os.path.join(directory, f)
        handle = safe_open(path, framework="pt", device="cpu")
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            digest.update(f.encode() + fh.read(n) + str(os.path.getsize(path)).encode())
        for key in handle.keys():
            where[key] = handle
    return files, where, digest.hexdigest()
