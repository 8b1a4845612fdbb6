"""Where pp4 keeps what outlives a build: the configured cache directory and its parts."""

from __future__ import annotations

import os
from pathlib import Path

# pp4's own files, wherever it is: a checkout (pip install -e .) or an installed wheel, which holds
# the package and nothing beside it. Everything pp4 reads at run time lives under here.
PACKAGE_DIR = Path(__file__).resolve().parent
# The locks: compiler wheels per CUDA release, the exllamav3 release (package data, pyproject.toml).
LOCK_DIR = PACKAGE_DIR / "locks"

# What an extension tree's sources and headers are named: what a pin hashes and a cluster node is sent.
SOURCE_SUFFIXES = {".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hh", ".hpp", ".hxx", ".inl", ".inc"}


def cache_dir() -> Path:
    """$PP4_CACHE_DIR, else $XDG_CACHE_HOME/pp4, else ~/.cache/pp4."""
    explicit = os.environ.get("PP4_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "pp4").absolute()


def wheel_cache_dir(root: Path | None = None) -> Path:
    return (root or cache_dir()) / "wheels"


def toolchains_dir(root: Path | None = None) -> Path:
    return (root or cache_dir()) / "toolchains"


def tmp_dir(root: Path | None = None) -> Path:
    """Scratch space inside the cache, so that pip and probes write nothing outside it."""
    return (root or cache_dir()) / "tmp"


def file_hashes() -> Path:
    """The file hasher's cache (device, inode, size, stamps -> sha256: pp4/reuse/actionkey.py), one
    per user and machine: a new build folder or checkout reads torch's 1,400 headers and 1 GB of
    libraries again only where they changed."""
    return cache_dir() / "file-hashes.json"


def config_dir() -> Path:
    """$PP4_CONFIG_DIR, else $XDG_CONFIG_HOME/pp4, else ~/.config/pp4: what is the user's, not a
    cache's (the signing key, the trust list: pp4/store/signing.py)."""
    explicit = os.environ.get("PP4_CONFIG_DIR")
    if explicit:
        return Path(explicit).expanduser().absolute()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return (base / "pp4").absolute()


def source_tree(root: Path, sources) -> list[Path]:
    """An extension's own sources and headers: every C/C++/CUDA file below its root, plus its
    sources (what a pin's source key covers, and so what its edge depends on)."""
    found = {p for p in Path(root).rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()}
    found.update(Path(s) for s in sources)
    return sorted(found)
