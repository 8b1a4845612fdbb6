"""`build/pp4.json`, the build's configuration: the limits, the reuse settings and the compilers
configure chose. configure writes it through write(); everything else reads it through load(),
which refuses a file written by another format version with what to do, instead of reading keys
that mean something else now (or are missing) without a word.

    {"format": 2, "limits": {...}, "reuse": {"store", "state_dir", ...}, "compile": {...}}
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from pp4.files import write_if_changed

FORMAT = 2  # 1: no "format" key (every pp4 before the build folder had an owner)
CONFIG = "pp4.json"
ACTIONS = "actions.json"  # every compile and link command (configure.py writes it)


class BuildFolderError(Exception):
    """A build folder's document is missing, damaged or of another format."""


@attrs.frozen
class BuildConfig:
    limits: dict
    reuse: dict
    compile: dict
    path: Path = attrs.field(eq=False)

    @property
    def state_dir(self) -> str:
        return self.reuse["state_dir"]

    @property
    def store(self) -> str | None:
        return self.reuse.get("store")


def config_path(builddir: str | Path) -> Path:
    return Path(builddir) / CONFIG


def actions_path(builddir: str | Path) -> Path:
    return Path(builddir) / ACTIONS


def load(where: str | Path) -> BuildConfig:
    """The configuration of a build folder, or of the pp4.json file named."""
    path = Path(where)
    if path.is_dir():
        path = config_path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise BuildFolderError(f"{path} does not exist: run `python -m pp4.configure` in the folder build.ninja "
                               "is to be in") from None
    except (OSError, ValueError) as e:
        raise BuildFolderError(f"{path} cannot be read ({e}): run `python -m pp4.configure` again") from None
    found = doc.get("format", 1) if isinstance(doc, dict) else None
    if found != FORMAT:
        raise BuildFolderError(f"{path} was written by another version of pp4 (format {found}; this pp4 reads "
                               f"format {FORMAT}): run `python -m pp4.configure` again with the same options "
                               "(build/configure.json records them)")
    try:
        return BuildConfig(doc["limits"], doc["reuse"], doc["compile"], path)
    except KeyError as e:
        raise BuildFolderError(f"{path} has no {e.args[0]!r}: run `python -m pp4.configure` again") from None


def write(builddir: str | Path, limits: dict, reuse: dict, compile: dict) -> bool:
    """Write the configuration where its content changed; whether it did."""
    doc = {"format": FORMAT, "limits": limits, "reuse": reuse, "compile": compile}
    return write_if_changed(config_path(builddir), json.dumps(doc, indent=1, sort_keys=True) + "\n")


def of_folder(folder: str | Path = ".") -> BuildConfig | None:
    """The configuration of the build configured in folder (where its build.ninja is, naming its
    build folder), or None where there is none or it cannot be read."""
    try:
        with open(Path(folder) / "build.ninja") as f:
            for line in f:
                if line.startswith("builddir = "):
                    return load(Path(folder) / line[len("builddir = "):].strip().replace("$ ", " ").replace("$$", "$"))
    except (OSError, BuildFolderError):
        return None
    return None
